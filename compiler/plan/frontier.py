"""`--pareto`: the non-dominated plans among every plan the planners found.

A point is a plan with its prediction. Its axes are latency (less is better), throughput (more is better)
and energy per request (less is better), the last only when every point's energy is known: a plan on a
device without power figures has no energy to compare, and leaving it out of the frontier, or treating
its energy as 0 or infinite, would list or hide plans for a figure nobody has. Two plans with the same
stages (and the same power modes) are one point: the first found keeps its strategy name.

The latency-optimal and throughput-optimal points are never dominated (nothing beats them on their own
axis, and of several tied on it the frontier keeps at least one), so the frontier always holds them.

`energy_frontier` is the pipeline energy DP's own frontier (pipeline_energy.py): every pipeline
placement, with the power modes its devices run in, that no other beats in both latency and energy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cost import CostTable, Prediction
from ..graph import LayerGraph
from ..plan_types import Plan, Stage
from .pipeline import _Tables, pipeline_problem
from .pipeline_energy import ModedPlan, _columns, _column_problem, _EnergyDP, _pareto, device_columns
from .planner import EnergyGoal

__all__ = ["Point", "plan_key", "pareto_front", "energy_frontier"]


@dataclass(frozen=True)
class Point:
    strategy: str
    plan: Plan
    prediction: Prediction

    @property
    def latency_ms(self) -> float:
        return self.prediction.latency_ms

    @property
    def throughput_ips(self) -> float:
        return self.prediction.throughput_ips

    @property
    def energy_mj(self) -> float | None:
        return self.prediction.energy_mj


def plan_key(plan: Plan) -> tuple:
    """What makes two plans the same plan: their stages and the power modes they run devices in."""
    return plan.stages, tuple(sorted(getattr(plan, "modes", ())))


def _axes(p: Point, with_energy: bool) -> tuple[float, ...]:
    """The point's figures, each to minimise."""
    return (p.latency_ms, -p.throughput_ips) + ((p.energy_mj,) if with_energy else ())


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and a != b


def pareto_front(points) -> tuple[list[Point], bool]:
    """(the non-dominated points of `points`, deduplicated, sorted by latency then throughput (highest
    first); whether energy is one of the axes: True when every point's energy is known)."""
    unique: dict[tuple, Point] = {}
    for p in points:
        unique.setdefault(plan_key(p.plan), p)
    pts = list(unique.values())
    with_energy = bool(pts) and all(p.energy_mj is not None for p in pts)
    axes = [_axes(p, with_energy) for p in pts]
    front = [p for p, a in zip(pts, axes) if not any(_dominates(b, a) for b in axes)]
    return sorted(front, key=lambda p: _axes(p, with_energy)), with_energy


def energy_frontier(graph: LayerGraph, cost: CostTable, goal: EnergyGoal) -> list[Plan]:
    """The pipeline placements (each device in one of its power modes) of the energy DP's frontier:
    none beaten in both latency and energy by another, and, under a hard SLA, each within it. Empty
    when no placement fits or meets the SLA; InfeasibleError when a device has no power figures."""
    base = pipeline_problem(graph, cost)
    columns = _columns(cost)
    cols = device_columns(cost, columns)
    problem = replace(_column_problem(base, cost, graph, columns), request_in_ms=None, request_out_ms=None)
    dp = _FrontierDP(problem, _Tables(problem), cols, goal)
    dp.run()
    labels = dp.final_labels()
    if not labels:
        return []
    lat = np.array([x[0] for x in labels])
    energy = np.array([x[1] for x in labels])
    blocks = graph.pipeline_blocks
    plans = []
    for i in _pareto(lat, energy):
        choices = dp._stages(labels[i][2], labels[i][3])
        stages = tuple(Stage(cost.devices[columns[s.device].device], blocks[s.lo][0], blocks[s.hi - 1][1])
                       for s in choices)
        modes = tuple((cost.devices[columns[s.device].device], columns[s.device].mode) for s in choices
                      if columns[s.device].cost is not cost)
        plan = ModedPlan("pipeline", "energy", stages, modes) if modes else Plan("pipeline", "energy", stages)
        plans.append(plan.ensures(graph))
    return plans


class _FrontierDP(_EnergyDP):
    """The energy DP with only the hard SLA pruning its labels: the bound on the best plan so far would
    drop labels that lose on energy but win on latency, which the frontier wants. Each state's (L, E0)
    Pareto set is exact for the final (latency, energy) of that state (pipeline_energy.py docstring), so
    the final labels of all states hold the whole frontier."""

    def _hopeful(self, L: np.ndarray, E: np.ndarray, idle: float, h: int) -> np.ndarray:
        if self.goal.soft:
            return np.ones(L.shape, dtype=bool)
        return L + self.rest[h] + self.least_out <= self.goal.sla_ms

    def _finish(self) -> None:
        """Nothing to choose: final_labels() reads every state."""

    def final_labels(self) -> list[tuple[float, float, tuple, int]]:
        """(latency, energy, DP key, label index) of every complete placement kept (within a hard SLA)."""
        out = []
        for (mask, a), (L, E, _) in self.states[self.B].items():
            idle = self._idle(mask)
            lat = L + float(self.cols.request_out_ms[a])
            for i in range(lat.size):
                latency = float(lat[i])
                if self.goal.soft or latency <= self.goal.sla_ms:
                    out.append((latency, float(E[i] + idle * latency), (self.B, mask, a), i))
        return out
