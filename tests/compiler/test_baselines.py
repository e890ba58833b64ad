"""Baselines (single, even, neurosurgeon): feasible, never better than the exact DP, and each one equal
to its own definition checked by brute force."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgec.compiler.plan.baselines import even_boundaries, solve_even, solve_neurosurgeon, solve_single
from edgec.compiler.plan.pipeline_dp import solve_pipeline
from pipeline_reference import brute_force
from edgec.compiler.plan.pipeline_problem import PIPELINE_OBJECTIVES, PipelineProblem, PipelineSolution, StageChoice
from edgec.compiler.plan.planner import InfeasibleError

MB = 1_000_000
BASELINES = (solve_single, solve_even, solve_neurosurgeon)


@st.composite
def problems(draw, max_blocks: int = 8, max_devices: int = 4):
    """Random small problems with dyadic values (exact float sums), symmetric heterogeneous links and
    memory limits that rule out some placements."""
    B = draw(st.integers(1, max_blocks))
    D = draw(st.integers(1, max_devices))

    def ints(lo, hi, n):
        return np.array(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), dtype=np.int64)

    bw = 2.0 ** ints(3, 8, D * D).reshape(D, D)
    lat = ints(0, 3, D * D).reshape(D, D) / 8.0
    return PipelineProblem(
        devices=tuple(f"dev{i}" for i in range(D)),
        block_ms=ints(0, 8, B * D).reshape(B, D) / 4.0,
        block_param_bytes=ints(0, 8, B) * MB,
        block_peak_act_bytes=ints(0, 4, B) * MB,
        cut_bytes=ints(0, 6, B - 1) * 32,
        device_mem_bytes=ints(2, 50, D) * MB,
        bandwidth_bytes_per_ms=np.minimum(bw, bw.T),
        link_latency_ms=np.maximum(lat, lat.T),
        medium=draw(st.sampled_from(["switched", "shared"])),
    )


def as_tuples(sol: PipelineSolution):
    return [(s.lo, s.hi, s.device) for s in sol.stages]


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(problems())
def test_baselines_feasible_and_never_better_than_dp(problem):
    for objective in PIPELINE_OBJECTIVES:
        try:
            optimum = solve_pipeline(problem, objective)[0]
        except InfeasibleError:
            optimum = None
        for planner in BASELINES:
            try:
                result = planner(problem, objective)
            except InfeasibleError as err:
                assert "MB" in str(err) or "bandwidth" in str(err)
                continue
            assert isinstance(result, list) and len(result) == 1
            sol = result[0]
            assert isinstance(sol, PipelineSolution)
            assert problem.fits(sol.stages)
            assert sol == problem.evaluate(sol.stages)
            assert len({s.device for s in sol.stages}) == len(sol.stages)
            assert optimum is not None  # anything a baseline finds, the DP (a superset) finds too
            assert sol.key(objective) >= optimum.key(objective)


@SETTINGS
@given(problems())
def test_single_and_neurosurgeon_equal_brute_force(problem):
    for objective in PIPELINE_OBJECTIVES:
        for planner, max_stages in ((solve_single, 1), (solve_neurosurgeon, 2)):
            ref = brute_force(problem, objective, max_stages)
            if not ref:
                with pytest.raises(InfeasibleError, match="MB"):
                    planner(problem, objective)
                continue
            (sol,) = planner(problem, objective)
            assert sol.key(objective) == ref[0].key(objective)
            assert sol.stages == ref[0].stages  # same deterministic tie-break (stages tuple)


@SETTINGS
@given(problems(max_blocks=12, max_devices=5))
def test_even_uses_equal_shares(problem):
    B, D = problem.n_blocks, problem.n_devices
    n = min(B, D)
    bounds = even_boundaries(problem, n)
    size = problem.block_ms.mean(axis=1)
    prefix = np.concatenate([[0.0], np.cumsum(size)])
    assert bounds[0] == 0 and bounds[-1] == B and all(a < b for a, b in zip(bounds, bounds[1:]))
    for k in range(1, n):
        target = prefix[-1] * k / n
        lo, hi = bounds[k - 1] + 1, B - (n - k)  # every stage keeps at least one block
        best = min(abs(prefix[i] - target) for i in range(lo, hi + 1))
        assert abs(prefix[bounds[k]] - target) == best  # the nearest boundary to k/n of the total
    try:
        (sol,) = solve_even(problem, "latency")
    except InfeasibleError as err:
        assert "MB" in str(err)
        assert not problem.fits(tuple(StageChoice(bounds[k], bounds[k + 1], k) for k in range(n)))
        return
    assert as_tuples(sol) == [(bounds[k], bounds[k + 1], k) for k in range(n)]


def _problem(block_ms, mem, cut=None, bw=1e3, params=MB, act=MB, medium="switched"):
    block_ms = np.asarray(block_ms, dtype=np.float64)
    B, D = block_ms.shape
    return PipelineProblem(
        devices=tuple(f"dev{i}" for i in range(D)),
        block_ms=block_ms,
        block_param_bytes=np.full(B, params, dtype=np.int64),
        block_peak_act_bytes=np.full(B, act, dtype=np.int64),
        cut_bytes=np.full(B - 1, 100 if cut is None else cut, dtype=np.int64),
        device_mem_bytes=np.asarray(mem, dtype=np.int64),
        bandwidth_bytes_per_ms=np.full((D, D), bw),
        link_latency_ms=np.zeros((D, D)),
        medium=medium,
    )


def test_even_splits_equal_compute_in_list_order():
    problem = _problem([[1.0, 3.0]] * 4 + [[2.0, 6.0]] * 2, [100 * MB, 100 * MB])  # sizes 2,2,2,2,4,4
    (sol,) = solve_even(problem, "latency")
    assert as_tuples(sol) == [(0, 4, 0), (4, 6, 1)]  # 8 | 8 of the mean size, device order 0, 1


def test_even_with_fewer_blocks_than_devices_uses_the_first_ones():
    problem = _problem([[1.0] * 4] * 2, [100 * MB] * 4)
    (sol,) = solve_even(problem, "throughput")
    assert as_tuples(sol) == [(0, 1, 0), (1, 2, 1)]


def test_even_that_does_not_fit_raises():
    problem = _problem([[1.0, 1.0]] * 4, [10 * MB, 2 * MB])  # blocks 2..3 need 2 x 1 MB + 1 MB
    with pytest.raises(InfeasibleError, match=r"stage 1 \(blocks 2\.\.3\) needs 3\.0 MB"):
        solve_even(problem, "latency")


def test_single_picks_fastest_device_that_fits():
    problem = _problem([[1.0, 2.0, 3.0]] * 3, [3 * MB, 10 * MB, 10 * MB])  # dev0 is fastest but too small
    (sol,) = solve_single(problem, "latency")
    assert as_tuples(sol) == [(0, 3, 1)]
    with pytest.raises(InfeasibleError, match=r"needs 4\.0 MB .*offers 2\.0 MB"):
        solve_single(_problem([[1.0, 1.0]] * 3, [MB, 2 * MB]), "latency")


def test_neurosurgeon_splits_between_two_devices():
    block_ms = [[1.0, 9.0, 9.0], [9.0, 1.0, 9.0], [9.0, 9.0, 1.0]]
    problem = _problem(block_ms, [100 * MB] * 3, cut=0)
    (ns,) = solve_neurosurgeon(problem, "latency")
    assert len(ns.stages) == 2 and ns.latency_ms == 11.0
    (dp,) = solve_pipeline(problem, "latency")
    assert dp.latency_ms == 3.0  # three stages beat the best single split


def test_all_planners_share_one_interface():
    problem = _problem([[1.0, 2.0]] * 3, [100 * MB] * 2)
    for planner in (solve_pipeline, *BASELINES):
        for objective in PIPELINE_OBJECTIVES:
            out = planner(problem, objective)
            assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], PipelineSolution)
