"""`edgec profile` under load: the spread rule, busy detection (scripted timings and /proc readings, so
deterministic), --strict, and two back-to-back runs that must agree on a quiet machine.  Through measure_host,
the micro-benchmarks and the runtime's costs are scripted too (profile_scripted.py): what is tested is what the
profile decides from its timings and its load readings, on a busy machine as on an idle one."""

from __future__ import annotations

import itertools
import logging
import re

import pytest

from edgec.compiler.cluster import validate_profile_dict
from edgec.compiler.errors import UserError
from edgec.runtime.errors import InputError
from edgec.runtime.profile import drift
from edgec.runtime.profile import measure as measure_mod
from edgec.runtime.profile.measure import measure_host
from edgec.runtime.profile.load import (CpuTimes, LoadSample, is_busy, other_cpus, parse_loadavg, parse_proc_stat,
                                         parse_self_stat)
from edgec.runtime.profile.timing import Figure, Policy, measure_stable, spread
from tests.compiler.profile_scripted import script_runtime_costs, script_timings

# --------------------------------------------------------------------------------------------------
# The spread rule, with injected timings and an injected clock


def scripted(samples, step=0.01):
    """A sampler returning `samples` in turn, and a clock advancing `step` seconds per sample."""
    it = iter(samples)
    now = itertools.count()
    return (lambda: next(it)), (lambda: next(now) * step)


POLICY = Policy(max_spread=0.10, window=5, max_seconds=1.0, min_sample_s=0.0)


def test_spread_is_p90_minus_p10_over_median():
    assert spread([1.0] * 5) == 0
    assert spread([1.0, 1.0, 1.0, 1.0, 2.0]) == pytest.approx((1.6 - 1.0) / 1.0)


def test_stable_after_one_window_of_agreeing_samples():
    sample, clock = scripted([1.00, 1.02, 0.99, 1.01, 1.00] + [9.0] * 100)
    s = measure_stable(sample, POLICY, clock)
    assert s.stable and s.runs == 5 and s.median_s == 1.00 and s.spread < 0.1


def test_noisy_start_then_calm_stops_at_the_first_calm_window():
    noisy = [1.0, 3.0, 1.0, 2.5, 1.2, 4.0]
    sample, clock = scripted(noisy + [2.0, 2.01, 1.99, 2.0, 2.02] + [9.0] * 100)
    s = measure_stable(sample, POLICY, clock)
    assert s.stable and s.runs == len(noisy) + 5 and s.median_s == 2.0


def test_never_calm_gives_up_after_max_seconds_with_the_calmest_window():
    values = [1.0, 2.0, 1.0, 2.0, 1.0, 1.5, 1.6, 1.55, 1.9, 3.0] + [1.0, 3.0] * 50
    sample, clock = scripted(values, step=0.1)
    s = measure_stable(sample, POLICY, clock)
    assert not s.stable
    assert s.runs == 10  # the clock reads 0.1 s more after each sample: 1.0 s after the 10th
    # the calmest 5 in a row are [1.0, 1.5, 1.6, 1.55, 1.9]; every other window holds a 2.0 or a 3.0
    assert s.median_s == 1.55 and s.spread == pytest.approx(spread([1.0, 1.5, 1.6, 1.55, 1.9]))


def test_samples_slower_than_the_time_bound_are_judged_on_what_there_is():
    sample, clock = scripted([5.0, 5.1, 7.0, 9.0], step=0.6)
    s = measure_stable(sample, POLICY, clock)
    assert not s.stable and s.runs == 3 and s.median_s == 5.1


# --------------------------------------------------------------------------------------------------
# Busy detection from /proc text


PROC_STAT = """cpu  1000 50 300 8000 100 10 20 30 400 0
cpu0 500 25 150 4000 50 5 10 15 200 0
cpu1 500 25 150 4000 50 5 10 15 200 0
intr 12345
"""


def test_parse_proc_stat_counts_steal_not_guest():
    busy, total, cpus = parse_proc_stat(PROC_STAT)
    assert busy == 1000 + 50 + 300 + 10 + 20 + 30  # guest (400) is already inside user
    assert total == busy + 8000 + 100 and cpus == 2


def test_parse_self_stat_survives_a_command_name_with_spaces_and_parentheses():
    fields = ["S"] + [str(i) for i in range(4, 14)] + ["170", "30", "0", "0"] + ["0"] * 30
    assert parse_self_stat("4242 (my (odd) prog) " + " ".join(fields)) == 200


def test_reaped_children_count_as_the_profiles_own_cpu():
    """The runtime workers the profile starts (and reaps) to time the runtime's costs are not other load."""
    fields = ["S"] + [str(i) for i in range(4, 14)] + ["170", "30", "55", "45"] + ["0"] * 30
    assert parse_self_stat("4242 (python3) " + " ".join(fields)) == 300


def test_parse_loadavg():
    assert parse_loadavg("3.37 3.78 3.61 4/110 22790\n") == (3.37, 3.78, 3.61)


def sample_at(busy, total, own, cpus=2, loadavg=(0.5, 0.5, 0.5)):
    return LoadSample(loadavg, CpuTimes(busy, total, own, cpus))


def test_other_cpus_is_machine_busy_less_our_own_time():
    a, b = sample_at(100, 1000, 40), sample_at(400, 1200, 190)  # 300 busy jiffies, 150 of them ours, of 200
    assert other_cpus(a, b) == pytest.approx(150 / 200 * 2)
    assert other_cpus(a, sample_at(100, 1000, 40)) is None  # no jiffy elapsed: unknown, not zero
    assert other_cpus(a, sample_at(150, 1200, 120)) == 0  # rounding never gives a negative figure
    assert other_cpus(LoadSample(None, None), b) is None


@pytest.mark.parametrize("others, cpus, busy", [
    (None, 2, False), (0.0, 2, False), (0.2, 2, False), (0.21, 2, True), (1.5, 2, True), (0.35, 4, False),
    (0.41, 4, True),
])
def test_busy_rule_is_more_than_a_tenth_of_the_machine(others, cpus, busy):
    assert is_busy(others, cpus) is busy


class ScriptedProbe:
    """A load probe whose machine's other processes use `others` CPUs of 2, always; our process is idle."""

    def __init__(self, others: float):
        self.others, self.jiffies, self.waits = others, 0, []

    def sample(self) -> LoadSample:
        self.jiffies += 100  # 100 jiffies of the whole machine (2 CPUs) between readings
        return sample_at(int(self.jiffies * self.others / 2), self.jiffies, 0, 2, (3.2, 2.9, 2.5))

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def scripted_timings(monkeypatch):
    """measure_host on scripted micro-benchmarks and runtime costs (profile_scripted.py)."""
    script_timings(monkeypatch)
    script_runtime_costs(monkeypatch)


def test_strict_refuses_a_busy_machine_before_measuring():
    probe = ScriptedProbe(1.3)
    with pytest.raises(InputError) as ei:
        measure_host(quick=True, threads=1, strict=True, probe=probe)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("the machine is busy: other processes used 1.30 of 2 CPUs")
    assert "load average 3.20 2.90 2.50" in msg and "--strict" in msg
    assert len(probe.waits) == 1  # refused after the idle look, before any benchmark


def test_busy_machine_without_strict_warns_and_says_so_in_the_profile(caplog, scripted_timings):
    with caplog.at_level(logging.INFO, logger="edgec.runtime.profile"):
        p = measure_host(quick=True, threads=1, probe=ScriptedProbe(0.9))
    busy = [r.getMessage() for r in caplog.records if "busy" in r.getMessage() and r.levelno == logging.WARNING]
    assert len(busy) == 2 and "0.90 of 2 CPUs" in busy[0] and all(len(b) <= 100 for b in busy)
    said = [r.getMessage() for r in caplog.records if "busy" in r.getMessage() and r.levelno == logging.INFO]
    assert "before profiling" in said[0] and "while profiling" in said[1]  # the whole text: with --verbose
    load = p["measurement"]["load"]
    assert load["verdict"] == "busy" and load["before"]["other_cpus"] == 0.9 and load["during"]["other_cpus"] == 0.9
    # shared_weight_gbps takes its co-runners' CPU (read from /proc, not from the probe) off its others
    assert all(t["other_cpus"] == 0.9 for name, t in p["measurement"]["threads"][1].items()
               if name != "shared_weight_gbps")


def test_quiet_machine_has_no_load_warning(caplog, scripted_timings):
    with caplog.at_level(logging.WARNING, logger="edgec.runtime.profile"):
        p = measure_host(quick=True, threads=1, probe=ScriptedProbe(0.1))
    assert not [r for r in caplog.records if "busy" in r.getMessage()]
    assert p["measurement"]["load"]["verdict"] == "quiet"


def test_strict_refuses_a_timing_whose_spread_stays_large(scripted_timings):
    """A spread of 1e-9 is out of reach: --strict stops at the first timing that misses it, after its time bound
    (scripted samples never agree to 1e-9: the first timing of the pass; timed for real, the 200-Relu chain's runs
    could read the same on the clock three times in a row, and the 1-Relu timing after it was refused)."""
    impossible = Policy(max_spread=1e-9, window=3, max_seconds=0.05, rounds=2, min_sample_s=0.0, warmup=1)
    with pytest.raises(InputError) as ei:
        measure_host(quick=True, threads=1, strict=True, policy=impossible, probe=ScriptedProbe(0.0))
    msg = str(ei.value)
    assert "\n" not in msg and re.match(r"1 thread, op_overhead_us.relu_chain_200: spread \d+% over \d+ runs", msg), msg
    assert "stayed above 0%" in msg and "other processes used" in msg


def test_unstable_timings_without_strict_are_one_warning(caplog, scripted_timings):
    impossible = Policy(max_spread=1e-9, window=3, max_seconds=0.01, rounds=2, min_sample_s=0.0, warmup=1)
    with caplog.at_level(logging.INFO, logger="edgec.runtime.profile"):
        p = measure_host(quick=True, threads=1, policy=impossible, probe=ScriptedProbe(0.0))
    (short,) = [r.getMessage() for r in caplog.records
                if "spread stayed above" in r.getMessage() and r.levelno == logging.WARNING]
    assert len(short) <= 100 and short.endswith("(more with --verbose)")
    (line,) = [r.getMessage() for r in caplog.records  # the whole text, which --verbose prints
               if "spread stayed above" in r.getMessage() and r.levelno == logging.INFO]
    timings = p["measurement"]["threads"][1]
    # Scripted samples never agree to 1e-9: every timing is unstable (timed for real, a sub-microsecond timing can
    # repeat to the nanosecond, spread exactly 0, within even this policy)
    unstable = [name for name, t in timings.items() if not t["stable"]]
    assert unstable == list(timings)
    unstable += [name for name, t in p["measurement"]["runtime"].items() if not t["stable"]]  # the runtime's costs
    assert f"for {len(unstable)} timings; " in line and "gflops.conv at 1 thr" in line
    # warnings of their own: a memory rate that moved between the halves of the pass (drift.py), and too few of
    # shared_weight_gbps' pairs contending for memory, which depends on the moment (shared.py; its rounds count
    # whether or not they settled, so this policy does not leave it without pairs)
    # and, on a loaded machine, shared_weight_gbps left out when a co-runner was off the CPU in every round
    own = ("memory rate moved", "pairs contended for memory", "shared_weight_gbps not written")
    assert len([w for w in p["measurement"]["warnings"] if not any(o in w for o in own)]) == len(unstable)


# --------------------------------------------------------------------------------------------------
# The machine's memory rate over each pass (drift.py): memory_gbps' rounds in halves

def rounds_of(ms, stable=None):
    """A memory_gbps Figure of rounds taking `ms` milliseconds each, in the order taken."""
    times = tuple(t / 1e3 for t in ms)
    return Figure(median_s=min(times), spread=0.01, window_spread=0.01, rounds_apart=0.01, round_medians=times,
                  runs=10 * len(times), seconds=1.0, stable=True,
                  round_stable=tuple(stable) if stable is not None else (True,) * len(times))


def test_halves_pick_each_halfs_fastest_quarter():
    # 100 MB per run: 2 ms is 50 GB/s; the first half's fastest quarter (nearest rank, 6 rounds: the 2nd fastest)
    # is 2.0 ms, the second half's 2.5 ms
    d = drift.halves(rounds_of([1.9, 2.0, 2.2, 2.4, 2.6, 2.8, 2.4, 2.5, 2.6, 2.8, 3.0, 3.2]), 100_000_000)
    assert (d.first_gbps, d.second_gbps, d.rounds) == (pytest.approx(50.0), pytest.approx(40.0), 12)
    assert d.moved == pytest.approx(-0.2)
    assert d.entry() == {"first_gbps": 50.0, "second_gbps": 40.0, "moved": -0.2, "rounds": 12}
    # unstable rounds do not count where a half has stable ones; a half of none counts all of its own
    d = drift.halves(rounds_of([1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0], [False] + [True] * 3 + [False] * 4),
                     100_000_000)
    assert (d.first_gbps, d.second_gbps) == (pytest.approx(50.0), pytest.approx(50.0))
    assert drift.halves(rounds_of([2.0, 2.0, 2.0]), 100_000_000) is None  # too few to halve


def test_the_limit_is_ten_percent_either_way():
    for first, second, over in ((100, 110, False), (100, 110.2, True), (100, 90, False), (100, 89.8, True)):
        warnings = []
        drift.check_drift(drift.MemoryDrift(first, second, 24), 1, False, warnings)
        assert bool(warnings) is over, (first, second)


@pytest.mark.parametrize("first, second, said", [(40.0, 46.0, "+15%"), (46.0, 40.0, "-13%")])
def test_a_memory_rate_that_moved_is_a_warning_and_strict_refuses_it(caplog, monkeypatch, first, second, said,
                                                                    scripted_timings):
    """Through measure_host: the halves scripted, and the timings they come from (profile_scripted.py)."""
    monkeypatch.setattr(measure_mod, "halves", lambda f, b: drift.MemoryDrift(first, second, len(f.round_medians)))
    with caplog.at_level(logging.INFO, logger="edgec.runtime.profile"):
        p = drift_profile()
    (w,) = [w for w in p["measurement"]["warnings"] if "memory rate" in w]
    assert w.startswith(f"1 thread: the machine's memory rate moved by {said} while profiling (memory_gbps' rounds "
                        f"{first:g} GB/s in the first half of the pass, {second:g} in the second")
    assert "memory_gbps, weight_gbps, gemm_weight_gbps and shared_weight_gbps were timed while it moved" in w
    assert "gemm_weight_gbps by more (2.7 times as much as the memory rate" in w
    said_at = {level: [r.getMessage() for r in caplog.records if "memory rate" in r.getMessage() and r.levelno == level]
               for level in (logging.WARNING, logging.INFO)}
    (short,) = said_at[logging.WARNING]  # one short line; the whole text under --verbose
    assert len(short) <= 100 and short.endswith("(more with --verbose)") and w.startswith(short.split(" (more")[0])
    assert said_at[logging.INFO] == [w]
    entry = p["measurement"]["memory_drift"][1]
    assert entry["moved"] == pytest.approx(second / first - 1, abs=1e-3) and entry["rounds"] >= drift.MIN_ROUNDS
    with pytest.raises(InputError) as ei:
        drift_profile(strict=True)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"1 thread: the machine's memory rate moved by {said} while profiling")
    assert "without --strict" in msg


CALM = Policy(max_spread=5.0, window=3, max_seconds=0.05, rounds=2, retries=0, min_sample_s=0.0, warmup=1)


def drift_profile(**kw):
    return measure_host(quick=True, threads=1, policy=CALM, probe=ScriptedProbe(0.0), runtime_costs=False,
                        shared_weights=False, **kw)


def test_every_pass_records_its_memory_halves(scripted_timings):
    """A quick profile at 1 and 2 threads (scripted timings): each count's entry, consistent with itself, typed."""
    p = measure_host(quick=True, threads=[1, 2], policy=CALM, probe=ScriptedProbe(0.0), runtime_costs=False,
                     shared_weights=False)
    drifts = p["measurement"]["memory_drift"]
    assert sorted(drifts) == [1, 2]
    for n, d in drifts.items():
        assert d["first_gbps"] > 0 and d["second_gbps"] > 0
        assert d["moved"] == pytest.approx(d["second_gbps"] / d["first_gbps"] - 1, abs=0.01)
        assert d["rounds"] == p["measurement"]["threads"][n]["memory_gbps"]["rounds"]
    assert any(s.startswith("measurement.memory_drift: ") for s in p["sources"])
    assert validate_profile_dict(p, "p.yaml").measurement["memory_drift"][1]["rounds"] == drifts[1]["rounds"]


def test_a_bad_memory_drift_is_one_line_naming_it():
    doc = {"name": "x", "memory_mb": 1024, "usable_memory_fraction": 0.8, "runtime_overhead_mb": 100,
           "op_overhead_us": 5, "gflops": {"conv": 10, "depthwise_conv": 5, "gemm": 10, "other": 2}, "memory_gbps": 5}
    good = {"first_gbps": 40, "second_gbps": 46, "moved": 0.15, "rounds": 24}
    assert validate_profile_dict({**doc, "measurement": {"memory_drift": {1: good}}}, "x.yaml") is not None
    for key, bad in (("first_gbps", 0), ("second_gbps", "fast"), ("moved", -1.5), ("moved", float("nan")),
                     ("rounds", 0), ("rounds", 2.5)):
        with pytest.raises(UserError) as ei:
            validate_profile_dict({**doc, "measurement": {"memory_drift": {1: {**good, key: bad}}}}, "x.yaml")
        msg = str(ei.value)
        assert msg.startswith("x.yaml: ") and key in msg and "\n" not in msg
    for bad in ({1: {**good, "when": 3}}, {0: good}, {}, [good]):
        with pytest.raises(UserError, match="memory_drift"):
            validate_profile_dict({**doc, "measurement": {"memory_drift": bad}}, "x.yaml")
