"""`--pareto`: the non-dominated plans among every plan the planners found.

A point is a plan with its prediction. Its axes are latency (less is better), throughput (more is better)
and energy per request (less is better), the last only when every point's energy is known: a plan on a
device without power figures has no energy to compare, and leaving it out of the frontier, or treating
its energy as 0 or infinite, would list or hide plans for a figure nobody has. Two plans with the same
stages (and the same power modes) are one point: the first found keeps its strategy name.

The latency-optimal and throughput-optimal points are never dominated (nothing beats them on their own
axis, and of several tied on it the frontier keeps at least one), so the frontier always holds them.

The pipeline energy DP's own frontier, which --pareto also collects, is pipeline_energy.py's
`energy_frontier`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost import Prediction
from ..plan_types import Plan

__all__ = ["Point", "plan_key", "pareto_front"]


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
    return plan.stages, tuple(sorted(plan.modes))


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
