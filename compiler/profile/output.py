"""Writing a profile: validated first, YAML with small mappings and number pairs inline, atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from edgec.compiler.cluster import validate_profile_dict
from edgec.runtime.errors import InputError
from edgec.runtime.files import default_mode
from edgec.runtime.profile.write import check_output_path as runtime_check_output_path
from edgec.compiler.errors import UserError

__all__ = ["write_profile", "check_output_path"]


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # a figure shared by the top level and `threads:` is written out twice, not as &id001
        return True


def _flow_small_dicts(dumper, data):
    flow = len(data) <= 2 and all(isinstance(v, (int, float, type(None))) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=flow)


def _flow_number_lists(dumper, data):
    flow = all(isinstance(v, (int, float)) for v in data)  # an efficiency point [out_elems, fraction]
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(dict, _flow_small_dicts)
_Dumper.add_representer(list, _flow_number_lists)


def check_output_path(path: str | Path) -> None:
    """UserError unless a profile can be written at `path` (the runtime's check, which the device's `edgec
    profile` makes too). Checked before measuring, and again when writing."""
    try:
        runtime_check_output_path(path)
    except InputError as exc:
        raise UserError(str(exc)) from None


def write_profile(profile: dict[str, Any], path: str | Path) -> None:
    """Write a profile dict as YAML, atomically (temp file in the same folder + os.replace).

    The dict is validated first (UserError on a problem), so what is written loads with load_profile."""
    p = Path(path)
    validate_profile_dict(profile, str(p))
    text = yaml.dump(profile, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16)
    check_output_path(p)
    folder = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise UserError(f"cannot write profile: {e.strerror or e}", path=str(p)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchmod(f.fileno(), default_mode())  # mkstemp's 0600 would make the profile private
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UserError(f"cannot write profile: {e.strerror or e}", path=str(p)) from None
