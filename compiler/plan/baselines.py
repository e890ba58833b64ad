"""Pipeline baselines, planners like `plan_pipeline`: (graph, cost, objective, options) -> [Plan].

- `plan_single`: the whole model on the best single device that fits.
- `plan_even`: EdgeShard-like: devices 0..n-1 in list order, contiguous stages of near-equal compute.
- `plan_neurosurgeon`: the best split point between two devices (every ordered pair, every cut), or no
  split at all, priced on the first two devices of each class of interchangeable devices only.
- `plan_ring_memory`: exo's ring partition: devices in cluster order, contiguous stages whose memory (weights,
  and a generative build's caches) is in proportion to each device's free memory.
- `plan_equal_layers`: devices in cluster order, an equal number of layers per stage (distributed-llama's
  equal slices, as pipeline stages).

Each solves the pipeline planner's problem (pipeline.py) with its `solve_*` function, which has the
interface of `solve_pipeline`: (problem, objective, ...) -> [PipelineSolution], a list with exactly one
solution (scored by `PipelineProblem.evaluate`; `top_k` is accepted for interface compatibility and
ignored). They raise the same `InfeasibleError` as `solve_pipeline`.

Cost, B blocks, D devices in Q classes (pipeline_tables.py `device_classes`): `single`, `even`, `ring-memory`
and `equal-layers` price at most D stages, O(B D) time and memory beyond the problem's arrays; `neurosurgeon`
prices O(B Q^2) candidates on tables of O(B^2 Q + B Q^2) floats (at most 2Q devices), plus the O(D^2) link
matrices and class test every pipeline planner shares. Peak memory: O(B D + B^2 Q + B Q^2 + D^2), never
O(B D^2).
"""

from __future__ import annotations

import numpy as np

from ..cost import CostTable
from ..graph import LayerGraph
from ..plan_types import Plan
from ..units import MB
from .pipeline_dp import _restrict, infeasible_message
from .pipeline_problem import (PipelineProblem, PipelineSolution, StageChoice, pipeline_problem, solution_sort_key,
                               to_plan, validate_request)
from .pipeline_tables import StageTables, device_classes
from .planner import InfeasibleError, PlanOptions
from .stats import count as count_work

__all__ = ["plan_single", "plan_even", "plan_neurosurgeon", "plan_ring_memory", "plan_equal_layers", "solve_single",
           "solve_even", "solve_neurosurgeon", "solve_ring_memory", "even_boundaries", "nearest_boundaries"]


def _mb(x: float) -> str:
    return f"{x / MB:.1f} MB"


def _plans(name: str, solve, graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    problem = pipeline_problem(graph, cost)
    return [to_plan(sol, name, objective, graph, problem) for sol in solve(problem, objective, top_k=options.top_k)]


def plan_single(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner of `solve_single`."""
    return _plans("single", solve_single, graph, cost, objective, options)


def plan_even(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner of `solve_even`."""
    return _plans("even", solve_even, graph, cost, objective, options)


def plan_neurosurgeon(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner of `solve_neurosurgeon`."""
    return _plans("neurosurgeon", solve_neurosurgeon, graph, cost, objective, options)


def plan_ring_memory(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner of `solve_ring_memory`."""
    return _plans("ring-memory", solve_ring_memory, graph, cost, objective, options)


def plan_equal_layers(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """Devices in cluster order, stage k on device k, each stage as near k/n of the graph's layers as the
    pipeline cuts allow (`nearest_boundaries` over the blocks' layer counts)."""
    problem = pipeline_problem(graph, cost)
    validate_request(problem, objective)
    n = min(problem.n_blocks, problem.n_devices)
    sizes = np.array([hi - lo for lo, hi in graph.pipeline_blocks], dtype=np.float64)
    bounds = nearest_boundaries(sizes, [sizes.sum() * k / n for k in range(1, n)])
    sol = _fixed_stages("equal-layers", problem, bounds)
    return [to_plan(sol, "equal-layers", objective, graph, problem)]


def _solve(problem: PipelineProblem, stages: list[tuple[int, int, int]]) -> PipelineSolution:
    return problem.evaluate(tuple(StageChoice(lo, hi, d) for lo, hi, d in stages))


def _representatives(cls: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the first two devices of each class of `cls`, ascending; how many plans each stands for as a single
    stage; and as a pair [a, b], the rest standing for none): a split on the first device of class p then
    the first of q (the second of p when q = p) stands for the n_p x n_q (n_p x (n_p - 1)) equal-cost splits
    on p and q, and is the one of them with the smallest stages tuple."""
    reps, first = [], {}
    for d, c in enumerate(cls.tolist()):
        if c not in first or len(first[c]) < 2:
            first.setdefault(c, []).append(d)
            reps.append(d)
    pos = {d: i for i, d in enumerate(reps)}
    size = np.bincount(cls, minlength=cls.size)
    single = np.zeros(len(reps), dtype=np.int64)
    pair = np.zeros((len(reps), len(reps)), dtype=np.int64)
    for c, members in first.items():
        single[pos[members[0]]] = size[c]
        for q, other in first.items():
            if q != c:
                pair[pos[members[0]], pos[other[0]]] = size[c] * size[q]
            elif len(members) > 1:
                pair[pos[members[0]], pos[members[1]]] = size[c] * (size[c] - 1)
    return np.array(reps, dtype=np.int64), single, pair


def _best_candidate(tab: StageTables, objective: str, max_stages: int | None, weights=None):
    """(the best plan with one stage, or two stages on distinct devices, that fits memory, as stages (None:
    none fits); how many such plans there are: each counted by `weights` (`_representatives`' single and
    pair counts) or once).

    Keys are computed with evaluate's exact arithmetic: latency = (sum of computes) + (sum of transfers).
    Ties go to the smaller stages tuple: of equal keys a split ((0, c, a), (c, B, b)) before a single stage
    ((0, B, d)), as c < B; so the candidates are ranked by (key, c, a, b), a single stage's c being B.
    Held as arrays of O(B D^2) floats, never one Python object per candidate: the tables are per class
    (StageTables), spread here over the devices of `tab` (neurosurgeon's are at most two of each class).
    """
    B, D, cq = tab.B, tab.D, tab.cq
    single, pair = weights if weights is not None else (np.ones(D, dtype=np.int64), 1 - np.eye(D, dtype=np.int64))
    c1 = tab.C[0, B, cq]  # [D]
    fit = np.flatnonzero(np.isfinite(c1))
    keys = [(c1[fit] + 0, c1[fit], np.full(fit.size, B), fit, np.zeros(fit.size, dtype=np.int64))]
    n = int(single[fit].sum())
    if (max_stages or 2) >= 2 and B >= 2 and D >= 2:
        cuts = np.arange(1, B)
        head = tab.C[0, cuts]  # [B-1, class of a]
        tail = tab.C[cuts, B]  # [B-1, class of b]
        trans = tab.T[cuts - 1]  # [B-1, class of a, class of b]: T[c, q, q] is between two devices of q
        spread = (slice(None), cq[:, None], cq[None, :])  # per class, then over the devices [B-1, a, b]
        lat = ((head[:, :, None] + tail[:, None, :]) + trans)[spread]
        lat[:, np.arange(D), np.arange(D)] = np.inf  # a device has no link to itself
        bn = np.maximum(np.maximum(head[:, :, None], tail[:, None, :]), trans)[spread]
        ci, a, b = np.nonzero(np.isfinite(lat))
        n += int(pair[a, b].sum())
        keys.append((lat[ci, a, b], bn[ci, a, b], cuts[ci], a, b))
    first, second, c, a, b = (np.concatenate(x) for x in zip(*keys))
    if not first.size:
        return None, n
    if objective != "latency":
        first, second = second, first
    i = int(np.lexsort((b, a, c, second, first))[0])
    if c[i] == B:
        return ((0, B, int(a[i])),), n
    return ((0, int(c[i]), int(a[i])), (int(c[i]), B, int(b[i]))), n


def solve_single(
    problem: PipelineProblem, objective: str = "latency", top_k: int = 1, max_stages: int | None = None
) -> list[PipelineSolution]:
    """The best single device that holds the whole model (one stage)."""
    validate_request(problem, objective)
    B = problem.n_blocks
    fits = [d for d in range(problem.n_devices) if problem.fits((StageChoice(0, B, d),))]
    if not fits:
        need = problem.stage_memory(0, B)
        largest = int(np.argmax(problem.device_mem_bytes))
        raise InfeasibleError(
            f"no single device holds the model: it needs {_mb(need)} and the largest device"
            f" ({problem.devices[largest]}) offers {_mb(float(problem.device_mem_bytes[largest]))}"
        )
    sols = [_solve(problem, [(0, B, d)]) for d in fits]
    count_work("plans", len(sols))
    return [min(sols, key=lambda s: solution_sort_key(s, objective))]


def even_boundaries(problem: PipelineProblem, n_stages: int) -> list[int]:
    """Stage boundaries 0 = b_0 < b_1 < ... < b_n = B of near-equal compute share.

    A block's size is its mean time over the devices; b_k is the block boundary whose cumulative size
    is nearest to k/n of the total (ties go to the later boundary, i.e. the one where the cumulative
    size crosses k/n), restricted so that every stage keeps at least one block.
    """
    B = problem.n_blocks
    size = np.asarray(problem.block_ms, dtype=np.float64).mean(axis=1)
    prefix = np.concatenate([[0.0], np.cumsum(size)])
    total = prefix[-1]
    bounds = [0]
    for k in range(1, n_stages):
        lo, hi = bounds[-1] + 1, B - (n_stages - k)
        dist = np.abs(prefix[lo : hi + 1] - total * k / n_stages)
        bounds.append(lo + int(np.flatnonzero(dist == dist.min())[-1]))
    bounds.append(B)
    return bounds


def solve_even(
    problem: PipelineProblem, objective: str = "latency", top_k: int = 1, max_stages: int | None = None
) -> list[PipelineSolution]:
    """EdgeShard-like: the first n = min(B, D[, max_stages]) devices in list order, stage k on device k,
    stages of near-equal compute share (see `even_boundaries`)."""
    validate_request(problem, objective)
    n = min(problem.n_blocks, problem.n_devices, max_stages or problem.n_devices)
    bounds = even_boundaries(problem, n)
    stages = [(bounds[k], bounds[k + 1], k) for k in range(n)]
    for lo, hi, d in stages:
        need = problem.stage_memory(lo, hi)
        have = problem.device_mem_bytes[d]
        if need > have:
            raise InfeasibleError(
                f"even split over {n} devices does not fit: stage {d} (blocks {lo}..{hi - 1}) needs {_mb(need)}"
                f" but device {problem.devices[d]} offers {_mb(float(have))}"
            )
    bw = np.asarray(problem.bandwidth_bytes_per_ms)
    for (_, _, a), (_, _, b) in zip(stages, stages[1:]):
        if not bw[a, b] > 0:
            raise InfeasibleError(
                f"even split over {n} devices needs the link {problem.devices[a]} -> {problem.devices[b]},"
                " which has zero bandwidth"
            )
    count_work("plans", 1)
    return [_solve(problem, stages)]


def nearest_boundaries(sizes: np.ndarray, targets: list[float]) -> list[int]:
    """Block boundaries 0 = b_0 < b_1 < ... < b_n = B, b_k the boundary whose cumulative size is nearest to
    targets[k-1] (ties: the later one), every stage keeping at least one block."""
    B, n = len(sizes), len(targets) + 1
    prefix = np.concatenate([[0.0], np.cumsum(sizes)])
    bounds = [0]
    for k, target in enumerate(targets, 1):
        lo, hi = bounds[-1] + 1, B - (n - k)
        dist = np.abs(prefix[lo : hi + 1] - target)
        bounds.append(lo + int(np.flatnonzero(dist == dist.min())[-1]))
    return bounds + [B]


def solve_ring_memory(
    problem: PipelineProblem, objective: str = "latency", top_k: int = 1, max_stages: int | None = None
) -> list[PipelineSolution]:
    """exo's ring: the first n = min(B, D[, max_stages]) devices in list order, stage k on device k, each
    stage's memory (weights, and caches) as near its device's share of the devices' free memory as the
    block boundaries allow (`nearest_boundaries` over block memory)."""
    validate_request(problem, objective)
    n = min(problem.n_blocks, problem.n_devices, max_stages or problem.n_devices)
    sizes = np.asarray(problem.block_param_bytes, dtype=np.float64)
    free = np.asarray(problem.device_mem_bytes[:n], dtype=np.float64)
    share = np.cumsum(free)[:-1] / free.sum()
    bounds = nearest_boundaries(sizes, list(sizes.sum() * share))
    return [_fixed_stages("ring-memory", problem, bounds)]


def _fixed_stages(name: str, problem: PipelineProblem, bounds: list[int]) -> PipelineSolution:
    """Stage k = blocks [bounds[k], bounds[k+1]) on device k, or InfeasibleError (memory, a missing link)."""
    stages = [(bounds[k], bounds[k + 1], k) for k in range(len(bounds) - 1)]
    for lo, hi, d in stages:
        need, have = problem.stage_memory(lo, hi), problem.device_mem_bytes[d]
        if need > have:
            raise InfeasibleError(f"{name} over {len(stages)} devices does not fit: stage {d} (blocks {lo}..{hi - 1}) "
                                  f"needs {_mb(need)} but device {problem.devices[d]} offers {_mb(float(have))}")
    bw = np.asarray(problem.bandwidth_bytes_per_ms)
    for (_, _, a), (_, _, b) in zip(stages, stages[1:]):
        if not bw[a, b] > 0:
            raise InfeasibleError(f"{name} needs the link {problem.devices[a]} -> {problem.devices[b]}, which has "
                                  "zero bandwidth")
    count_work("plans", 1)
    return _solve(problem, stages)


def solve_neurosurgeon(
    problem: PipelineProblem, objective: str = "latency", top_k: int = 1, max_stages: int | None = None
) -> list[PipelineSolution]:
    """The best split point between two devices: every ordered pair (a, b), every cut, plus every
    single-device plan; the best that fits (ties: smaller stages tuple).

    Interchangeable devices (`device_classes`) give equal-cost plans, of which the one on each class's
    first devices has the smallest stages tuple: only the first two devices of each class are priced
    (`_representatives`), so the tables and candidates are O(B^2 Q + B Q^2), not O(B D^2), and the plans
    counted are all the plans they stand for."""
    validate_request(problem, objective)
    reps, single, pair = _representatives(device_classes(problem))
    sub = _restrict(problem, reps)
    best, n = _best_candidate(StageTables(sub), objective, max_stages, (single, pair))
    if best is None:
        raise InfeasibleError(
            f"no single device or two-device split fits: {infeasible_message(problem, min(2, max_stages or 2))}"
        )
    count_work("plans", n)
    sol = _solve(problem, [(lo, hi, int(reps[d])) for lo, hi, d in best])
    return [sol]

