"""Scripted timings for `edgec profile`: its deciding code (the figures' formulas, stable or not, the load
verdicts, the warnings, `measurement:`, the YAML) on fixed numbers, with nothing of this machine timed.

The README's test command runs on busy 2-core machines, where a real timing is whatever the other tenants
leave: a test that checks the profile's logic feeds it these instead. What truly measures the machine (the
quick profile's own figures, co-runners on the CPU) is marked `slow` (CI runs it on an idle machine) or lives
in tests/bench.

`script_timings(monkeypatch)` makes every micro-benchmark round (bench.Bench's timer, shared.py's co-runner
rounds) a `measure_stable` over scripted samples and a scripted clock, so the timing policy still decides
when a round is stable (an impossible policy leaves every round unstable); `script_runtime_costs` does the
same for the runtime's costs (fixed.py), whose formulas then run on those figures.
"""

from __future__ import annotations

import functools
import itertools

from edgec.runtime.profile import bench, fixed, measure, shared
from edgec.runtime.profile.quota import CpuQuota
from edgec.runtime.profile.timing import Figure, Policy, Series, combine, measure_stable

__all__ = ["JITTER", "SHARED_SLOWDOWN", "scripted_timer", "shared_timer", "script_timings", "script_runtime_costs", "RUNTIME_MS", "NO_QUOTA"]

# Relative deviations of the samples, in turn: (p90 - p10) / median of any 5 in a row is 3.2%, within the
# default policy's 10%, never within an impossible one's.
JITTER = (0.0, 0.02, -0.02, 0.01, -0.01)
CLOCK_STEP_S = 0.002  # the scripted clock's advance per sample: a round bound of 0.025 s is 13 samples
NO_QUOTA = CpuQuota(None, None, "scripted: no cgroup limit", 1.0)


def seconds_per_run(data: bytes, feeds: dict, threads: int) -> float:
    """A fixed time for one run of a benchmark model: 10 us, plus its weights and inputs at 1 GB/s, shared
    by its threads. Larger models take longer, as every figure's formula expects (a chain of 200 Relus beside
    one, a chain of convolutions beside one pair)."""
    size = len(data) + sum(a.nbytes for a in feeds.values())
    return (1e-5 + size * 1e-9) / threads


def _series(run_s: float, policy: Policy, seconds: float | None = None) -> Series:
    samples = itertools.cycle([run_s * (1 + j) for j in JITTER])
    now = itertools.count()
    return measure_stable(lambda: next(samples), policy, lambda: next(now) * CLOCK_STEP_S,
                          seconds=policy.round_seconds if seconds is None else seconds)


def scripted_timer(data: bytes, feeds: dict, threads: int, policy: Policy, opt) -> Series:
    """A bench.Timer: one round of scripted samples, judged by `measure_stable` under `policy`."""
    return _series(seconds_per_run(data, feeds, threads), policy)


# A round of weight_gbps' MatMul beside the co-runners takes this much longer than alone: every pair contends
# for memory (shared.UNCONTENDED), at 1 / 1.6 of the rate alone (this machine's profiles: 22-30 GB/s against 44).
SHARED_SLOWDOWN = 1.6


def shared_timer(data: bytes, feeds: dict, threads: int, policy: Policy, opt) -> Series:
    """A co-runner round (shared.CoRunners.time_model): scripted, SHARED_SLOWDOWN times a round alone."""
    return _series(seconds_per_run(data, feeds, threads) * SHARED_SLOWDOWN, policy)


def script_timings(monkeypatch, timer=scripted_timer, beside=shared_timer, co_runners_on_cpu: bool = True) -> None:
    """Every Bench that measure_host makes times with `timer`, and shared_weight_gbps' rounds beside its
    co-runners with `beside`. The co-runner processes still start, pause and stop for real; with
    `co_runners_on_cpu` their CPU time (CoRunners._ran_s) is scripted too, a second per reading, so that every
    round counts them on the CPU, as on an idle machine (a scripted round lasts microseconds, in which a real
    co-runner shows no CPU time)."""
    monkeypatch.setattr(measure, "Bench", functools.partial(bench.Bench, timer=timer))
    monkeypatch.setattr(shared, "time_model", beside)
    # the machine's own CPU share is not scripted away by the timer: a scripted profile sees no quota (quota.py)
    monkeypatch.setattr(measure, "see_quota", lambda quick: NO_QUOTA)
    if co_runners_on_cpu:
        ran = itertools.count()
        monkeypatch.setattr(shared.CoRunners, "_ran_s", lambda self: float(next(ran)))


# The runtime's figures (fixed.py), in ms: a small and a large message, a run in a plan and alone, a request,
# and the CPU of a request with each message and of a bare one.
RUNTIME_MS = {"message_small": 0.2, "message_large": 1.2, "run_in_plan": 1.3, "run_alone": 1.0, "request": 0.75,
              "cpu_small": 4.0, "cpu_large": 5.0, "cpu_request": 0.4}


def _figure(ms: float, policy: Policy) -> Figure:
    return combine([_series(ms / 1e3, policy) for _ in range(policy.rounds)], policy.max_spread)


def script_runtime_costs(monkeypatch, ms: dict[str, float] = RUNTIME_MS) -> None:
    """fixed.measure_runtime_costs' timings scripted (no worker is started): its formulas and notes run on
    Figures of `ms`, each judged by the policy it is given."""
    def figures(*names):
        return lambda policy, *_: {n: _figure(ms[n], policy) for n in names}

    monkeypatch.setattr(fixed, "_message_figures", figures("message_small", "message_large"))
    monkeypatch.setattr(fixed, "_run_figures", figures("run_in_plan", "run_alone"))
    monkeypatch.setattr(fixed, "_request_figure", lambda policy, *_: _figure(ms["request"], policy))
    monkeypatch.setattr(fixed, "_cpu_figures", figures("cpu_small", "cpu_large", "cpu_request"))
