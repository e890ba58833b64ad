"""solve_pipeline: the layer-graph DP equals brute force over every partition x every injective device
assignment, for both objectives and both media, including the top-k list; plus hand-made cases."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgec.compiler.plan.baselines import solve_single
from edgec.compiler.plan.pipeline_dp import solve_pipeline
from edgec.compiler.plan.pipeline_problem import solution_sort_key
from pipeline_reference import brute_force
from edgec.compiler.plan.pipeline_problem import PIPELINE_OBJECTIVES, PipelineProblem, PipelineSolution
from edgec.compiler.plan.planner import InfeasibleError

MB = 1_000_000


def make_problem(block_ms, params, act, cut, mem, bw, lat=None, medium="switched") -> PipelineProblem:
    block_ms = np.asarray(block_ms, dtype=np.float64)
    D = block_ms.shape[1]
    return PipelineProblem(
        devices=tuple(f"dev{i}" for i in range(D)),
        block_ms=block_ms,
        block_param_bytes=np.asarray(params, dtype=np.int64),
        block_peak_act_bytes=np.asarray(act, dtype=np.int64),
        cut_bytes=np.asarray(cut, dtype=np.int64).reshape(-1),
        device_mem_bytes=np.asarray(mem, dtype=np.int64),
        bandwidth_bytes_per_ms=np.asarray(bw, dtype=np.float64),
        link_latency_ms=np.zeros((D, D)) if lat is None else np.asarray(lat, dtype=np.float64),
        medium=medium,
    )


@st.composite
def problems(draw, dyadic: bool = True, max_blocks: int = 7, max_devices: int = 4):
    """Small random problems. Dyadic values (k/4 ms, power-of-two bandwidths, k/8 ms latencies) make
    every sum exact in floating point, so the DP and brute force can be compared for equality,
    tie-breaks included. Devices are drawn from a few kinds, so identical copies occur too."""
    B = draw(st.integers(1, max_blocks))
    D = draw(st.integers(1, max_devices))
    kinds = draw(st.lists(st.integers(0, D - 1), min_size=D, max_size=D))
    nk = D
    if dyadic:
        col = np.array(draw(st.lists(st.integers(0, 8), min_size=B * nk, max_size=B * nk))).reshape(B, nk) / 4.0
        bw_k = 2.0 ** np.array(draw(st.lists(st.integers(3, 8), min_size=nk * nk, max_size=nk * nk))).reshape(nk, nk)
        lat_k = np.array(draw(st.lists(st.integers(0, 3), min_size=nk * nk, max_size=nk * nk))).reshape(nk, nk) / 8.0
        cut = np.array(draw(st.lists(st.integers(0, 6), min_size=B - 1, max_size=B - 1)), dtype=np.int64) * 32
    else:
        fl = st.floats(0.0, 10.0, allow_nan=False, allow_infinity=False)
        col = np.array(draw(st.lists(fl, min_size=B * nk, max_size=B * nk))).reshape(B, nk)
        bw_k = np.array(draw(st.lists(st.floats(1.0, 1e3), min_size=nk * nk, max_size=nk * nk))).reshape(nk, nk)
        lat_k = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=nk * nk, max_size=nk * nk))).reshape(nk, nk)
        cut = np.array(draw(st.lists(st.integers(0, 5000), min_size=B - 1, max_size=B - 1)), dtype=np.int64)
    # links: symmetric (no asymmetric pairs) but heterogeneous; identical kinds get identical links
    bw_k = np.minimum(bw_k, bw_k.T)
    lat_k = np.maximum(lat_k, lat_k.T)
    kinds = np.array(kinds)
    params = np.array(draw(st.lists(st.integers(0, 8), min_size=B, max_size=B))) * MB
    act = np.array(draw(st.lists(st.integers(0, 4), min_size=B, max_size=B))) * MB
    mem_k = np.array(draw(st.lists(st.integers(2, 40), min_size=nk, max_size=nk))) * MB
    medium = draw(st.sampled_from(["switched", "shared"]))
    problem = make_problem(
        col[:, kinds], params, act, cut, mem_k[kinds], bw_k[np.ix_(kinds, kinds)], lat_k[np.ix_(kinds, kinds)], medium
    )
    if draw(st.booleans()):  # machines shared by devices (`hosts:`): alike devices on different ones are not alike
        hosts = draw(st.lists(st.sampled_from([None, "a", "b"]), min_size=D, max_size=D))
        problem = replace(problem, traits=tuple(hosts))
    return problem


def keys(solutions, objective):
    return [s.key(objective) for s in solutions]


def check_solution(problem: PipelineProblem, sol: PipelineSolution) -> None:
    stages = sol.stages
    assert stages[0].lo == 0 and stages[-1].hi == problem.n_blocks
    assert all(a.hi == b.lo for a, b in zip(stages, stages[1:]))
    assert all(s.lo < s.hi for s in stages)
    assert len({s.device for s in stages}) == len(stages)
    assert problem.fits(stages)
    assert sol == problem.evaluate(stages)


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(problems(), st.sampled_from([None, None, 1, 2, 3]))
def test_dp_equals_brute_force(problem, max_stages):
    for objective in PIPELINE_OBJECTIVES:
        ref = brute_force(problem, objective, max_stages)
        if not ref:
            with pytest.raises(InfeasibleError, match="MB"):
                solve_pipeline(problem, objective, max_stages=max_stages)
            continue
        best = solve_pipeline(problem, objective, max_stages=max_stages)
        assert len(best) == 1
        assert best[0].key(objective) == ref[0].key(objective)
        top = solve_pipeline(problem, objective, top_k=3, max_stages=max_stages)
        assert keys(top, objective) == keys(ref[:3], objective)
        assert top == sorted(top, key=lambda s: solution_sort_key(s, objective))
        assert len({s.stages for s in top}) == len(top)
        assert top[0].key(objective) == best[0].key(objective)
        for sol in top:
            check_solution(problem, sol)
            assert max_stages is None or len(sol.stages) <= max_stages


def _like(problem: PipelineProblem, r: int, d: int) -> bool:
    """Whether devices r and d are interchangeable: same column, memory, request costs and traits (machine), and
    the links of every device to and from them unchanged when they swap."""
    if problem.device_mem_bytes[r] != problem.device_mem_bytes[d]:
        return False
    if not np.array_equal(problem.block_ms[:, r], problem.block_ms[:, d]):
        return False
    if any(x is not None and x[r] != x[d] for x in (problem.request_in_ms, problem.request_out_ms, problem.traits)):
        return False
    perm = list(range(problem.n_devices))
    perm[r], perm[d] = d, r
    return all(np.asarray(m)[i, j] == np.asarray(m)[perm[i], perm[j]]
               for m in (problem.bandwidth_bytes_per_ms, problem.link_latency_ms)
               for i in range(problem.n_devices) for j in range(problem.n_devices) if i != j)


def _canonical(problem: PipelineProblem, stages) -> tuple:
    """The placement with each group of interchangeable devices used lowest index first, in stage order."""
    groups = [min(r for r in range(d + 1) if r == d or _like(problem, r, d)) for d in range(problem.n_devices)]
    members = {g: [d for d in range(problem.n_devices) if groups[d] == g] for g in set(groups)}
    used = {g: 0 for g in members}
    out = []
    for s in stages:
        g = groups[s.device]
        out.append((s.lo, s.hi, members[g][used[g]]))
        used[g] += 1
    return tuple(out)


@SETTINGS
@given(problems(), st.sampled_from([None, 2]))
def test_without_copies_the_top_k_are_distinct_up_to_swapping_like_devices(problem, max_stages):
    """copies=False (what plan_pipeline asks): the k best placements once each placement that only swaps
    interchangeable devices is dropped, each as its canonical member: brute force, deduplicated."""
    for objective in PIPELINE_OBJECTIVES:
        ref = brute_force(problem, objective, max_stages)
        if not ref:
            continue
        seen, classes = set(), []
        for sol in ref:
            c = _canonical(problem, sol.stages)
            if c not in seen:
                seen.add(c)
                classes.append(sol)
        got = solve_pipeline(problem, objective, top_k=3, max_stages=max_stages, copies=False)
        assert keys(got, objective) == keys(classes[:3], objective)
        assert [tuple((s.lo, s.hi, s.device) for s in sol.stages) for sol in got] == \
            [_canonical(problem, sol.stages) for sol in got]
        assert len({_canonical(problem, sol.stages) for sol in got}) == len(got)
        for sol in got:
            check_solution(problem, sol)


def test_two_like_devices_give_three_splits_without_copies():
    """Two identical devices: the exact top 3 is a split, its mirror and one more split; without copies, three
    splits."""
    problem = make_problem([[1.0] * 2] * 4, [MB] * 4, [MB] * 4, [64, 32, 64], [100 * MB] * 2, np.full((2, 2), 64.0))
    for objective in PIPELINE_OBJECTIVES:
        exact = solve_pipeline(problem, objective, top_k=3)
        assert len({tuple((s.lo, s.hi) for s in sol.stages) for sol in exact}) == 2
        distinct = solve_pipeline(problem, objective, top_k=3, copies=False)
        assert len({tuple((s.lo, s.hi) for s in sol.stages) for sol in distinct}) == 3
        assert distinct[0].key(objective) == exact[0].key(objective)


@st.composite
def problems_with_requests(draw):
    """`problems` whose devices pay the runtime's per-request cost (dyadic: sums stay exact)."""
    problem = draw(problems())
    D = problem.n_devices
    r_in = np.array(draw(st.lists(st.integers(0, 8), min_size=D, max_size=D))) / 8.0
    r_out = np.array(draw(st.lists(st.integers(0, 8), min_size=D, max_size=D))) / 8.0
    return replace(problem, request_in_ms=r_in, request_out_ms=r_out)


def _priced_directly(problem: PipelineProblem, stages) -> tuple[float, float]:
    """(latency, period of the first and last stage's device), with the per-request costs added by hand."""
    compute = [float(problem.block_ms[s.lo:s.hi, s.device].sum()) for s in stages]
    compute[0] += problem.request_in_ms[stages[0].device]
    compute[-1] += problem.request_out_ms[stages[-1].device]
    transfers = [problem.transfer_ms(a.hi - 1, a.device, b.device) for a, b in zip(stages, stages[1:])]
    return sum(compute) + sum(transfers), max(compute)


@SETTINGS
@given(problems_with_requests())
def test_dp_with_request_costs_equals_brute_force(problem):
    """The runtime's per-request costs enter the first stage's and the last stage's time (latency and
    period) in the DP exactly as in brute force."""
    for objective in PIPELINE_OBJECTIVES:
        ref = brute_force(problem, objective)
        if not ref:
            continue
        top = solve_pipeline(problem, objective, top_k=3)
        assert keys(top, objective) == keys(ref[:3], objective)
        for sol in top:
            check_solution(problem, sol)
            latency, period = _priced_directly(problem, sol.stages)
            assert sol.latency_ms == latency
            assert sol.bottleneck_ms >= period


def test_request_costs_move_the_first_stage_off_a_slow_host():
    """Device 0 computes faster but takes 10 ms to take a request: the DP starts on device 1."""
    problem = make_problem([[1.0, 2.0], [1.0, 2.0]], [0, 0], [0, 0], [0], [10**9, 10**9], [[1.0, 1.0], [1.0, 1.0]])
    plain = solve_pipeline(problem, "latency")[0]
    assert [s.device for s in plain.stages] == [0]
    costly = replace(problem, request_in_ms=np.array([10.0, 0.0]), request_out_ms=np.zeros(2))
    best = solve_pipeline(costly, "latency")[0]
    assert best.stages[0].device == 1 and best.latency_ms == pytest.approx(4.0 if len(best.stages) == 1 else 3.0)


@SETTINGS
@given(problems())
def test_never_worse_than_best_single_device(problem):
    for objective in PIPELINE_OBJECTIVES:
        try:
            single = solve_single(problem, objective)[0]
        except InfeasibleError:
            continue
        best = solve_pipeline(problem, objective)[0]
        assert best.key(objective) <= single.key(objective)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(dyadic=False, max_blocks=6))
def test_general_floats_match_brute_force_up_to_rounding(problem):
    """Arbitrary floats: same objective values as brute force up to rounding (ties may resolve
    differently when sums differ only in the last bits)."""
    for objective in PIPELINE_OBJECTIVES:
        ref = brute_force(problem, objective)
        if not ref:
            with pytest.raises(InfeasibleError, match="MB"):
                solve_pipeline(problem, objective)
            continue
        top = solve_pipeline(problem, objective, top_k=3)
        assert len(top) == min(3, len(ref))
        for got, want in zip(top, ref):
            assert got.key(objective)[0] == pytest.approx(want.key(objective)[0], rel=1e-9, abs=1e-9)
            check_solution(problem, got)


def test_top_k_lists_every_placement_when_few_exist():
    problem = make_problem([[1.0, 2.0], [3.0, 1.0]], [MB] * 2, [MB] * 2, [64], [10 * MB] * 2, np.full((2, 2), 64.0))
    for objective in PIPELINE_OBJECTIVES:
        ref = brute_force(problem, objective)
        got = solve_pipeline(problem, objective, top_k=50)
        assert len(got) == len(ref) == 4  # 2 single-device plans + 1 cut x 2 device orders
        assert keys(got, objective) == keys(ref, objective)


# ----------------------------------------------------------------------------------------------------
# hand-made cases


def test_best_plan_uses_devices_out_of_list_order():
    # dev1 is fast on the first half, dev0 on the second half; cheap links
    block_ms = [[9.0, 1.0], [9.0, 1.0], [1.0, 9.0], [1.0, 9.0]]
    problem = make_problem(block_ms, [MB] * 4, [MB] * 4, [100] * 3, [100 * MB] * 2, np.full((2, 2), 1e4))
    for objective in PIPELINE_OBJECTIVES:
        (best,) = solve_pipeline(problem, objective)
        assert [(s.lo, s.hi, s.device) for s in best.stages] == [(0, 2, 1), (2, 4, 0)]
        assert best.latency_ms == pytest.approx(4.0 + 100 / 1e4)


def test_three_devices_in_reverse_order():
    block_ms = [[9.0, 9.0, 1.0], [9.0, 1.0, 9.0], [1.0, 9.0, 9.0]]
    problem = make_problem(block_ms, [MB] * 3, [MB] * 3, [0, 0], [100 * MB] * 3, np.full((3, 3), 1e3))
    (best,) = solve_pipeline(problem, "latency")
    assert [s.device for s in best.stages] == [2, 1, 0]
    assert best.latency_ms == 3.0


def test_memory_limit_forces_a_split():
    # the fast device alone would be best, but the model does not fit on any single device
    block_ms = [[1.0, 5.0], [1.0, 5.0], [1.0, 4.0]]
    params, act = [30 * MB] * 3, [2 * MB] * 3
    problem = make_problem(block_ms, params, act, [1000, 1000], [70 * MB, 70 * MB], np.full((2, 2), 1e3))
    with pytest.raises(InfeasibleError, match="MB"):
        solve_single(problem, "latency")
    (best,) = solve_pipeline(problem, "latency")
    assert len(best.stages) == 2
    assert [(s.lo, s.hi, s.device) for s in best.stages] == [(0, 2, 0), (2, 3, 1)]
    assert problem.fits(best.stages)
    # with room for everything the fast device wins alone
    roomy = make_problem(block_ms, params, act, [1000, 1000], [200 * MB, 70 * MB], np.full((2, 2), 1e3))
    assert [(s.lo, s.hi, s.device) for s in solve_pipeline(roomy, "latency")[0].stages] == [(0, 3, 0)]


def test_slow_link_makes_one_device_best():
    # two equal devices: splitting halves the bottleneck unless the link is slow
    block_ms = [[4.0, 4.0]] * 4
    fast = make_problem(block_ms, [MB] * 4, [MB] * 4, [1000] * 3, [100 * MB] * 2, np.full((2, 2), 1e4))
    slow = make_problem(block_ms, [MB] * 4, [MB] * 4, [1000] * 3, [100 * MB] * 2, np.full((2, 2), 10.0))
    (split,) = solve_pipeline(fast, "throughput")
    assert len(split.stages) == 2 and split.bottleneck_ms == 8.0
    (alone,) = solve_pipeline(slow, "throughput")
    assert len(alone.stages) == 1 and alone.bottleneck_ms == 16.0  # a split would pay 100 ms on the link


def test_shared_medium_sums_transfers():
    # three equal devices; each cut costs 5 ms. Switched: 3 stages (max(4, 5) = 5) beat 2 stages (6).
    # Shared: 3 stages pay 10 ms on the one channel, so 2 stages (max(6, 5) = 6) win.
    block_ms = [[2.0] * 3] * 6
    args = ([MB] * 6, [MB] * 6, [500] * 5, [100 * MB] * 3, np.full((3, 3), 100.0))
    switched = make_problem(block_ms, *args, medium="switched")
    shared = make_problem(block_ms, *args, medium="shared")
    (a,) = solve_pipeline(switched, "throughput")
    (b,) = solve_pipeline(shared, "throughput")
    assert (len(a.stages), a.bottleneck_ms) == (3, 5.0)
    assert (len(b.stages), b.bottleneck_ms) == (2, 6.0)
    assert b.key("throughput") == brute_force(shared, "throughput")[0].key("throughput")


def test_identical_devices_top_k_lists_relabelled_copies():
    problem = make_problem([[1.0] * 3] * 4, [MB] * 4, [MB] * 4, [0] * 3, [100 * MB] * 3, np.full((3, 3), 64.0))
    for objective in PIPELINE_OBJECTIVES:
        got = solve_pipeline(problem, objective, top_k=5)
        assert keys(got, objective) == keys(brute_force(problem, objective)[:5], objective)
        assert len({s.stages for s in got}) == 5


def test_max_stages_bounds_the_split():
    block_ms = [[2.0] * 4] * 8
    problem = make_problem(block_ms, [MB] * 8, [MB] * 8, [0] * 7, [100 * MB] * 4, np.full((4, 4), 1e3))
    for m in (1, 2, 3):
        (best,) = solve_pipeline(problem, "throughput", max_stages=m)
        assert len(best.stages) == m
    with pytest.raises(InfeasibleError, match="MB"):
        solve_pipeline(make_problem(block_ms, [MB] * 8, [MB] * 8, [0] * 7, [5 * MB] * 4, np.ones((4, 4))), "latency",
                      max_stages=1)


def test_infeasible_messages_name_sizes():
    big_block = make_problem(
        [[1.0, 1.0]] * 2, [100 * MB, 10 * MB], [5 * MB] * 2, [1], [50 * MB, 60 * MB], np.ones((2, 2))
    )
    with pytest.raises(InfeasibleError, match=r"block 0 .*105\.0 MB.*largest device \(dev1\) offers 60\.0 MB"):
        solve_pipeline(big_block, "latency")
    too_small = make_problem([[1.0, 1.0]] * 3, [30 * MB] * 3, [2 * MB] * 3, [1, 1], [40 * MB, 40 * MB], np.ones((2, 2)))
    with pytest.raises(InfeasibleError, match=r"needs at least 92\.0 MB .*offer 80\.0 MB in total \(largest dev0, 40\.0 MB"):
        solve_pipeline(too_small, "throughput")


def test_rejects_bad_arguments():
    problem = make_problem([[1.0]], [MB], [MB], [], [10 * MB], np.ones((1, 1)))
    with pytest.raises(ValueError):
        solve_pipeline(problem, "speed")
    with pytest.raises(ValueError):
        solve_pipeline(problem, "latency", top_k=0)
    with pytest.raises(ValueError):
        solve_pipeline(problem, "latency", max_stages=0)


def test_the_shared_mediums_pareto_labels_have_a_budget(monkeypatch):
    """Over pipeline_pareto.LABEL_BUDGET labels the shared medium's Pareto DP refuses in one line naming the
    size (the planner then goes on as beyond its state budget); within it, the plans are the exact ones."""
    from edgec.compiler.plan import pipeline_pareto

    problem = make_problem([[1.0, 1.0, 2.0], [2.0, 1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 1.0, 1.0]], [0] * 4, [0] * 4,
                           [64, 64, 64], [10**9] * 3, np.full((3, 3), 64.0), medium="shared")
    want = keys(brute_force(problem, "throughput")[:3], "throughput")
    assert keys(solve_pipeline(problem, "throughput", top_k=3), "throughput") == want
    monkeypatch.setattr(pipeline_pareto, "LABEL_BUDGET", 2)
    with pytest.raises(InfeasibleError) as err:
        solve_pipeline(problem, "throughput", top_k=3)
    assert "\n" not in str(err.value) and "Pareto DP would keep more than 2 labels" in str(err.value)
