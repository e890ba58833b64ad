"""Boundary shifts (`edgec compile --shifts`): DGPAS's adjacent scheduling, prepared at compile time.

When one pipeline stage's measured time drifts, DGPAS moves work between that stage and its neighbour
(paper 001, Sec. 4.2). edgec's runtime switches between complete builds, so the compiler emits, for the
chosen plan, every variant that moves ONE boundary between neighbouring stages by ONE layer: stage k
gives its last layer to stage k+1 (the boundary moves back, -1) or takes stage k+1's first layer (+1).

A boundary next to a spatial stage never moves: a spatial stage's segments and tiles cover exactly its
layers, so a layer more or less would need a new tiling, which is a search and not a shift. The stages
keep their devices and the plan its power modes; the moved boundary may fall inside a block, where
several tensors cross (evaluate and the emitter price and send each one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from ..cost import CostTable
from ..graph import LayerGraph
from ..plan_types import Plan
from .frontier import plan_key
from .spatial import fits

__all__ = ["Shift", "boundary_shifts"]


@dataclass(frozen=True)
class Shift:
    """A variant of a plan and what it changes, in one stable line (the manifest's `variant`)."""

    plan: Plan
    description: str


def boundary_shifts(plan: Plan, graph: LayerGraph, cost: CostTable, kept: Iterable[Plan] = ()) -> list[Shift]:
    """Every one-layer shift of one boundary of `plan` between two stages that are not spatial, boundary by
    boundary, the move back (-1) first. A variant is left out when it would empty a stage, does not fit a
    device's memory on `cost`'s cluster (the check the planners make), or equals `plan` or a plan of `kept`
    (same stages and power modes). Every variant is validated (Plan.ensures): a valid plan with one boundary
    moved and no stage emptied always validates, so a PlanError here is a bug and is raised, not skipped."""
    seen = {plan_key(p) for p in (plan, *kept)}
    out = []
    for k in range(len(plan.stages) - 1):
        if plan.stages[k].spatial is not None or plan.stages[k + 1].spatial is not None:
            continue
        for step in (-1, 1):
            variant = _shifted(plan, k, step)
            if variant is None or not fits(variant.ensures(graph), graph, cost) or plan_key(variant) in seen:
                continue
            out.append(Shift(variant, _describe(plan, graph, k, step)))
    return out


def _shifted(plan: Plan, k: int, step: int) -> Plan | None:
    """`plan` with the boundary between stages k and k+1 moved by `step` layers; None if a stage empties."""
    a, b = plan.stages[k], plan.stages[k + 1]
    cut = a.hi + step
    if not a.lo < cut < b.hi:
        return None
    stages = (*plan.stages[:k], replace(a, hi=cut), replace(b, lo=cut), *plan.stages[k + 2:])
    return replace(plan, stages=stages)  # replace keeps the power modes


def _describe(plan: Plan, graph: LayerGraph, k: int, step: int) -> str:
    """E.g. "shift stage 1|2 boundary +1 layer (layer 37 'conv_x' to pi-b)": stages numbered from 0 as in
    the manifest's plan.stages, the moved layer by its index and name, and the device that now runs it."""
    a, b = plan.stages[k], plan.stages[k + 1]
    layer, device = (a.hi - 1, b.device) if step < 0 else (b.lo, a.device)
    return f"shift stage {k}|{k + 1} boundary {step:+d} layer (layer {layer} {graph.layers[layer].name!r} to {device})"
