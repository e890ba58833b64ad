"""What every planner is: `(graph, cost, objective, options) -> list[Plan]`, ranked best first.

A planner returns at least one plan, each covering the graph and fitting the devices' memory, or raises
InfeasibleError with the one line the manifest and the user see (Dominated when a bound from another
planner's plan left it nothing to offer). ValueError means an option it cannot honour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..cost import CostTable
from ..graph import LayerGraph
from ..plan_types import Plan

__all__ = ["Planner", "PlanOptions", "InfeasibleError", "Dominated", "TOP_K"]

TOP_K = 3  # the pipeline planners keep this many plans; the runners-up are reported in the manifest


class InfeasibleError(Exception):
    """No placement fits the cluster's memory; the message says what is needed and what there is."""


class Dominated(InfeasibleError):
    """The search found no plan predicted faster than the incumbent (the best plan of another planner)."""


@dataclass(frozen=True)
class PlanOptions:
    """The planners' knobs: the ADaPS search threshold (spatial, hybrid, edgeflow); DeepThings' grid and
    fused depth; processes for the spatial and hybrid searches (None: as many as this machine has cores
    for, at most 2; the plans do not depend on it); how many plans the pipeline planners return; and the
    incumbent, the best predicted latency (ms) of a plan found so far, which bounds the searches."""

    search_threshold: float = 0.1
    deepthings_grid: tuple[int, int] | None = None
    deepthings_layers: int | None = None
    jobs: int | None = None
    top_k: int = TOP_K
    incumbent: float = float("inf")


Planner = Callable[[LayerGraph, CostTable, str, PlanOptions], "list[Plan]"]
