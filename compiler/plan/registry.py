"""The planner registry: strategy name -> planner, every one `(graph, cost, objective, options) -> list[Plan]`.

`auto` is no planner of its own: the driver runs the planners of `schedule(PLANNERS)` (but the COMPARISONS;
for a generative build only the GENERATIVE ones) in order and keeps the best predicted plan (a branch and bound, see compiler/plan/choose.py plan_model). The schedule runs the
cheap planners first, in registry order, and the searching planners (SEARCHES) last, as one group:
they share their searches (`plan_jointly`), bounded by the best plan found before them.
"""

from __future__ import annotations

from dataclasses import replace

from ..cost import CostTable
from ..graph import LayerGraph
from .baselines import plan_equal_layers, plan_even, plan_neurosurgeon, plan_ring_memory, plan_single
from .pipeline import plan_pipeline
from .planner import InfeasibleError, Planner, PlanOptions
from .spatial import plan_hybrid, plan_jointly, plan_spatial
from .spatial_baselines import plan_bbgrap, plan_deepthings, plan_edgeflow

__all__ = ["PLANNERS", "SEARCHES", "STRATEGIES", "GENERATIVE", "COMPARISONS", "schedule", "run_group"]

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
    "ring-memory": plan_ring_memory,
    "equal-layers": plan_equal_layers,
}
# Baselines for comparison that `auto` does not run: their plans (contiguous stages, one device each) are in
# the exact pipeline DP's search space, so they never beat the pipeline planner's plan
COMPARISONS = ("ring-memory", "equal-layers")
# The planners of pipeline stages, which alone keep a generative build's caches with their layers (the spatial
# planners split a layer's rows over devices, its cache with them): `auto` runs only these for --generate
GENERATIVE = ("pipeline", "single", "even", "neurosurgeon", "ring-memory", "equal-layers")
SEARCHES = ("spatial", "hybrid")  # searching planners: they run last, together, bounded by the others
# `auto` runs every planner but the COMPARISONS and keeps the best predicted plan; ties go to the earlier name.
STRATEGIES = ("auto", *PLANNERS)


def schedule(names) -> list[tuple[str, ...]]:
    """The order to run `names` in: one group per planner, the searching planners last as one group."""
    searching = tuple(n for n in SEARCHES if n in names)
    return [(n,) for n in names if n not in SEARCHES] + ([searching] if searching else [])


def run_group(group: tuple[str, ...], graph: LayerGraph, cost: CostTable, objective: str,
              options: PlanOptions) -> dict:
    """{name: its plans, best first, or the InfeasibleError it ended with} for one group of `schedule`.
    ValueError (an option a planner cannot honour) propagates.

    With the energy objective, the pipeline planner minimises energy itself (pipeline_energy.py); the
    others plan for latency and the driver ranks every plan by its predicted energy. Their searches are
    bounded by the latency beyond which no plan can be chosen (EnergyGoal.latency_bound): the hard SLA,
    and the latency at which even the idle power of the least hungry device spends more than the best
    plan found so far (options.incumbent_score). An incumbent's latency bounds nothing here: a slower
    plan may spend less."""
    if objective == "energy":
        return _energy_group(group, graph, cost, options)
    if group and all(n in SEARCHES for n in group):
        return plan_jointly(graph, cost, objective, options, group)
    out: dict = {}
    for name in group:
        try:
            out[name] = PLANNERS[name](graph, cost, objective, options)
        except InfeasibleError as exc:
            out[name] = exc
    return out


def _least_idle_w(cost: CostTable) -> float:
    """The least idle power of any device in any of its power modes (0 when one is unknown)."""
    idle = [d.profile.mode_power(m)[0] for d in cost.cluster.devices for m in d.profile.mode_names]
    return 0.0 if any(w is None for w in idle) else min(idle, default=0.0)


def _energy_group(group: tuple[str, ...], graph: LayerGraph, cost: CostTable, options: PlanOptions) -> dict:
    goal = options.energy
    if goal is None:
        raise ValueError("the energy objective needs an SLA (--sla-ms)")
    out: dict = {}
    if "pipeline" in group:
        try:
            out["pipeline"] = PLANNERS["pipeline"](graph, cost, "energy", options)
        except InfeasibleError as exc:
            out["pipeline"] = exc
    rest = tuple(n for n in group if n != "pipeline")
    if rest:
        bound = replace(options, incumbent=goal.latency_bound(options.incumbent_score, _least_idle_w(cost)))
        for name, plans in run_group(rest, graph, cost, "latency", bound).items():
            out[name] = plans if isinstance(plans, InfeasibleError) else [replace(p, objective="energy") for p in plans]
    return out
