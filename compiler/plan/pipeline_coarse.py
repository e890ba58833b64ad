"""The pipeline planner on long chains: runs of blocks coarsened into groups, the exact DP on the groups, then
every stage boundary refined block by block around where the coarse plan put it (`solve_chain`).

The exact DP (pipeline_dp.py) prices every stage [lo, hi) on every class of devices: O(B^2 Q) tables and
O(B^3 Q) time in the B blocks between pipeline cuts, which on a 10,000-layer chain is 10^8 stages per class
and gigabytes. Above `COARSE_ABOVE` blocks the chain is cut into `GROUPS` groups of consecutive blocks (a
group is a block of the coarse problem: its compute summed, its weights summed, its peak activations the
largest; the cuts between groups are real cuts, priced as they are), the coarse problem is solved exactly,
and each boundary of each coarse plan then moves, one at a time and devices kept, to the block within a group
either side of it that prices the whole plan best (under `evaluate`, memory checked), until no move improves it.

Complexity, B blocks, D devices in Q classes, G = GROUPS, S stages: the coarse DP is the exact DP's on G
blocks (O(G^2 Q) tables, its states as pipeline_dp.py says); refinement evaluates O(S x B / G) placements per
pass, each O(B): O(B) per pass for fixed G and S, and the problem's arrays are O(B D). Planning is
near-linear in the layers of a chain. Peak memory: O(B D) for the problem and O(G^2 Q + G Q^2) for the coarse
DP's stage and transfer tables, with its DP tables under pipeline_dp.py's budgets; refinement holds one plan
at a time.

Not exact: the plans are reported as such (`report["exact"] = False`) with `optimality_gap` against a
bound no plan beats (latency: every block on its fastest device, no transfers; throughput: the slowest
block on its fastest device, and the least compute spread over all devices).
"""

from __future__ import annotations

import numpy as np

from .pipeline_dp import solve_pipeline
from .pipeline_problem import PipelineProblem, PipelineSolution, StageChoice, solution_sort_key
from .planner import InfeasibleError

__all__ = ["solve_chain", "COARSE_ABOVE", "GROUPS"]

COARSE_ABOVE = 512  # blocks: up to here the exact DP runs on the chain itself
GROUPS = 256  # blocks of the coarse problem


def solve_chain(problem: PipelineProblem, objective: str, top_k: int, copies: bool = False,
                report: dict | None = None) -> list[PipelineSolution]:
    """`solve_pipeline`, exact up to COARSE_ABOVE blocks; coarsened and refined beyond (module docstring)."""
    B = problem.n_blocks
    if B <= COARSE_ABOVE:
        return solve_pipeline(problem, objective, top_k=top_k, copies=copies, report=report)
    groups = GROUPS
    while True:
        bounds = np.linspace(0, B, min(groups, B) + 1).round().astype(int)
        try:
            coarse = solve_pipeline(_coarsen(problem, bounds), objective, top_k=top_k, copies=False)
            break
        except InfeasibleError:
            if groups >= B:
                raise
            groups *= 2  # a group too large for every device: finer groups
    width = int(np.diff(bounds).max())
    seen: dict[tuple, PipelineSolution] = {}
    for sol in coarse:
        stages = [StageChoice(int(bounds[s.lo]), int(bounds[s.hi]), s.device) for s in sol.stages]
        best = _refine(problem, stages, objective, width)
        seen.setdefault(tuple(best.stages), best)
    sols = sorted(seen.values(), key=lambda s: solution_sort_key(s, objective))[:top_k]
    if report is not None:
        lower = _lower_bound(problem, objective)
        report.update({"exact": False,
                       "optimality_gap": float(sols[0].key(objective)[0] / lower - 1.0) if lower > 0 else 0.0})
    return sols


def _coarsen(problem: PipelineProblem, bounds: np.ndarray) -> PipelineProblem:
    """The problem whose blocks are the groups [bounds[i], bounds[i+1]) of `problem`'s blocks."""
    lo, hi = bounds[:-1], bounds[1:]
    bm = np.add.reduceat(np.asarray(problem.block_ms, dtype=np.float64), lo, axis=0)
    params = np.add.reduceat(np.asarray(problem.block_param_bytes), lo)
    act = np.maximum.reduceat(np.asarray(problem.block_peak_act_bytes), lo)
    cuts = hi[:-1] - 1  # the fine cut after each group but the last
    per_cut = None if problem.cut_tensor_bytes is None else tuple(problem.cut_tensor_bytes[c] for c in cuts)
    return PipelineProblem(
        devices=problem.devices, block_ms=bm, block_param_bytes=params, block_peak_act_bytes=act,
        cut_bytes=np.asarray(problem.cut_bytes)[cuts], device_mem_bytes=problem.device_mem_bytes,
        bandwidth_bytes_per_ms=problem.bandwidth_bytes_per_ms, link_latency_ms=problem.link_latency_ms,
        medium=problem.medium, cut_tensor_bytes=per_cut, request_in_ms=problem.request_in_ms,
        request_out_ms=problem.request_out_ms, traits=problem.traits)


def _refine(problem: PipelineProblem, stages: list[StageChoice], objective: str, width: int) -> PipelineSolution:
    """Move each boundary within `width` blocks either side, devices kept, while the plan improves."""
    best = problem.evaluate(tuple(stages), objective)
    improved = True
    while improved:
        improved = False
        for i in range(len(stages) - 1):
            a, b = stages[i], stages[i + 1]
            for c in range(max(a.lo + 1, a.hi - width), min(b.hi - 1, a.hi + width) + 1):
                if c == stages[i].hi:
                    continue
                trial = stages[:i] + [StageChoice(a.lo, c, a.device), StageChoice(c, b.hi, b.device)] + stages[i + 2:]
                if not problem.fits((trial[i], trial[i + 1])):
                    continue
                sol = problem.evaluate(tuple(trial), objective)
                if solution_sort_key(sol, objective) < solution_sort_key(best, objective):
                    best, stages, improved = sol, trial, True
    return best


def _lower_bound(problem: PipelineProblem, objective: str) -> float:
    """A value of the objective no plan beats (module docstring)."""
    fastest = np.asarray(problem.block_ms, dtype=np.float64).min(axis=1)
    if objective == "latency":
        return float(fastest.sum())
    return float(max(fastest.max(), fastest.sum() / problem.n_devices))
