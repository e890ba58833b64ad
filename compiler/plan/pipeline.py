"""The pipeline planner: (graph, cost, objective, options) -> [Plan], the exact DP (pipeline_dp.py) on the
chain of blocks between the graph's pipeline cuts (pipeline_problem.py; coarsened and refined on chains of
more than pipeline_coarse.COARSE_ABOVE blocks), or for the energy objective the
energy planner (pipeline_energy.py); and `PipelineTail`, the same DP for the layers after a cut (what a
hybrid plan runs after its spatial prefix, spatial.py).

Peak memory: the exact DP's (pipeline_dp.py) or the coarse one's (pipeline_coarse.py); a generative build
solves D problems, one per first device, one at a time (O(D^2) for their per-request vectors), and keeps
the top-k plans of each, O(D k)."""

from __future__ import annotations

import math

import numpy as np

from ..cost import CostTable, evaluate
from ..cost.quota_burst import bursting_devices
from ..graph import LayerGraph
from ..plan_types import Plan, Stage
from .pipeline_coarse import solve_chain
from .pipeline_dp import solve_on_tables
from .pipeline_energy import plan_pipeline_energy
from .pipeline_problem import first_device_problems, pipeline_problem, to_plan, validate_request
from .pipeline_tables import StageTables
from .planner import InfeasibleError, PlanOptions
from .stats import detail

__all__ = ["plan_pipeline", "PipelineTail"]


def plan_pipeline(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner: the `options.top_k` best pipeline plans, best first (`solve_pipeline`); for the energy
    objective, the plan of least energy under `options.energy` (pipeline_energy.py)."""
    if objective == "energy":
        return plan_pipeline_energy(graph, cost, options)
    problem = pipeline_problem(graph, cost)
    if cost.generate is not None:
        return _plan_generative(graph, cost, problem, objective, options)
    report: dict = {}
    sols = solve_chain(problem, objective, top_k=options.top_k, copies=False, report=report)
    detail(**report)  # exact, and beyond the DP's state budget its optimality_gap (pipeline_dp.py: Size)
    return [to_plan(sol, "pipeline", objective, graph, problem) for sol in sols]


WIDEST = 256  # plans per first device the generative planner considers at most (`_plan_generative`)


def _plan_generative(graph: LayerGraph, cost: CostTable, problem, objective: str, options: PlanOptions) -> list[Plan]:
    """The DP once per first device (the token returns to it: pipeline_problem.first_device_problems), its k
    best of each, evaluated (what the driver ranks plans by, and what the emitter sends: it routes each rider
    as `evaluate` does, and prices what the DP leaves out, such as the coordinator's hand-offs); the
    `options.top_k` best as `evaluate` predicts them.

    The DP's price of a plan is a bound of `evaluate`'s, never above it (its best routing of the riders, and
    their arrival at a stage after the second assumed not late: pipeline_problem.py), so once the best plan
    evaluated is no worse than every first device's k-th DP price, no plan unseen beats it: k grows (x4, up to
    WIDEST) until then, and the plans are exact; else reported with the gap to that bound. (Not a bound: a
    plan where another tensor skips a stage, or whose first stage ends before a rider is computed, is priced
    with it forwarded, which evaluate may beat; nor for the latency on a device profiled under a CPU quota with a
    burst, which the DP prices at its share: reported not exact.)"""
    subs = first_device_problems(problem, cost)
    k, seen = options.top_k, {}
    while True:
        sols, bound, error = [], None, None
        for sub in subs:
            try:
                got = solve_chain(sub, objective, top_k=k, copies=False, report={})
            except InfeasibleError as exc:
                error = exc
                continue
            sols += got
            if len(got) == k:  # this first device's plans not returned price at least the k-th
                bound = got[-1].key(objective) if bound is None else min(bound, got[-1].key(objective))
        if not sols:  # the problem's "weights" hold the caches: say so
            raise InfeasibleError(f"{error} (a generative build: each stage's weights include its layers' caches at "
                                  "--max-context)")
        for sol in sols:
            plan = to_plan(sol, "pipeline", objective, graph, problem)
            if plan.stages not in seen:
                pred = evaluate(plan, graph, cost)
                seen[plan.stages] = (plan, (pred.latency_ms, pred.bottleneck_ms)[::1 if objective == "latency" else -1])
        best = min(key for _, key in seen.values())
        if bound is None or _no_worse(best, bound) or k >= WIDEST:
            break
        k = min(4 * k, WIDEST)
    if objective == "latency" and bursting_devices(cost):
        # evaluate times a lone step's compute on a quota'd device at full speed while its burst lasts
        # (cost/quota_burst.py), the DP at the share: its price is no bound of the latency there
        detail(exact=False, inexact="the DP prices quota'd devices' steps at their share, evaluate with their burst")
    else:
        detail(exact=bound is None or _no_worse(best, bound),
               **({} if bound is None else {"optimality_gap": max(0.0, best[0] / bound[0] - 1.0)}))
    ranked = sorted(seen.values(), key=lambda x: x[1])
    return [plan for plan, _ in ranked[:options.top_k]]


def _no_worse(a: tuple[float, float], b: tuple[float, float], rel: float = 1e-12) -> bool:
    """a <= b lexicographically, equal within `rel` (the DP and evaluate add the same terms in other orders)."""
    if a[0] < b[0] * (1 - rel):
        return True
    return a[0] <= b[0] * (1 + rel) and a[1] <= b[1] * (1 + rel)


class PipelineTail:
    """The layers after a cut as pipeline stages over all devices (the exact latency DP), entered from a
    given device: what a hybrid plan runs after its spatial prefix (spatial.py)."""

    def __init__(self, graph: LayerGraph, cost: CostTable):
        self.graph, self.cost, self.problem = graph, cost, pipeline_problem(graph, cost)
        self._sols: dict = {}
        self._tables: StageTables | None = None  # the whole chain's, sliced for every suffix
        fastest = self.problem.block_ms.min(axis=1)
        self._least = np.concatenate([np.cumsum(fastest[::-1])[::-1], [0.0]])  # [block]: its suffix, each block on its fastest device
        self._block = {lo: i for i, (lo, _) in enumerate(graph.pipeline_blocks)}

    def lower(self, cut: int) -> float:
        """A lower bound of `best(cut, g)` for any g, without solving: no transfers, fastest devices."""
        return 0.0 if cut >= len(self.graph.layers) else float(self._least[self._block[cut]])

    def _solutions(self, cut: int):
        if cut not in self._sols:
            bi = self._block[cut]
            sub = self.problem.suffix(bi)
            try:
                validate_request(sub, "latency")
                if self._tables is None:
                    self._tables = StageTables(self.problem)
                self._sols[cut] = (bi, solve_on_tables(sub, StageTables(sub, self._tables, bi), "latency", 3, None))
            except InfeasibleError:
                self._sols[cut] = (bi, [])
        return self._sols[cut]

    def best(self, cut: int, g: str) -> tuple[float, tuple[Stage, ...]]:
        """(least latency, stages) of the layers from `cut` on, their input sent from device g; (inf, ())
        when no placement fits."""
        n = len(self.graph.layers)
        if cut >= n:
            return 0.0, ()
        bi, sols = self._solutions(cut)
        sizes = [self.graph.tensors[t].nbytes for t in self.graph.live_across(cut)]
        best = (math.inf, ())
        for sol in sols:
            first = self.problem.devices[sol.stages[0].device]
            total = sum(self.cost.transfer_ms(nb, g, first) for nb in sizes) + sol.latency_ms
            blocks = self.graph.pipeline_blocks
            stages = tuple(Stage(self.problem.devices[s.device], blocks[bi + s.lo][0], blocks[bi + s.hi - 1][1]) for s in sol.stages)
            best = min(best, (total, stages), key=lambda x: x[0])
        return best
