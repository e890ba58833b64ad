"""Timing rounds of `edgec profile`: the fastest stable round of several, interleaved across the timings, a
time-based warm-up, and runs into bound buffers.  Scripted rounds, clocks and probes, so deterministic."""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnxruntime as ort
import pytest
import onnx
from onnx import helper, numpy_helper

from edgec.runtime.errors import InputError
from edgec.runtime.profile import kernels, tables
from edgec.runtime.profile.bench import (DRAM_ROUNDS, SPREAD_QUANTILE, SPREAD_ROUNDS, Bench, Job, other_cpus_over,
                                         pass_order)
from edgec.runtime.profile.load import CpuTimes, LoadSample
from edgec.runtime.profile.timing import (Policy, Series, bound_run, combine, measure_stable, model, session, settle, vi,
                                           warm_up)


def rnd(median_s: float, spread: float = 0.02, stable: bool = True, runs: int = 7) -> Series:
    return Series(median_s, spread, runs, 0.1, stable)


# --------------------------------------------------------------------------------------------------
# combine: the figure of a timing's rounds


def test_combine_keeps_the_fastest_stable_round_and_says_how_far_the_nearest_other_is():
    """The 2x round is another process sharing our core for a whole round: steady, so stable, but slow."""
    f = combine([rnd(2.0), rnd(1.0, spread=0.03), rnd(1.04), rnd(1.5)], max_spread=0.10)
    assert f.median_s == 1.0 and f.stable
    assert f.window_spread == 0.03 and f.rounds_apart == pytest.approx(0.04)
    assert f.spread == pytest.approx(0.04) and f.runs == 28 and f.round_medians == (2.0, 1.0, 1.04, 1.5)


def test_combine_a_fast_round_no_other_round_confirms_is_unstable():
    f = combine([rnd(1.0), rnd(1.3), rnd(1.35)], max_spread=0.10)
    assert f.median_s == 1.0 and not f.stable and f.spread == pytest.approx(0.3)


def test_combine_prefers_a_stable_round_to_a_faster_unstable_one():
    f = combine([rnd(0.6, spread=0.5, stable=False), rnd(1.0), rnd(1.05)], max_spread=0.10)
    assert f.median_s == 1.0 and f.stable and f.window_spread == 0.02


def test_combine_without_a_stable_round_takes_the_fastest_and_is_unstable():
    f = combine([rnd(1.2, 0.3, False), rnd(1.0, 0.2, False), rnd(1.01, 0.4, False)], max_spread=0.10)
    assert f.median_s == 1.0 and not f.stable and f.spread == 0.2


def test_combine_one_round_is_never_stable():
    f = combine([rnd(1.0, spread=0.0)], max_spread=0.10)
    assert not f.stable and math.isinf(f.rounds_apart)
    with pytest.raises(ValueError):
        combine([], max_spread=0.10)


def test_policy_needs_two_rounds_to_compare():
    with pytest.raises(ValueError):
        Policy(rounds=1)
    assert Policy(max_seconds=1.6, rounds=4).round_seconds == pytest.approx(0.4)


def test_measure_stable_honours_a_round_budget_shorter_than_max_seconds():
    now = itertools.count()
    values = iter([1.0, 2.0] * 50)
    s = measure_stable(lambda: next(values), Policy(window=3, max_seconds=10.0), lambda: next(now) * 0.1, seconds=0.5)
    assert not s.stable and s.runs == 5


# --------------------------------------------------------------------------------------------------
# Warm-up by time, not only by count


def test_warm_up_runs_until_both_the_count_and_the_time_are_reached():
    t = [0.0]
    calls = []

    def run():
        calls.append(t[0])
        t[0] += 0.004  # a 4 ms model

    assert warm_up(run, Policy(warmup=2, warmup_s=0.02), lambda: t[0]) == 5  # 5 x 4 ms reach 20 ms
    t[0], calls[:] = 0.0, []
    assert warm_up(run, Policy(warmup=3, warmup_s=0.0), lambda: t[0]) == 3


# --------------------------------------------------------------------------------------------------
# Runs into bound buffers


def _add_model(n) -> bytes:
    return model([helper.make_node("Add", ["a", "b"], ["y"])], [vi("a", (n,)), vi("b", (n,))], [vi("y", (n,))])


def test_bound_run_computes_into_buffers_allocated_once(monkeypatch):
    made = []
    real = ort.OrtValue.ortvalue_from_numpy

    def spy(array, *args):
        made.append(array)
        return real(array, *args)

    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy", staticmethod(spy))
    a, b = np.full(3, 2, np.float32), np.full(3, 3, np.float32)
    run = bound_run(session(_add_model(3), 1), {"a": a, "b": b})
    a[:] = 100  # the caller's arrays were copied: each session gets buffers of its own
    assert len(made) == 3  # a, b and y, bound once
    assert run() is None and run() is None  # no per-run output array
    assert len(made) == 3
    np.testing.assert_array_equal(made[-1], np.full(3, 5, np.float32))


def test_bound_run_binds_the_int8_kernels_uint8_output():
    """The int8 benchmarks (kernels.bench_conv_int8, bench_gemm_int8) end in a uint8 tensor: an io_binding
    limited to float outputs made every `edgec profile` fail on them."""
    q = [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(0, np.uint8), "z")]
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    data = model([node], [vi("x", (4,))], [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [4])], q)
    run = bound_run(session(data, 1), {"x": np.array([0.0, 0.1, 0.2, 1.0], np.float32)})
    assert run() is None


def test_bound_run_refuses_an_output_of_unknown_shape():
    with pytest.raises(ValueError, match="static float or 8-bit integer tensor"):
        bound_run(session(_add_model("n"), 1),
                  {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)})


# --------------------------------------------------------------------------------------------------
# Bench: rounds interleaved across timings


class QuietProbe:
    """2 CPUs; other processes use `others` CPUs; 100 jiffies of the machine per reading."""

    def __init__(self, others: float = 0.0):
        self.others, self.jiffies = others, 0

    def sample(self) -> LoadSample:
        self.jiffies += 100
        return LoadSample((0.5, 0.5, 0.5), CpuTimes(int(self.jiffies * self.others / 2), self.jiffies, 0, 2))


def scripted_bench(rounds_by_name: dict[str, list[Series]], strict: bool = False, retries: int = 0):
    calls: list[str] = []
    by_data = {name.encode(): name for name in rounds_by_name}
    left = {name: iter(r) for name, r in rounds_by_name.items()}

    def timer(data, feeds, threads, policy, opt):
        calls.append(by_data[data])
        return next(left[by_data[data]])

    b = Bench(1, True, Policy(rounds=3, retries=retries), QuietProbe(0.4), strict, lambda s: None, timer=timer)
    for name in rounds_by_name:
        b.add(name, name.encode(), {})
    return b, calls


def test_bench_interleaves_the_rounds_and_keeps_each_timings_fastest_stable_round():
    b, calls = scripted_bench({"a": [rnd(2.0), rnd(1.0), rnd(1.02)], "b": [rnd(0.5), rnd(0.5), rnd(0.51)]})
    assert b.run() == {"a": 1.0, "b": 0.5}
    assert calls == ["a", "b"] * 3  # round 1 of every timing, then round 2, ...
    assert b.entries["a"] == {"runs": 21, "rounds": 3, "median_ms": 1000.0, "spread": 0.02, "stable": True,
                              "loadavg_1m": 0.5, "other_cpus": 0.4}
    assert not b.unstable


def test_bench_warns_of_a_timing_whose_rounds_disagree_and_strict_refuses_it():
    script = {"a": [rnd(1.0), rnd(1.5), rnd(1.6)], "b": [rnd(0.5), rnd(0.5), rnd(0.5)]}
    b, _ = scripted_bench(script)
    b.run()
    assert not b.entries["a"]["stable"] and b.entries["a"]["spread"] == 0.5 and b.entries["b"]["stable"]
    (line,) = b.unstable
    assert line.startswith("1 thread, a: spread 50% over 21 runs") and "nearest other of 3 rounds 50% away" in line
    b, _ = scripted_bench(script, strict=True)
    with pytest.raises(InputError, match=r"^1 thread, a: spread 50% .*--strict"):
        b.run()


def test_bench_retries_only_the_unsettled_timings_interleaved_until_they_settle():
    # a's three rounds disagree (a burst of load), its fourth agrees with its fastest; c never settles and
    # gets every retry; b settled in its rounds and gets none
    script = {"a": [rnd(1.0), rnd(1.5), rnd(1.6), rnd(1.05)], "b": [rnd(0.5), rnd(0.5), rnd(0.51)],
              "c": [rnd(1.0), rnd(2.0), rnd(3.0), rnd(4.0), rnd(5.0)]}
    b, calls = scripted_bench(script, retries=2)
    times = b.run()
    assert calls == ["a", "b", "c"] * 3 + ["a", "c"] + ["c"]
    assert times == {"a": 1.0, "b": 0.5, "c": 1.0}
    assert b.entries["a"]["stable"] and b.entries["a"]["rounds"] == 4 and b.entries["a"]["spread"] == 0.05
    assert b.entries["b"]["rounds"] == 3
    assert not b.entries["c"]["stable"] and b.entries["c"]["rounds"] == 5
    (line,) = b.unstable
    assert line.startswith("1 thread, c: spread 100% over 35 runs") and "nearest other of 5 rounds" in line


def test_settle_takes_more_rounds_only_while_unstable_and_at_most_retries():
    taken = iter([rnd(1.0), rnd(1.5), rnd(1.04), rnd(9.0)])
    f = settle(lambda: next(taken), Policy(rounds=2, retries=3))
    assert f.stable and f.round_medians == (1.0, 1.5, 1.04)  # the third agreed: no fourth
    taken = iter([rnd(1.0), rnd(2.0), rnd(3.0), rnd(4.0)])
    f = settle(lambda: next(taken), Policy(rounds=2, retries=1))
    assert not f.stable and f.round_medians == (1.0, 2.0, 3.0)
    taken = iter([rnd(1.0), rnd(1.01)])
    assert settle(lambda: next(taken), Policy(rounds=2, retries=0)).round_medians == (1.0, 1.01)
    with pytest.raises(ValueError):
        Policy(retries=-1)


def test_settle_at_a_quantile_takes_that_round():
    """The runtime's figures (fixed.py) take the median round of theirs: not the fastest, a lucky moment."""
    taken = iter([rnd(1.04), rnd(1.0), rnd(1.08), rnd(1.02)])
    f = settle(lambda: next(taken), Policy(rounds=4, retries=0), quantile=0.5)
    assert f.median_s == 1.02 and f.stable  # nearest rank: the 2nd fastest of 4
    taken = iter([rnd(1.04), rnd(1.0), rnd(1.08), rnd(1.02)])
    assert settle(lambda: next(taken), Policy(rounds=4, retries=0)).median_s == 1.0


def test_pass_order_spreads_a_timings_rounds_through_the_pass_and_staggers_two_such_timings():
    jobs = [Job(n, b"", {}) for n in "abcdefghij"] + [Job(n, b"", {}, per_pass=3) for n in "MW"]
    assert "".join(j.name for j in pass_order(jobs)) == "MabWcdMeWfgMhiWj"
    assert "".join(j.name for j in pass_order([Job("M", b"", {}, per_pass=3)])) == "MMM"
    assert "".join(j.name for j in pass_order(jobs[:3])) == "abc"  # nothing spread: the order added


def test_bench_gives_a_spread_timing_k_rounds_per_pass_each_a_kth_of_the_time():
    calls: list[tuple[str, float]] = []

    def timer(data, feeds, threads, policy, opt):
        calls.append((data.decode(), policy.round_seconds))
        return rnd(1.0 if data == b"m" else 0.5)

    base = Policy(rounds=2, retries=0)
    b = Bench(1, True, base, QuietProbe(), False, lambda s: None, timer=timer)
    for name in "abcd":
        b.add(name, name.encode(), {})
    b.add("m", b"m", {}, per_pass=2)
    assert b.run()["m"] == 1.0
    assert "".join(c for c, _ in calls) == "ambcmd" * 2
    assert {t for c, t in calls if c == "m"} == {base.round_seconds / 2}
    assert {t for c, t in calls if c != "m"} == {base.round_seconds}
    assert b.entries["m"]["rounds"] == 4 and b.entries["a"]["rounds"] == 2
    with pytest.raises(ValueError, match="per_pass must be at least 1"):
        b.add("z", b"z", {}, per_pass=0)


def test_the_timings_that_follow_memory_traffic_are_the_spread_ones():
    """memory_gbps and weight_gbps get DRAM_ROUNDS rounds per pass, the op table (working sets beyond a core's
    L2) SPREAD_ROUNDS, and their figure is the round at SPREAD_QUANTILE; the compute-bound figures keep one
    round per pass, and the fastest."""
    b = Bench(1, True, Policy(rounds=2, retries=0), QuietProbe(), False, lambda s: None)
    for add in (kernels.bench_memory, kernels.bench_weights, kernels.bench_gemm_weights, tables.op_table, kernels.bench_conv,
                kernels.bench_gemm):
        add(b)
    per_pass = {j.name: j.per_pass for j in b.jobs}
    assert DRAM_ROUNDS > 1 and SPREAD_ROUNDS > 1
    assert per_pass["memory_gbps"] == per_pass["weight_gbps"] == per_pass["gemm_weight_gbps.chain"] == DRAM_ROUNDS
    assert per_pass["gemm_weight_gbps.one"] == 1  # its weights stay in cache: a compute-bound figure
    assert {v for n, v in per_pass.items() if n.startswith("op_ms_per_melem.")} == {SPREAD_ROUNDS}
    assert per_pass["gflops.conv"] == per_pass["gflops.gemm"] == 1
    quantiles = {j.name: j.quantile for j in b.jobs}
    assert quantiles["memory_gbps"] == quantiles["op_ms_per_melem.Softmax"] == SPREAD_QUANTILE > 0
    assert quantiles["gflops.conv"] == 0.0


def test_combine_at_a_quantile_takes_that_stable_round_by_nearest_rank():
    rounds = [rnd(t) for t in (1.0, 1.3, 1.1, 1.05, 1.2)] + [rnd(0.5, stable=False)]
    f = combine(rounds, 0.10, 0.25)  # the 2nd fastest of 5 stable rounds: 1 + floor(0.25 x 4)
    assert f.median_s == 1.05 and f.rounds_apart == pytest.approx(0.05 / 1.05) and f.stable
    assert combine(rounds, 0.10).median_s == 1.0  # the fastest stable one; the unstable 0.5 never counts
    assert combine(rounds, 0.10, 0.5).median_s == 1.1
    with pytest.raises(ValueError, match="quantile"):
        combine(rounds, 0.10, 1.0)


def test_bench_records_a_spread_timings_figure_at_the_quantile():
    times = iter([1.0, 1.2, 1.1, 1.3, 1.25, 1.15])

    def timer(data, feeds, threads, policy, opt):
        return rnd(next(times))

    b = Bench(1, True, Policy(rounds=3, retries=0), QuietProbe(), False, lambda s: None, timer=timer)
    b.add("m", b"m", {}, per_pass=2)
    assert b.run() == {"m": 1.1}  # 2nd fastest of 6: 1 + floor(0.25 x 5)
    assert b.entries["m"]["rounds"] == 6


class Companions:
    """A bench.Beside: its processes take 40 jiffies per round they run; the rounds come from `script`."""

    def __init__(self, script: list[Series]):
        self.script, self.ran, self.calls = iter(script), 0, []

    def timer(self, data, feeds, threads, policy, opt):
        self.calls.append(data)
        self.ran += 40
        return next(self.script)

    def jiffies(self) -> int:
        return self.ran

    def note(self) -> str:
        return "2 of 6 rounds left out"


def test_a_job_beside_other_processes_is_timed_by_them_their_cpu_counted_as_ours():
    """Its rounds go through the Beside's timer (the others' through the Bench's), at the job's own quantile,
    and the CPU time of the processes beside it is not other processes' load."""
    beside = Companions([rnd(t) for t in (1.0, 1.2, 1.1, 1.3, 1.25, 1.15)])
    b, calls = scripted_bench({"a": [rnd(1.0)] * 3})
    b.add("s", b"s", {}, per_pass=2, pick=0.75, beside=beside)
    assert b.run()["s"] == 1.2  # the 4th fastest of 6: 1 + floor(0.75 x 5)
    assert calls == ["a"] * 3 and len(beside.calls) == 6
    # QuietProbe: others take 0.4 of 2 CPUs (20 jiffies per 100); the companions' 40 per round are ours
    assert b.entries["a"]["other_cpus"] == 0.4 and b.entries["s"]["other_cpus"] == 0.0
    assert b.entries["s"]["rounds"] == 6 and b.entries["s"]["stable"]


def test_a_job_none_of_whose_rounds_counted_says_so_and_not_that_its_spread_was_large():
    beside = Companions([rnd(1.0, stable=False) for _ in range(3)])
    b, _ = scripted_bench({"a": [rnd(1.0) for _ in range(3)]})
    b.add("s", b"s", {}, beside=beside)
    b.run()
    assert b.unstable == ["1 thread, s: none of its 3 rounds was stable (21 runs in 0.3 s; other processes used "
                          "0.00 of 2 CPUs, load average 0.50 0.50 0.50; 2 of 6 rounds left out)"]
    assert b.unstable_names == ["s at 1 thr (no stable round)"]
    b, _ = scripted_bench({"a": [rnd(1.0) for _ in range(3)]}, strict=True)
    b.add("s", b"s", {}, beside=Companions([rnd(1.0, stable=False) for _ in range(3)]))
    with pytest.raises(InputError, match=r"^1 thread, s: none of its 3 rounds was stable .*2 of 6 rounds left out\); "):
        b.run()


def test_the_shared_rate_is_weight_gbps_times_the_median_ratio_of_the_pairs_that_contended():
    """Each shared round over the weight_gbps round of the same index (taken beside it), over the pairs whose
    shared round had its co-runners on the CPU, settled or not; the figure's ratio is the median of those that
    contended (a rate ratio at most UNCONTENDED) when there are `need` of them, else every pair's median. A
    common slowdown of both rounds of a pair (another tenant's traffic) cancels, and uncontended pairs (a phase
    in which the machine did not share its memory) do not move the figure."""
    from edgec.runtime.profile.shared import UNCONTENDED, pair_ratios, pick_ratio
    from edgec.runtime.profile.timing import Figure

    def fig(times, stable):
        return Figure(min(times), 0.01, 0.01, 0.0, tuple(times), 7 * len(times), 1.0, True, tuple(stable))

    solo = fig([1.0, 1.2, 1.0, 1.1, 1.0, 1.0], [True, True, True, False, True, True])  # the 4th did not settle
    shared = fig([2.0, 2.4, 1.0, 1.98, 1.05, 1.7], [True, False, True, True, True, True])  # nor this 2nd
    on_cpu = [True, True, False, True, True, True]  # the 3rd shared round had a co-runner off the CPU: left out
    assert UNCONTENDED == 0.7
    assert pair_ratios(shared, solo, on_cpu) == pytest.approx([1.05, 1.7, 1.8, 2.0, 2.0])
    # four contended (time ratio 1/0.7 or more): their median, (1.8 + 2.0) / 2; the uncontended 1.05 is out
    assert pick_ratio(pair_ratios(shared, solo, on_cpu), 4) == pytest.approx(1.9)
    # fewer than `need` contended: the median of every pair
    assert pick_ratio(pair_ratios(shared, solo, on_cpu), 5) == pytest.approx(1.8)
    assert pick_ratio([1.0, 1.1, 1.2], 1) == pytest.approx(1.1)  # none contended: every pair's median
    assert pair_ratios(shared, solo, [False] * 6) == [] and pick_ratio([], 1) is None  # no pair


def test_bench_refuses_a_name_added_twice():
    b, _ = scripted_bench({"a": [rnd(1.0)] * 3})
    with pytest.raises(ValueError, match="added twice"):
        b.add("a", b"x", {})


def test_other_cpus_over_sums_the_rounds_intervals():
    def s(busy, total, own):
        return LoadSample(None, CpuTimes(busy, total, own, 2))

    # 100 + 50 busy jiffies of others over 200 + 100 jiffies of 2 CPUs: 1.0 CPU on average
    assert other_cpus_over([(s(0, 0, 0), s(150, 200, 50)), (s(500, 1000, 60), s(560, 1100, 70))]) == pytest.approx(1.0)
    assert other_cpus_over([(s(0, 0, 0), s(0, 0, 0))]) is None
    assert other_cpus_over([(LoadSample(None, None), s(1, 2, 0))]) is None


def test_the_depthwise_rate_is_a_chains_time_beyond_one_conv():
    """gflops.depthwise_conv: DEPTHWISE_CHAIN convs less one alone, per conv (the layout conversions at a
    model's ends fall out); when the chain took no longer than one conv, the chain's time per conv, recorded as
    a warning (measurement.warnings), or with --strict a one-line error."""
    b = Bench(1, True, Policy(rounds=2, retries=0), QuietProbe(), False, lambda s: None)
    formula = kernels.bench_depthwise(b)
    chain, one = f"gflops.depthwise_conv.chain_{kernels.DEPTHWISE_CHAIN}", "gflops.depthwise_conv.chain_1"
    assert {j.name for j in b.jobs} == {chain, one}
    flops = 2 * 64 * 9 * 28 * 28  # quick: 64 channels on 28x28
    per_conv = 2e-5
    rate = formula({chain: 3e-5 + kernels.DEPTHWISE_CHAIN * per_conv, one: 3e-5 + per_conv})
    assert rate == pytest.approx(flops / per_conv / 1e9, rel=1e-9)
    assert not b.unstable and not b.unstable_names
    lower = formula({chain: 1e-4, one: 1e-4})
    assert lower == pytest.approx(kernels.DEPTHWISE_CHAIN * flops / 1e-4 / 1e9, rel=1e-9)
    assert len(b.unstable) == 1 and "5 depthwise convs took no longer than one" in b.unstable[0]
    assert b.unstable_names == ["gflops.depthwise_conv at 1 thr (chain no slower than one conv)"]
    strict = Bench(1, True, Policy(rounds=2, retries=0), QuietProbe(), True, lambda s: None)
    with pytest.raises(InputError, match="took no longer than one .*without --strict"):
        kernels.bench_depthwise(strict)({chain: 1e-4, one: 1e-4})
