"""The planner registry: strategy name -> planner, pipeline and spatial families."""

from __future__ import annotations

from .baselines import plan_even, plan_neurosurgeon, plan_single
from .pipeline import plan_pipeline
from .spatial_baselines import SPATIAL_PLANNERS

__all__ = ["PLANNERS", "SPATIAL_PLANNERS", "STRATEGIES"]

PLANNERS = {
    "pipeline": plan_pipeline,
    "single": plan_single,
    "even": plan_even,
    "neurosurgeon": plan_neurosurgeon,
}
# `auto` runs every planner and keeps the best predicted plan; ties go to the earlier name.
STRATEGIES = ("auto", *PLANNERS, *SPATIAL_PLANNERS)
