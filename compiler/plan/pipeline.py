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
from ..graph import LayerGraph
from ..plan_types import Plan, Stage
from .pipeline_coarse import solve_chain
from .pipeline_dp import solve_on_tables
from .pipeline_energy import plan_pipeline_energy
from .pipeline_problem import first_device_problems, pipeline_problem, solution_sort_key, to_plan, validate_request
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


def _plan_generative(graph: LayerGraph, cost: CostTable, problem, objective: str, options: PlanOptions) -> list[Plan]:
    """The DP once per first device (the token returns to it: pipeline_problem.first_device_problems), its
    `options.top_k` best of each; of those, the `options.top_k` best as `evaluate` predicts them (what the
    driver ranks plans by: it prices what the DP leaves out, such as the coordinator's hand-offs of the model
    inputs every stage reads), so that no first device's best plan is cut by the DP's figures alone."""
    sols, error = [], None
    for sub in first_device_problems(problem, cost):
        try:
            sols += solve_chain(sub, objective, top_k=options.top_k, copies=False, report={})
        except InfeasibleError as exc:
            error = exc
    if not sols:  # the problem's "weights" hold the caches: say so
        raise InfeasibleError(f"{error} (a generative build: each stage's weights include its layers' caches at "
                              "--max-context)")
    sols.sort(key=lambda s: solution_sort_key(s, objective))
    plans = [to_plan(sol, "pipeline", objective, graph, problem) for sol in sols]
    preds = [evaluate(p, graph, cost) for p in plans]
    order = sorted(range(len(plans)), key=lambda i: (preds[i].latency_ms, preds[i].bottleneck_ms)[::1 if objective == "latency" else -1])
    return [plans[i] for i in order[:options.top_k]]


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
