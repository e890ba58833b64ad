"""The planner registry: strategy name -> planner, every one `(graph, cost, objective, options) -> list[Plan]`.

`auto` is no planner of its own: the driver runs the planners of `schedule(PLANNERS)` in order and keeps
the best predicted plan (a branch and bound, see compiler.driver.plan_model). The schedule runs the
cheap planners first, in registry order, and the searching planners (SEARCHES) last, as one group:
they share their searches (`plan_jointly`), bounded by the best plan found before them.
"""

from __future__ import annotations

from ..cost import CostTable
from ..graph import LayerGraph
from .baselines import plan_even, plan_neurosurgeon, plan_single
from .pipeline import plan_pipeline
from .planner import InfeasibleError, Planner, PlanOptions
from .spatial import plan_hybrid, plan_jointly, plan_spatial
from .spatial_baselines import plan_bbgrap, plan_deepthings, plan_edgeflow

__all__ = ["PLANNERS", "SEARCHES", "STRATEGIES", "schedule", "run_group"]

PLANNERS: dict[str, Planner] = {
    "pipeline": plan_pipeline,
    "single": plan_single,
    "even": plan_even,
    "neurosurgeon": plan_neurosurgeon,
    "spatial": plan_spatial,
    "hybrid": plan_hybrid,
    "bbgrap": plan_bbgrap,
    "edgeflow": plan_edgeflow,
    "deepthings": plan_deepthings,
}
SEARCHES = ("spatial", "hybrid")  # searching planners: they run last, together, bounded by the others
# `auto` runs every planner and keeps the best predicted plan; ties go to the earlier name.
STRATEGIES = ("auto", *PLANNERS)


def schedule(names) -> list[tuple[str, ...]]:
    """The order to run `names` in: one group per planner, the searching planners last as one group."""
    searching = tuple(n for n in SEARCHES if n in names)
    return [(n,) for n in names if n not in SEARCHES] + ([searching] if searching else [])


def run_group(group: tuple[str, ...], graph: LayerGraph, cost: CostTable, objective: str,
              options: PlanOptions) -> dict:
    """{name: its plans, best first, or the InfeasibleError it ended with} for one group of `schedule`.
    ValueError (an option a planner cannot honour) propagates."""
    if group and all(n in SEARCHES for n in group):
        return plan_jointly(graph, cost, objective, options, group)
    out: dict = {}
    for name in group:
        try:
            out[name] = PLANNERS[name](graph, cost, objective, options)
        except InfeasibleError as exc:
            out[name] = exc
    return out
