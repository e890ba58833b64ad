"""The exact pipeline DP: a dynamic program over (blocks done, devices used, last device).

One algorithm, kept whole (its kernel, the memory-feasibility check and the per-objective passes share the
state space and its invariants, and read best together). The planner around it is pipeline.py
(`plan_pipeline`); its problem is pipeline_problem.py, its tables pipeline_tables.py.

`solve_pipeline` splits the chain of blocks 0..B-1 into contiguous stages, gives every stage its own
device (any subset of the devices, in any order) and returns the `top_k` best placements that fit
memory, under the cost model of `PipelineProblem`. The pipeline baselines (baselines.py) and the
pipeline tails of hybrid plans (`PipelineTail`, for spatial.py) solve the same problem.

Formulation. A state is (j, n, a): blocks 0..j-1 are placed, `n` counts the devices used in each class of
interchangeable devices (pipeline_space.py) and a's class ran the last stage, which ends at j. A transition
appends the stage [j, h) on the next unused device of a class: it pays the transfer of cut j-1 and the
compute of blocks j..h-1 there. Device order is part of the state, so every ordered subset of devices is
searched (up to relabelling alike devices); the answer is the best state with j = B.
Each state keeps labels, and a label is dropped only when at least k other labels of the same state are
at least as good under every possible completion, so the k best complete plans are exact:

  - latency, switched medium: a label is (latency, bottleneck), compared lexicographically. Latency is
    additive and the bottleneck a running max, so a lexicographically smaller label stays smaller after
    any common extension. The k smallest labels per state are kept (vectorised over all states of a
    given j with numpy).
  - throughput, switched medium: the objective (max term, latency) is not monotone under extension (a
    later large stage can hide an earlier difference in bottleneck), so it is solved in two exact passes
    of the same vectorised DP: (1) the k best bottleneck values (a min-max DP, which is monotone) give
    the bottleneck levels of the answer; every plan strictly below the highest level t is in the answer
    and comes out of that pass; (2) the latency DP restricted to stages and transfers <= t gives the
    best latencies at level t.
  - shared medium: the link term is the SUM of the transfers, so the bottleneck max(max compute,
    transfer sum) is not decomposable. A label is (latency, max compute, transfer sum) and each state
    keeps its k-Pareto set (entries dominated by fewer than k others; pipeline_pareto.py). The search is bounded with an
    exact lower bound on the bottleneck (a parametric search over compute caps: min over c of
    max(c, least transfer sum with every stage <= c)) and an upper bound from plans already known.
    States that have used too many devices to cover the remaining blocks within the bound are dropped.
    With the latency objective, a label with a strictly smaller latency dominates regardless of the
    rest, so the Pareto step only resolves exact latency ties; when the (k+1)-th best latency differs
    from the k-th, the fast latency DP is already exact and the Pareto pass is skipped.

Symmetry: devices that are interchangeable bit for bit (same block_ms column, memory, machine, power
figures, and links to and from every other device) form a class and are only used in index order, which
removes relabelled copies of the same plan from the search without losing any cost; for top_k > 1 the
copies are generated back afterwards (they have identical costs), so the result equals the unrestricted
search.  The planner (`plan_pipeline`) asks for none of them back (`copies=False`): its top-K are K
distinct plans.

Size: with Q classes of n_1..n_Q devices and S = min(D, B) stages at most, the states are the count vectors
of sum <= S (at most prod(n_c + 1)), never the 2^D subsets: 32 identical devices are 33 states. The tables
are [states, Q, B, k]; time O(states x Q x (B^2 + B Q) x k), after O(B^3 Q + B Q^2) to build the stage and
transfer tables. Above `pipeline_space.RELAX_FIRST` (state,
class) pairs the relaxation is solved first: a class may run any number of stages, so its state is the last
class alone (O(Q B^2 + Q^2 B) x k); when its k best plans use no class more often than it has devices they
are the exact k best (every real plan is a relaxed one). Over `STATE_BUDGET` states or `TABLE_BUDGET`
bytes of tables the exact DP refuses (`TooManyStates`) instead of allocating, and when the relaxation's
plans are not real either (`_beyond_budget`), the plans are the best of its real ones and of the exact DP
over the devices the budget allows, reported not exact with their optimality gap over the relaxation's
best value (a lower bound). The planner (pipeline.py) adds pipeline_coarse.py on chains of many blocks.
Peak memory: O(B^2 Q + B Q^2) for the stage and transfer tables, built per class (pipeline_tables.py; nothing
in them follows the device count), plus the DP's tables, 48 bytes per (state, class, block, top-k slot): at
most STATE_BUDGET pairs and TABLE_BUDGET bytes, checked before they are allocated (`Space`); the relaxation's
are O(Q B k), and the exact DP over a subset of the devices is held to SUBSET_BUDGET. Beside them, the
problem's O(B D) block times and O(D^2) link matrices, and the class test (`device_classes`). The shared
medium's Pareto sets (pipeline_pareto.py) hold at most its LABEL_BUDGET labels (48 bytes each): beyond it the
DP refuses as beyond the state budget, and the planner goes on with the relaxation and fewer devices. With riders, each run's tables are
copies per class of the run (its first device in a class of its own): O(B^2 Q + B Q^2) at a time.

Riders (a generative build's rotary tables and mask, pipeline_riders.py): the DP runs once per routing of
them and first stage that computes them, on tables that price that routing (pipeline_routed.py), skipping
the runs whose first stage alone prices them out of the k best; a plan's price is its best routing's.

Numerics: stage compute is summed with the same numpy reduction `PipelineProblem.evaluate` uses, and
transfers with the same expression, so bottleneck values are bit-identical to `evaluate`'s. Latency is
accumulated in a different order than `evaluate` (rounding differences ~1e-16 relative); returned plans
are always re-scored with `evaluate`. Transfers over a pair with zero bandwidth are treated as missing
links (never used).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from ..units import MB
from .pipeline_pareto import pareto_dp
from .pipeline_problem import PipelineProblem, PipelineSolution, StageChoice, solution_sort_key, validate_request
from . import pipeline_space
from .pipeline_space import RELAX_FIRST, TABLE_BUDGET, Relaxed, Space, TooManyStates, count_states
from .pipeline_routed import routed_runs
from .pipeline_tables import Span, StageTables
from .planner import InfeasibleError
from .stats import count as count_work

__all__ = ["solve_pipeline", "solve_on_tables", "memory_feasible", "infeasible_message"]


def _space(tab: StageTables, S: int, pair_bytes: int = 0) -> Space:
    """The states the DPs visit on these tables: the counts per class, or the relaxation's one state."""
    return Relaxed(tab.cls) if tab.relaxed else Space(tab.cls, S, pair_bytes, tab.budget)


# ----------------------------------------------------------------------------------------------------
# vectorised lexicographic k-best DP


def _select_k(p: np.ndarray, s: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The K lexicographically smallest (p, s) along the last axis: (indices, p, s), each [..., K].

    Exhausted slots come back with p = s = inf. Ties go to the lower index (deterministic).
    """
    n = p.shape[-1]
    if K == 1 or n == 1:
        pm = p.min(axis=-1, keepdims=True)
        idx = np.where(p == pm, s, np.inf).argmin(axis=-1)[..., None]
        out_p = np.take_along_axis(p, idx, -1)
        out_s = np.where(np.isfinite(out_p), np.take_along_axis(s, idx, -1), np.inf)
        if K > 1:  # n == 1: pad
            pad = p.shape[:-1] + (K - 1,)
            idx = np.concatenate([idx, np.zeros(pad, dtype=idx.dtype)], -1)
            out_p = np.concatenate([out_p, np.full(pad, np.inf)], -1)
            out_s = np.concatenate([out_s, np.full(pad, np.inf)], -1)
        return idx, out_p, out_s
    # one stable sort by (p, s) instead of K rounds of min and mask: the same picks, index ties included
    idx = np.lexsort((s, p), axis=-1)[..., :K]
    out_p = np.take_along_axis(p, idx, -1)
    out_s = np.where(np.isfinite(out_p), np.take_along_axis(s, idx, -1), np.inf)
    if n < K:  # fewer candidates than slots: the rest are exhausted
        pad = p.shape[:-1] + (K - n,)
        idx = np.concatenate([idx, np.zeros(pad, dtype=idx.dtype)], -1)
        out_p = np.concatenate([out_p, np.full(pad, np.inf)], -1)
        out_s = np.concatenate([out_s, np.full(pad, np.inf)], -1)
    return idx, out_p, out_s


def _lex_dp(
    tab: StageTables,
    K: int,
    S: int,
    Cp: np.ndarray,
    Cs: np.ndarray,
    Tp: np.ndarray,
    Ts: np.ndarray,
    op_p,
    op_s,
) -> list[tuple[float, float, list[Span]]]:
    """K best plans by the lexicographic label (p, s), best first, as (p, s, stages).

    A stage [lo, hi) on class q contributes Cp/Cs[lo, hi, q], a transfer over cut c from class p to q
    Tp/Ts[c, p, q] (tables per class, as StageTables holds them);
    labels combine with op_p / op_s (np.add or np.maximum). inf in Cp or Tp forbids that stage/transfer.
    Exact for the multiset of the K best p values, and for (p, s) whenever extension preserves the
    lexicographic order (p additive, s a running max). At most S stages; canonical device orders only.
    """
    B = tab.B
    sp = _space(tab, S, pair_bytes=(2 * B + 1) * K * 24)  # W and V: two float64 and two int32 per slot
    Q, nS = sp.Q, sp.n
    pm, pq, psrc = sp.pm, sp.pq, sp.psrc
    P = pm.size
    # W[m, q, j, r]: label after the transfer into class q at block j (q's next device not in m); V[m, p, h, r]:
    # after a stage on class p (its last device in m) ending at h. m indexes the states of `sp`.
    Wp = np.full((nS, Q, B, K), np.inf)
    Ws = np.full((nS, Q, B, K), np.inf)
    Wa = np.zeros((nS, Q, B, K), dtype=np.int32)
    Wr = np.zeros((nS, Q, B, K), dtype=np.int32)
    Vp = np.full((nS, Q, B + 1, K), np.inf)
    Vs = np.full((nS, Q, B + 1, K), np.inf)
    Vi = np.zeros((nS, Q, B + 1, K), dtype=np.int32)
    Vq = np.zeros((nS, Q, B + 1, K), dtype=np.int32)
    start = sp.inc[sp.empty] >= 0
    Wp[sp.empty, start, 0, 0] = 0.0
    Ws[sp.empty, start, 0, 0] = 0.0
    w_forbid = (sp.inc < 0)[:, :, None]  # [nS, Q(b), 1]
    CpT = np.ascontiguousarray(Cp.transpose(2, 1, 0))  # [q, hi, lo]
    CsT = np.ascontiguousarray(Cs.transpose(2, 1, 0))
    # stages [j, h) allowed on some device: j >= jlo[h] (shrinking a stage keeps it allowed)
    allowed = np.isfinite(Cp).any(axis=2)  # [lo, hi]
    jlo = np.where(allowed.any(axis=0), allowed.argmax(axis=0), np.arange(B + 1))
    order = sp.order[:, :, None]  # [nS, Q, 1]: each state's classes by their last device (ties as over devices)
    labels = 0
    for h in range(1, B + 1):
        j0 = int(jlo[h])
        n = h - j0
        if n == 0:
            continue
        cand_p = op_p(Wp[psrc, pq, j0:h, :], CpT[pq, h, j0:h, None]).reshape(P, n * K)
        labels += cand_p.size
        cand_s = op_s(Ws[psrc, pq, j0:h, :], CsT[pq, h, j0:h, None]).reshape(P, n * K)
        idx, vp, vs = _select_k(cand_p, cand_s, K)
        Vp[pm, pq, h] = vp
        Vs[pm, pq, h] = vs
        Vi[pm, pq, h] = j0 + idx // K
        Vq[pm, pq, h] = idx % K
        if h == B:
            break
        tp = Tp[h - 1][sp.order]  # [nS, a (ordered), b]
        ts = Ts[h - 1][sp.order]
        cand_p = op_p(np.take_along_axis(Vp[:, :, h, :], order, 1)[:, :, None, :], tp[:, :, :, None])  # [nS, a, b, K]
        cand_s = op_s(np.take_along_axis(Vs[:, :, h, :], order, 1)[:, :, None, :], ts[:, :, :, None])
        cand_p = cand_p.transpose(0, 2, 1, 3).reshape(nS, Q, Q * K)
        cand_s = cand_s.transpose(0, 2, 1, 3).reshape(nS, Q, Q * K)
        cand_p = np.where(w_forbid, np.inf, cand_p)
        labels += cand_p.size
        idx, wp_, ws_ = _select_k(cand_p, cand_s, K)
        Wp[:, :, h], Ws[:, :, h] = wp_, ws_
        Wa[:, :, h], Wr[:, :, h] = np.take_along_axis(sp.order, idx.reshape(nS, Q * K) // K, 1).reshape(idx.shape), idx % K
    count_work("labels", labels)
    # best final labels over all (m, q), in the order of (m, q's last device)
    fp = Vp[pm, pq, B].reshape(P * K)
    fs = Vs[pm, pq, B].reshape(P * K)
    idx, vp, vs = _select_k(fp, fs, K)
    out = []
    for i, p_val, s_val in zip(idx.tolist(), vp.tolist(), vs.tolist()):
        if not np.isfinite(p_val):
            break
        m, q, r = int(pm[i // K]), int(pq[i // K]), i % K
        h, stages = B, []
        while True:
            j, jr = int(Vi[m, q, h, r]), int(Vq[m, q, h, r])
            stages.append((j, h, sp.device(m, q)))
            if j == 0:
                break
            m = int(sp.dec[m, q])
            q, r, h = int(Wa[m, q, j, jr]), int(Wr[m, q, j, jr]), j
        out.append((p_val, s_val, stages[::-1]))
    return out


def _latency_dp(tab: StageTables, K: int, S: int, cap: float = np.inf) -> list[tuple[float, float, list[Span]]]:
    """K best (latency, switched bottleneck); stages and transfers above `cap` are forbidden."""
    C = tab.C if cap == np.inf else np.where(tab.Cmax <= cap, tab.C, np.inf)
    T = tab.T if cap == np.inf else np.where(tab.T <= cap, tab.T, np.inf)
    return _lex_dp(tab, K, S, C, tab.Cmax, T, T, np.add, np.maximum)


def _bottleneck_dp(tab: StageTables, K: int, S: int) -> list[tuple[float, float, list[Span]]]:
    """K best switched bottlenecks (min-max DP; latency only as a tie-break that may be inexact)."""
    return _lex_dp(tab, K, S, tab.Cmax, tab.C, tab.T, tab.T, np.maximum, np.add)


def _transfer_sum_dp(tab: StageTables, S: int, cap: float) -> list[tuple[float, float, list[Span]]]:
    """Least transfer sum over plans whose every stage computes in <= cap ms."""
    Cp = np.where(tab.C <= cap, 0.0, np.inf)
    return _lex_dp(tab, 1, S, Cp, tab.C, tab.T, tab.T, np.add, np.add)


def memory_feasible(problem: PipelineProblem, max_stages: int | None) -> bool:
    """Whether some placement fits memory, links aside (beyond the state budget: whether the relaxation's
    first such placement is a real one, so False may only mean that none was found)."""
    tab = StageTables(problem)
    S = min(tab.D, tab.B, max_stages or tab.D)
    zero = np.where(np.isfinite(tab.C), 0.0, np.inf)
    args = (zero, zero, np.zeros_like(tab.T), np.zeros_like(tab.T), np.add, np.add)
    try:
        return bool(_lex_dp(tab, 1, S, *args))
    except TooManyStates:
        found = _lex_dp(tab.relaxation(), 1, S, *args)
        return bool(found) and Relaxed(tab.cls).as_devices(found[0][2], S) is not None


def infeasible_message(problem: PipelineProblem, max_stages: int | None = None) -> str:
    """One line saying how much memory the model needs and how much the cluster offers."""
    params = np.asarray(problem.block_param_bytes, dtype=np.float64)
    act = np.asarray(problem.block_peak_act_bytes, dtype=np.float64)
    mem = np.asarray(problem.device_mem_bytes, dtype=np.float64)
    weights, peak = float(params.sum()), float(act.max())
    need, total, largest = weights + peak, float(mem.sum()), float(mem.max())
    name = problem.devices[int(np.argmax(mem))]
    offer = f"the devices offer {total / MB:.1f} MB in total (largest {name}, {largest / MB:.1f} MB)"
    block_mem = np.array([problem.stage_memory(i, i + 1) for i in range(problem.n_blocks)], dtype=np.float64)
    worst = int(np.argmax(block_mem))
    if block_mem[worst] > largest:
        return (
            f"block {worst} alone needs {block_mem[worst] / MB:.1f} MB (weights {params[worst] / MB:.1f} MB"
            f" + activations {act[worst] / MB:.1f} MB) but the largest device ({name}) offers {largest / MB:.1f} MB,"
            f" so no split can fit it (the whole model needs at least {need / MB:.1f} MB; {offer})"
        )
    base = (
        f"model needs at least {need / MB:.1f} MB (weights {weights / MB:.1f} MB + peak activations"
        f" {peak / MB:.1f} MB) to fit across the cluster; {offer}"
    )
    if need > total:
        return base
    limit = f"at most {max_stages} " if max_stages is not None and max_stages < problem.n_devices else ""
    if memory_feasible(problem, max_stages):
        return f"{base}; placements that fit memory exist but every one needs a missing link (zero bandwidth)"
    return f"{base}, but no split into {limit}contiguous stages fits each stage on its own device"


# ----------------------------------------------------------------------------------------------------
# objectives


def _solve_latency_switched(tab, k, S):
    return [st for _, _, st in _latency_dp(tab, k, S)]


def _solve_throughput_switched(tab, k, S):
    levels = _bottleneck_dp(tab, k, S)
    if len(levels) < k:  # fewer than k plans exist: all of them
        return [st for _, _, st in levels]
    t = levels[-1][0]
    below = [st for bn, _, st in levels if bn < t]
    at_t = [st for _, bn, st in _latency_dp(tab, k, S, cap=t) if bn == t]
    return below + at_t[: k - len(below)]


def _shared_key(tab, stages, objective):
    lat, mc, _, st = tab.replay(stages)
    bn = max(mc, st)
    return (lat, bn) if objective == "latency" else (bn, lat)


def _upper_bound(tab, plans, k, objective):
    """(latency, bottleneck) of the k-th best of the distinct known plans, or infs."""
    uniq = {tuple(p): _shared_key(tab, p, objective) for p in plans}
    if len(uniq) < k:
        return (np.inf, np.inf)
    key = sorted(uniq.values())[k - 1]
    return key if objective == "latency" else (key[1], key[0])


def _solve_latency_shared(tab, k, S):
    fast = _latency_dp(tab, k + 1, S)
    if len(fast) <= k or fast[k][0] > fast[k - 1][0]:
        return [st for _, _, st in fast[:k]]  # the k best latencies are unique at the boundary: exact
    plans = [st for _, _, st in fast[:k]]
    ub = _upper_bound(tab, plans, k, "latency")
    return [st for _, _, st in pareto_dp(tab, _space(tab, S), k, S, "latency", ub, 0.0)]


def _min_shared_bottleneck(tab, S, lower: float, upper: float):
    """Exact least shared-medium bottleneck: min over compute caps c of max(c, least transfer sum with
    every stage <= c). The least sum only falls as c grows, so the crossing is found by bisection over
    the distinct stage times in [lower, upper] (bounds on the answer). Returns (value, plans seen)."""
    caps = np.unique(tab.C[np.isfinite(tab.C)])
    plans = []

    def least(i):
        res = _transfer_sum_dp(tab, S, float(caps[i]))
        if res:
            plans.append(res[0][2])
            return res[0][0]
        return np.inf

    # first i with least(i) <= caps[i]; none below `lower`, and caps[i] >= upper qualifies
    lo = int(np.searchsorted(caps, lower, side="left"))
    hi = int(np.searchsorted(caps, upper, side="left"))
    while lo < hi:
        mid = (lo + hi) // 2
        if least(mid) <= caps[mid]:
            hi = mid
        else:
            lo = mid + 1
    best = upper
    if lo < caps.size:
        best = min(best, float(caps[lo]))
    if lo > 0:
        best = min(best, least(lo - 1))
    return best, plans


def _solve_throughput_shared(tab, k, S):
    sw = _bottleneck_dp(tab, 1, S)  # switched bottleneck <= shared bottleneck for every plan
    if not sw:
        return []
    cheap = [sw[0][2]] + [st for _, _, st in _latency_dp(tab, k, S)]
    upper = min(_shared_key(tab, p, "throughput")[0] for p in cheap)
    lb, plans = _min_shared_bottleneck(tab, S, sw[0][0], upper)
    ub = _upper_bound(tab, cheap + plans, k, "throughput")
    return [st for _, _, st in pareto_dp(tab, _space(tab, S), k, S, "throughput", ub, lb)]


def _relabelings(tab: StageTables, plan: list[Span], limit: int) -> list[list[Span]]:
    """Up to `limit` plans of identical cost: `plan` (canonical, first) with identical devices permuted."""
    positions: dict[int, list[int]] = {}
    for pos, (_, _, d) in enumerate(plan):
        positions.setdefault(int(tab.cls[d]), []).append(pos)
    groups = [(pos, np.flatnonzero(tab.cls == c).tolist()) for c, pos in positions.items()]
    out: list[list[Span]] = []
    devices = [d for _, _, d in plan]

    def rec(g: int):
        if len(out) >= limit:
            return
        if g == len(groups):
            out.append([(lo, hi, devices[i]) for i, (lo, hi, _) in enumerate(plan)])
            return
        pos, members = groups[g]
        for choice in itertools.permutations(members, len(pos)):
            for i, d in zip(pos, choice):
                devices[i] = d
            rec(g + 1)
            if len(out) >= limit:
                return

    rec(0)
    return out


# ----------------------------------------------------------------------------------------------------
# entry points


def solve_pipeline(
    problem: PipelineProblem, objective: str = "latency", top_k: int = 1, max_stages: int | None = None,
    copies: bool = True, report: dict | None = None,
) -> list[PipelineSolution]:
    """The `top_k` best distinct placements of the block chain, best first (exact).

    Stages are contiguous, each on its own device (any subset, any order), each fitting its device's
    memory; at most `max_stages` stages if given. Ranked by `solution.key(objective)` - latency then
    bottleneck, or bottleneck then latency - with the stages tuple as a final deterministic tie-break
    (which of several exactly-tied plans fill the last slots is deterministic but not otherwise
    specified). Fewer than `top_k` are returned only when fewer placements exist.

    Without `copies`, a placement that only swaps devices interchangeable bit for bit (module docstring:
    Symmetry) with another is not a placement of its own: the `top_k` best of those classes, each as its
    canonical member (identical devices in index order). That is what a planner wants of its top-K: on two
    like devices the exact top 3 is a split, its mirror and a second split, the mirror costing the same by
    construction, so it leaves the driver's choice (plan/choose.py _candidate) and `--keep` one real alternative.
    Raises InfeasibleError (message in MB) when nothing fits, ValueError on bad arguments.
    """
    validate_request(problem, objective)
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if max_stages is not None and max_stages < 1:
        raise ValueError(f"max_stages must be >= 1, got {max_stages}")
    return solve_on_tables(problem, StageTables(problem), objective, top_k, max_stages, copies, report)


def solve_on_tables(problem: PipelineProblem, tab: StageTables, objective: str, top_k: int,
           max_stages: int | None, copies: bool = True, report: dict | None = None) -> list[PipelineSolution]:
    """solve_pipeline on the problem's tables, built or sliced (PipelineTail). With `report`, sets its
    "exact" (whether the plans are the exact top-k) and, when not, "optimality_gap" (module docstring: Size)."""
    S = min(tab.D, tab.B, max_stages or tab.D)
    shared = problem.medium == "shared" and tab.B > 1 and S > 1
    exact, gap, beyond = True, 0.0, False
    plans = None
    routed = problem.riders is not None and not shared
    if routed and _states(tab, S) <= RELAX_FIRST:
        try:  # once per routing and first stage (pipeline_routed.py)
            plans = _solve_routed(problem, tab, objective, top_k, S)
        except TooManyStates:
            plans = None
    if routed and plans is None:
        exact = False  # beyond the state budget the riders are priced forwarded: a bound, not the routed price
    if plans is None and _states(tab, S) > RELAX_FIRST:
        plans = _relaxed_if_real(tab, objective, top_k, S, shared)
    if plans is None:
        try:
            plans = _solve(tab, objective, top_k, S, shared)
        except TooManyStates:
            plans, exact, gap = _beyond_budget(problem, tab, objective, top_k, S, shared)
            beyond = True
    if report is not None:
        report.update({"exact": exact} if exact else {"exact": False, "optimality_gap": gap})
    if not plans and beyond:
        raise InfeasibleError("the exact pipeline DP's states exceed its budget, and neither its relaxation nor the "
                              "exact DP over the devices the budget allows found a placement that fits")
    if not plans:
        raise InfeasibleError(infeasible_message(problem, max_stages))
    if copies and top_k > 1 and np.any(tab.cls != np.arange(tab.D)):  # the DPs searched canonical orders only
        plans = [q for p in plans for q in _relabelings(tab, p, top_k)]
    unique = dict.fromkeys(tuple(StageChoice(lo, hi, d) for lo, hi, d in p) for p in plans)  # a plan in several runs
    sols = [problem.evaluate(stages, objective) for stages in unique]
    sols.sort(key=lambda s: solution_sort_key(s, objective))
    return sols[:top_k]


def _solve_routed(problem: PipelineProblem, tab: StageTables, objective: str, k: int, S: int) -> list[list[Span]]:
    """The k best plans of a problem with riders over its runs (pipeline_routed.py), each run skipped when its
    bound is above the k-th best price found so far."""
    keys: dict[tuple, float] = {}  # each plan found: the objective, by the problem's price
    for bound, run in routed_runs(problem, tab, objective):
        if len(keys) >= k and bound > sorted(keys.values())[k - 1] * (1 + 1e-12):
            continue
        for p in _solve(run, objective, k, S, False):
            stages = tuple(StageChoice(*s) for s in p)
            if stages not in keys:
                keys[stages] = problem.evaluate(stages, objective).key(objective)[0]
    return [[(s.lo, s.hi, s.device) for s in stages] for stages in keys]


def _solve(tab: StageTables, objective: str, k: int, S: int, shared: bool) -> list[list[Span]]:
    if objective == "latency":
        return _solve_latency_shared(tab, k, S) if shared else _solve_latency_switched(tab, k, S)
    return _solve_throughput_shared(tab, k, S) if shared else _solve_throughput_switched(tab, k, S)


def _beyond_budget(problem: PipelineProblem, tab: StageTables, objective: str, k: int, S: int,
                   shared: bool) -> tuple[list[list[Span]], bool, float]:
    """(plans, exact, optimality gap) when the count states exceed the budget (module docstring: Size).

    The relaxation (a class may run any number of stages) is solved first: when its k best plans use no
    class more often than it has devices, they are the exact k best. Otherwise its best value is a lower
    bound, and the plans are the best of its plans that are real and of the exact DP over the most useful
    devices the budget allows (those the relaxed plans use first, then the fastest): the gap is the best
    plan's objective over that bound, minus one."""
    relaxed = _solve(tab.relaxation(), objective, k, S, shared)
    sp = Relaxed(tab.cls)
    real = [p for p in (sp.as_devices(plan, S) for plan in relaxed) if p is not None]
    if len(real) == len(relaxed):
        return real, True, 0.0
    lower = _lex_first(tab.relaxation(), objective, S)
    subset = _useful_devices(problem, tab, sp, relaxed, S)
    sub = _restrict(problem, subset)
    try:
        sub_tab = StageTables(sub)
        sub_tab.budget = SUBSET_BUDGET
        found = _solve(sub_tab, objective, k, min(len(subset), tab.B, S), shared)
    except TooManyStates:
        found = []
    plans = real + [[(lo, hi, int(subset[d])) for lo, hi, d in p] for p in found]
    if not plans:
        return [], False, math.inf
    keys = sorted(problem.evaluate(tuple(StageChoice(*s) for s in p), objective).key(objective)[0] for p in plans)
    return plans, False, (keys[0] / lower - 1.0) if lower > 0 else 0.0


def _states(tab: StageTables, S: int) -> int:
    """(count vector, class) pairs of the exact DP on `tab`."""
    sizes = np.unique(tab.cls, return_counts=True)[1]
    return count_states(sizes.tolist(), S) * sizes.size


def _relaxed_if_real(tab: StageTables, objective: str, k: int, S: int, shared: bool) -> list[list[Span]] | None:
    """The relaxation's k best plans when every one is real (then they are the exact k best), else None."""
    relaxed = _solve(tab.relaxation(), objective, k, S, shared)
    sp = Relaxed(tab.cls)
    real = [p for p in (sp.as_devices(plan, S) for plan in relaxed) if p is not None]
    return real if len(real) == len(relaxed) else None


def _lex_first(tab: StageTables, objective: str, S: int) -> float:
    """The least latency (or switched bottleneck, a lower bound of the shared one) of any plan on `tab`."""
    best = _latency_dp(tab, 1, S) if objective == "latency" else _bottleneck_dp(tab, 1, S)
    return float(best[0][0]) if best else math.inf


SUBSET_BUDGET = TABLE_BUDGET // 16  # bytes of tables for the exact DP over a subset (a hybrid plan runs one per cut)


def _useful_devices(problem: PipelineProblem, tab: StageTables, sp: Relaxed, relaxed, S: int) -> np.ndarray:
    """The devices the exact DP can afford, most useful first: each class's first devices as often as the
    relaxed plans use it, then the rest by their compute over the whole chain (fastest first)."""
    want: list[int] = []
    q_of = {int(r): q for q, r in enumerate(sp.rep)}
    for plan in relaxed:
        uses = [0] * sp.Q
        for _, _, d in plan:
            q = q_of[d]
            if uses[q] < sp.members[q].size:
                want.append(int(sp.members[q][uses[q]]))
            uses[q] += 1
    speed = np.asarray(problem.block_ms, dtype=np.float64).sum(axis=0)
    order = list(dict.fromkeys(want + [int(d) for d in np.argsort(speed, kind="stable")]))
    chosen: list[int] = []
    for d in order:
        trial = sorted(chosen + [d])
        sizes = np.unique(tab.cls[trial], return_counts=True)[1]
        S_sub = min(len(trial), tab.B, S)
        pairs = count_states(sizes.tolist(), S_sub) * sizes.size
        if pairs > pipeline_space.STATE_BUDGET or pairs * (2 * tab.B + 1) * 3 * 24 > SUBSET_BUDGET:
            break
        chosen = trial
    return np.array(sorted(chosen))


def _restrict(problem: PipelineProblem, idx: np.ndarray) -> PipelineProblem:
    """The problem on the devices `idx` only (in that order)."""
    pick = lambda x: None if x is None else np.asarray(x)[idx]  # noqa: E731
    return replace(problem, devices=tuple(problem.devices[i] for i in idx), block_ms=np.asarray(problem.block_ms)[:, idx],
                   device_mem_bytes=pick(problem.device_mem_bytes),
                   bandwidth_bytes_per_ms=np.asarray(problem.bandwidth_bytes_per_ms)[np.ix_(idx, idx)],
                   link_latency_ms=np.asarray(problem.link_latency_ms)[np.ix_(idx, idx)],
                   request_in_ms=pick(problem.request_in_ms), request_out_ms=pick(problem.request_out_ms),
                   traits=None if problem.traits is None else tuple(problem.traits[i] for i in idx))
