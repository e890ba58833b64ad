"""`edgec profile` in the full install: the measuring is the runtime's (edgec.runtime.profile, which a device
runs alone); here what needs the planner's dependencies: output.py (`write_profile`: the profile validated
against its schema, written as YAML) and refine.py (`--refine`: measured fragment times of an `edgec run
--report` folded into a profile's per-node table through the cost model)."""

from .output import check_output_path, write_profile
from .refine import refine_profile

__all__ = ["write_profile", "check_output_path", "refine_profile"]
