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

__all__ = ["Planner", "PlanOptions", "InfeasibleError", "Dominated", "TOP_K", "EnergyGoal", "DEFAULT_LAMBDA",
           "SEARCH_NODES"]

TOP_K = 3  # the pipeline planners keep this many plans; the runners-up are reported in the manifest
# --sla-soft's price of a late millisecond, in mJ: about what a busy edge device (a Jetson at 10 W, a
# laptop at 15 W) burns in one, so one ms over the SLA weighs as much as running one such device for it.
DEFAULT_LAMBDA = 10.0


class InfeasibleError(Exception):
    """No placement fits the cluster's memory; the message says what is needed and what there is."""


class Dominated(InfeasibleError):
    """The search found no plan predicted faster than the incumbent (the best plan of another planner)."""


@dataclass(frozen=True)
class EnergyGoal:
    """`--objective energy`: the least energy per request whose predicted latency is at most `sla_ms`; with
    `soft`, the least energy + lam x max(0, latency - sla_ms) (lam in mJ per ms; Dora's QoE)."""

    sla_ms: float
    soft: bool = False
    lam: float = DEFAULT_LAMBDA

    def score(self, latency_ms: float, energy_mj: float | None) -> float:
        """The objective of a plan (inf: it misses a hard SLA or its energy is unknown)."""
        if energy_mj is None:
            return float("inf")
        if self.soft:
            return energy_mj + self.lam * max(0.0, latency_ms - self.sla_ms)
        return energy_mj if latency_ms <= self.sla_ms else float("inf")

    def latency_bound(self, score: float, min_idle_w: float) -> float:
        """A latency that no plan scoring below `score` reaches, when every device draws at least
        `min_idle_w` W: a plan of latency L uses a device over its whole span, so its energy is at least
        min_idle_w x L (busy power is at least idle), its score at least that plus the soft penalty. The
        hard SLA bounds it too. inf: no bound."""
        bound = float("inf") if self.soft else self.sla_ms
        if min_idle_w <= 0 or score == float("inf"):
            return bound
        if not self.soft or score <= min_idle_w * self.sla_ms:
            return min(bound, score / min_idle_w)
        return self.sla_ms + (score - min_idle_w * self.sla_ms) / (min_idle_w + self.lam)


# The partition-tree nodes the spatial and hybrid searches of one planner run may expand (spatial.py): their
# lanes share it equally, and a lane's searches run in order, each with what the earlier ones left. When it
# is spent the searches stop with the best plans found so far and report that they were truncated, with the
# bound of what they did not search. The zoo's benchmark clusters take at most ~150,000 (vgg19, four devices).
SEARCH_NODES = 1_000_000


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
    energy: EnergyGoal | None = None  # with objective "energy": the SLA it is planned under
    incumbent_score: float = float("inf")  # with it: the best EnergyGoal.score of a plan found so far
    search_nodes: int | None = SEARCH_NODES  # the spatial and hybrid searches' node budget (None: none)


Planner = Callable[[LayerGraph, CostTable, str, PlanOptions], "list[Plan]"]
