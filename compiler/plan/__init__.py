"""Planners: each takes a PipelineProblem and an objective and returns solutions; none touches ONNX."""

from __future__ import annotations

from .baselines import plan_even, plan_neurosurgeon, plan_single
from .pipeline import plan_pipeline

__all__ = ["PLANNERS", "STRATEGIES"]

# `auto` runs every planner and keeps the best predicted plan; ties go to the earlier name.
PLANNERS = {
    "pipeline": plan_pipeline,
    "single": plan_single,
    "even": plan_even,
    "neurosurgeon": plan_neurosurgeon,
}
STRATEGIES = ("auto", *PLANNERS)
