"""pipeline_space.py: the pipeline DPs' states are counts per class of alike devices, built without the 2^D
subsets, in the order of those subsets' bitmasks; the DP on many alike devices equals the DP on as many as
it can use, and a state space over the budget is refused in one line."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgec.compiler.plan.pipeline_dp import solve_pipeline
from edgec.compiler.plan.pipeline_space import STATE_BUDGET, Space, count_states
from edgec.compiler.plan.planner import InfeasibleError
from pipeline_reference import brute_force
from edgec.compiler.plan.pipeline_problem import PIPELINE_OBJECTIVES
from test_pipeline_dp import check_solution, make_problem, problems

MB = 1_000_000


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=8), st.integers(1, 8))
def test_states_are_the_canonical_subsets_in_mask_order(cls_of, S):
    """Over devices of the given kinds: the states are exactly the subsets of at most S devices that take
    each kind's members in index order, sorted as their bitmasks are."""
    kinds = np.array(cls_of)
    cls = np.array([int(np.flatnonzero(kinds == kinds[d])[0]) for d in range(kinds.size)])
    sp = Space(cls, S)
    D = cls.size
    canon = [m for m in range(1 << D) if bin(m).count("1") <= S and all(
        not (m >> d & 1) or all(m >> x & 1 for x in range(d) if cls[x] == cls[d]) for d in range(D))]
    masks = [sum(1 << int(mem[i]) for q, mem in enumerate(sp.members) for i in range(sp.cnt[s, q])) for s in range(sp.n)]
    assert masks == sorted(canon)
    assert sp.n == count_states([m.size for m in sp.members], S) or S < D
    for s, q in itertools.product(range(sp.n), range(sp.Q)):  # the moves are +-1 of one class
        for table, step in ((sp.inc, 1), (sp.dec, -1)):
            if table[s, q] >= 0:
                assert (sp.cnt[table[s, q]] - sp.cnt[s]).tolist() == [step if i == q else 0 for i in range(sp.Q)]


def test_count_states_is_the_product_when_unbounded():
    assert count_states([3, 1, 2], 10) == 4 * 2 * 3
    assert count_states([32], 32) == 33
    assert count_states([2, 2], 1) == 3  # none, or one of either class


def _alike(D: int, B: int = 6) -> object:
    """B blocks on D identical devices, memory forcing at least two stages."""
    rng = np.random.default_rng(0)  # the same blocks whatever D
    col = rng.integers(1, 9, size=B).astype(np.float64) / 4
    return make_problem(np.repeat(col[:, None], D, axis=1), [4 * MB] * B, [MB] * B, [64] * (B - 1),
                        [14 * MB] * D, np.full((D, D), 64.0), np.full((D, D), 0.125))


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_many_alike_devices_plan_as_the_few_a_plan_can_use(objective):
    """70 alike devices (more than an int64 mask holds) give the plans 6 of them give: a plan of 6 blocks
    uses at most 6 devices, and the canonical plan takes them in index order."""
    few = solve_pipeline(_alike(6), objective, top_k=3, copies=False)
    many = solve_pipeline(_alike(70), objective, top_k=3, copies=False)
    assert [s.stages for s in few] == [s.stages for s in many]
    assert [s.key(objective) for s in few] == [s.key(objective) for s in many]


def test_many_distinct_devices_plan_beyond_the_budget_with_a_gap():
    """64 devices no two alike, 40 blocks: far more states than the budget. The plan is real (distinct
    devices, fits memory), and the report says whether it is exact and, if not, its gap to the bound."""
    D, B = 64, 40
    rng = np.random.default_rng(1)
    problem = make_problem(rng.uniform(1, 2, size=(B, D)), [MB] * B, [MB] * B, [64] * (B - 1), [8 * MB] * D,
                           np.full((D, D), 64.0))
    assert count_states([1] * D, B) > STATE_BUDGET
    report: dict = {}
    sol = solve_pipeline(problem, "latency", top_k=3, copies=False, report=report)[0]
    check_solution(problem, sol)
    assert len(sol.stages) >= 5  # 40 MB of weights on 8 MB devices
    assert report["exact"] or report["optimality_gap"] >= 0.0


@settings(max_examples=80, deadline=None)
@given(problems(), st.sampled_from(PIPELINE_OBJECTIVES))
def test_beyond_the_budget_plans_are_real_and_the_bound_holds(problem, objective):
    """With a budget of a few states every problem takes the relaxation's path: an exact report gives the
    brute-force optimum; otherwise the plan is real and its gap bounds its distance to the optimum."""
    import edgec.compiler.plan.pipeline_space as space

    truth = brute_force(problem, objective)
    saved = space.STATE_BUDGET
    space.STATE_BUDGET = 6
    try:
        report: dict = {}
        try:
            sols = solve_pipeline(problem, objective, top_k=2, copies=False, report=report)
        except InfeasibleError:
            assert not truth or not report.get("exact", True)
            return
    finally:
        space.STATE_BUDGET = saved
    assert truth
    for sol in sols:
        check_solution(problem, sol)
    best, opt = sols[0].key(objective)[0], truth[0].key(objective)[0]
    if report["exact"]:
        assert best == pytest.approx(opt, rel=1e-9, abs=1e-12)
    else:
        assert best >= opt * (1 - 1e-9)
        assert best / (1.0 + report["optimality_gap"]) <= opt * (1 + 1e-9) + 1e-12


@settings(max_examples=120, deadline=None)
@given(problems(), st.sampled_from(PIPELINE_OBJECTIVES))
def test_the_relaxation_first_gives_the_exact_keys(problem, objective):
    """With the relaxation tried first on every problem: the same top-3 costs as the count-state DP, and
    always exact (the count-state DP runs whenever the relaxed plans are not real)."""
    import edgec.compiler.plan.pipeline_dp as dp

    want = [s.key(objective) for s in _solve_or_none(problem, objective, {})]
    saved = dp.RELAX_FIRST
    dp.RELAX_FIRST = 0
    try:
        report: dict = {}
        got = _solve_or_none(problem, objective, report)
    finally:
        dp.RELAX_FIRST = saved
    assert [v for s in got for v in s.key(objective)] == pytest.approx([v for k in want for v in k], rel=1e-12)
    assert report.get("exact", True)
    for sol in got:
        check_solution(problem, sol)


def _solve_or_none(problem, objective, report):
    try:
        return solve_pipeline(problem, objective, top_k=3, copies=False, report=report)
    except InfeasibleError:
        return []
