"""Plain-data views of the chosen plan and the candidates: the manifest's informational `plan` section
(`plan_info`) and compile --pareto's `--json` keys (`pareto_info`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..graph import LayerGraph
from ..plan_types import Stage

if TYPE_CHECKING:  # for the annotations only: the views are read without loading the planners
    from .choose import Candidate

__all__ = ["plan_info", "pareto_info"]


def _stage_info(s: Stage, graph: LayerGraph) -> dict:
    info = {"device": s.device, "layers": [s.lo, s.hi], "first_layer": graph.layers[s.lo].name,
            "last_layer": graph.layers[s.hi - 1].name, "spatial": None}
    if s.spatial is not None:
        info["spatial"] = {
            "axis": "height" if s.spatial.axis == 2 else "width",
            "devices": list(s.spatial.devices),
            "segments": [{"layers": [g.lo, g.hi], "tiles": [_tile_info(t) for t in g.tiles]}
                         for g in s.spatial.segments],
        }
    return info


def _tile_info(t) -> dict:
    """A tile's rows, and for a grid tile (DeepThings N x M) its columns too."""
    return {"device": t.device, "rows": [t.start, t.stop]} | ({"cols": list(t.cols)} if t.cols is not None else {})


def plan_info(chosen: Candidate, candidates, graph: LayerGraph) -> dict:
    """The manifest's informational `plan` section: stages and the predicted numbers of every candidate."""
    return {
        "strategy": chosen.strategy,
        "objective": chosen.plan.objective,
        "stages": [_stage_info(s, graph) for s in chosen.plan.stages],
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
    points = [{"strategy": p.strategy, "stages": [_stage_info(s, graph) for s in p.plan.stages],
               "modes": dict(p.plan.modes),
               "predicted_latency_ms": round(p.latency_ms, 4),
               "predicted_throughput_ips": round(p.throughput_ips, 4),
               "predicted_energy_mj": None if p.energy_mj is None else round(p.energy_mj, 4)} for p in front]
    axes = ["latency_ms", "throughput_ips"] + (["energy_mj"] if with_energy else [])
    return {"pareto": points, "pareto_axes": axes, "pareto_energy_unknown": not with_energy}
