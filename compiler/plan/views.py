"""What a build records about its plan, and the readable views of a plan's stages.

The manifest's `plan` section is the chosen Plan itself (`Plan.to_dict`, read back by `Plan.from_dict`);
beside it, `candidates` holds every planner's outcome and predicted figures, `runners_up` the chosen
planner's next-best plans (both as `edgec compile --json` gives them), and `layers` the layer names that
the plan's `lo`/`hi` index (`plan_sections`). `stage_view` is a stage as
`edgec compile --json`, `edgec inspect` and `--pareto` show it: layer spans and names, the spatial axis by
name, tiles by rows (and columns).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..graph import LayerGraph
from ..plan_types import Plan, Stage

if TYPE_CHECKING:  # for the annotations only: the views are read without loading the planners
    from .choose import Candidate

__all__ = ["plan_sections", "stage_view", "stages_view", "planning_info", "pareto_info"]


def plan_sections(chosen: Candidate, candidates, graph: LayerGraph) -> dict:
    """The manifest's sections about the plan (module docstring): {"plan", "candidates", "runners_up",
    "layers"}."""
    return {"plan": chosen.plan.to_dict(), **planning_info(chosen, candidates),
            "layers": [layer.name for layer in graph.layers]}


def stage_view(s: Stage, names: Sequence[str]) -> dict:
    """A stage as the reports show it; `names` are the layer names its lo and hi index."""
    info = {"device": s.device, "layers": [s.lo, s.hi], "first_layer": names[s.lo], "last_layer": names[s.hi - 1],
            "spatial": None}
    if s.spatial is not None:
        info["spatial"] = {
            "axis": "height" if s.spatial.axis == 2 else "width",
            "devices": list(s.spatial.devices),
            "segments": [{"layers": [g.lo, g.hi], "tiles": [_tile_view(t) for t in g.tiles]}
                         for g in s.spatial.segments],
        }
    return info


def stages_view(plan: Plan, names: Sequence[str]) -> list[dict]:
    return [stage_view(s, names) for s in plan.stages]


def _tile_view(t) -> dict:
    """A tile's rows, and for a grid tile (DeepThings N x M) its columns too."""
    return {"device": t.device, "rows": [t.start, t.stop]} | ({"cols": list(t.cols)} if t.cols is not None else {})


def planning_info(chosen: Candidate, candidates) -> dict:
    """{"candidates": every planner's outcome and predicted figures, "runners_up": the chosen planner's
    next-best plans}."""
    return {
        "candidates": [
            {"strategy": c.strategy, "feasible": c.plan is not None, "pruned": c.pruned, "error": c.error,
             "latency_ms": round(c.prediction.latency_ms, 4) if c.prediction else None,
             "throughput_ips": round(c.prediction.throughput_ips, 4) if c.prediction else None}
            for c in candidates
        ],
        "runners_up": [
            {"stages": [{"device": s.device, "layers": [s.lo, s.hi]} for s in p.stages],
             "latency_ms": round(pr.latency_ms, 4), "throughput_ips": round(pr.throughput_ips, 4)}
            for p, pr in chosen.runners_up
        ],
    }


def pareto_info(front, with_energy: bool, graph: LayerGraph) -> dict:
    """compile --pareto's `--json` keys: the frontier, sorted by latency, each plan's stages as in `stages`
    (and the power modes it runs devices in), and the axes it is taken over: energy only when every plan's
    energy is known, which `pareto_energy_unknown` says."""
    names = [layer.name for layer in graph.layers]
    points = [{"strategy": p.strategy, "stages": stages_view(p.plan, names),
               "modes": dict(p.plan.modes),
               "predicted_latency_ms": round(p.latency_ms, 4),
               "predicted_throughput_ips": round(p.throughput_ips, 4),
               "predicted_energy_mj": None if p.energy_mj is None else round(p.energy_mj, 4)} for p in front]
    axes = ["latency_ms", "throughput_ips"] + (["energy_mj"] if with_energy else [])
    return {"pareto": points, "pareto_axes": axes, "pareto_energy_unknown": not with_energy}
