"""Timing until stable: repeat a micro-benchmark until its spread is small, in several independent rounds,
and keep the fastest; or give up after a bounded time.

One *sample* is the mean time of one model run over enough back-to-back runs to last `min_sample_s`
(a tiny model is repeated, so the timer's and the scheduler's granularity do not dominate).  A *round*
creates a fresh session with its inputs and outputs bound to buffers allocated once (`bound_run`: the
Python binding would otherwise allocate and copy every output on every run, and that cost depends on the
process's allocator state: fresh pages or reused ones, which is what made memory_gbps and the depthwise
conv differ by ~20% between two processes while each process agreed with itself), warms it up for at
least `warmup` runs and `warmup_s` seconds (first-run allocations, caches), then takes samples until the
last `window` of them agree:

  spread = (p90 - p10) / median   over the last `window` samples

at most `max_spread`, or the round's share of `max_seconds` passes (then its calmest window, marked
unstable).  A round's figure is its window's median.

`rounds` rounds per timing, which the caller interleaves with the other timings' rounds so that they are
seconds apart and each sees another session, memory placement and moment (`combine`): the figure is the
fastest stable round's (other load only ever adds time, so the fastest stable stretch is the machine's
own speed, and the first round also absorbs the process's ramp-up: clock frequency, lazily loaded code).
The timings that follow the machine's memory traffic take many shorter rounds spread through the profile, and
their figure is the stable round at the fastest quarter instead (bench.py SPREAD_QUANTILE): there the fastest
round is a lucky moment of the other tenants' traffic that the next profile may not see.
Its spread is the larger of that round's window spread and how far the nearest other round lies from it:
two independent rounds must agree for the figure to count as stable, since the spread within one run
understates the difference between two runs.

A timing still unstable after its `rounds` gets up to `retries` more, one at a time, later (after the other
timings' rounds, or the other unsettled ones'), while it stays unstable: a burst of load that spoiled
several of its rounds has then passed more often than not.  On this machine, on a noisy afternoon, 17 of a
profile's timings ended unstable, and its GEMM figure 23% below the next profile's.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from edgec.runtime.errors import InputError
from edgec.runtime.providers import CPU

__all__ = ["Policy", "DEFAULT", "QUICK", "Series", "Figure", "spread", "measure_stable", "combine", "settle", "warm_up",
           "time_model", "measure_with", "session", "bound_run", "model", "vi", "rand", "sample_fn", "sig"]

_IR_VERSION = 8  # opset 17 needs IR >= 8; old enough for any onnxruntime >= 1.14
_OPSET = 17


@dataclass(frozen=True)
class Policy:
    max_spread: float = 0.10  # the target: two runs within 10%
    window: int = 7
    max_seconds: float = 1.6  # per timed figure, all its rounds together
    rounds: int = 4  # at least 2: one round cannot show that a second one agrees
    retries: int = 2  # more rounds, at most, for a timing the `rounds` left unstable
    max_runs: int = 400  # per round: a guard for a clock that does not advance
    min_sample_s: float = 0.004
    warmup: int = 2  # per round, and at least warmup_s seconds
    warmup_s: float = 0.02
    # A CPU quota throttles this process (quota.py): a sample's runs are counted over a first min_sample_s
    # stretch, however many, so that every sample spans that long (a run timed alone may have stalled)
    long_samples: bool = False
    # The runtime's timings (fixed.py) under a CPU share below a core: the one CPU their processes run on
    cpu: int | None = None

    def __post_init__(self):
        if (not (0 < self.max_spread < 10) or self.window < 3 or self.max_seconds <= 0 or self.rounds < 2
                or self.retries < 0 or self.max_runs < self.window or self.warmup < 0 or self.warmup_s < 0):
            raise ValueError(f"invalid timing policy {self}")

    @property
    def round_seconds(self) -> float:
        return self.max_seconds / self.rounds


DEFAULT = Policy()
QUICK = Policy(window=5, max_seconds=0.2, rounds=2, retries=0, min_sample_s=0.001, warmup=1, warmup_s=0.0)


@dataclass(frozen=True)
class Series:
    median_s: float  # the figure's time: median of the chosen window
    spread: float  # (p90 - p10) / median of that window
    runs: int  # samples taken in all
    seconds: float  # wall time spent sampling
    stable: bool  # spread <= max_spread


@dataclass(frozen=True)
class Figure:
    """A timing over several rounds (`combine`)."""

    median_s: float  # the fastest stable round's median (the fastest round's, when none is stable)
    spread: float  # max(window_spread, rounds_apart): what `stable` is judged on
    window_spread: float  # that round's window spread
    rounds_apart: float  # |nearest other round's median - median_s| / median_s; inf with one round
    round_medians: tuple[float, ...]  # every round's, in the order taken
    runs: int  # samples over all rounds
    seconds: float  # sampling time over all rounds
    stable: bool
    round_stable: tuple[bool, ...] = ()  # whether each round was, in the order taken


def spread(samples: list[float]) -> float:
    med = statistics.median(samples)
    if med <= 0:
        return math.inf
    p10, p90 = np.percentile(samples, [10, 90])
    return float(p90 - p10) / med


def measure_stable(sample: Callable[[], float], policy: Policy, clock: Callable[[], float] = time.perf_counter,
                   seconds: float | None = None) -> Series:
    """Call `sample` (seconds of one run) until the last `policy.window` samples have a spread of at most
    `policy.max_spread`, or `seconds` (default `policy.max_seconds`) have passed (then: the calmest window,
    unstable)."""
    w = policy.window
    limit = policy.max_seconds if seconds is None else seconds
    samples: list[float] = []
    start = clock()
    while True:
        samples.append(sample())
        elapsed = clock() - start
        if len(samples) < w:
            if elapsed < limit or len(samples) < 3:
                continue
            # too slow for a full window within the time: judge what there is
            return Series(statistics.median(samples), spread(samples), len(samples), elapsed, False)
        last = spread(samples[-w:])
        if last <= policy.max_spread:
            return Series(statistics.median(samples[-w:]), last, len(samples), elapsed, True)
        if elapsed >= limit or len(samples) >= policy.max_runs:
            best = min(range(len(samples) - w + 1), key=lambda i: spread(samples[i:i + w]))
            win = samples[best:best + w]
            return Series(statistics.median(win), spread(win), len(samples), elapsed, False)


def combine(rounds: list[Series], max_spread: float, quantile: float = 0.0) -> Figure:
    """The figure of a timing's rounds: the fastest stable round (module docstring), stable when that round
    is and another round lies within max_spread of it (a lone round cannot show that: never stable).

    With `quantile` q > 0: the stable round at that quantile of their times instead (nearest rank: the
    (1 + floor(q x (n - 1)))-th fastest of n), for a timing of many rounds whose fastest is a lucky moment that
    the next profile may not see (bench.py SPREAD_QUANTILE)."""
    if not rounds:
        raise ValueError("combine needs at least one round")
    if not 0 <= quantile < 1:
        raise ValueError(f"quantile must be in [0, 1), got {quantile}")
    candidates = sorted([r for r in rounds if r.stable] or rounds, key=lambda r: r.median_s)
    best = candidates[math.floor(quantile * (len(candidates) - 1))]
    apart = math.inf
    if best.median_s > 0:
        apart = min((abs(r.median_s - best.median_s) / best.median_s for r in rounds if r is not best), default=apart)
    total = max(best.spread, apart)
    return Figure(median_s=best.median_s, spread=total, window_spread=best.spread, rounds_apart=apart,
                  round_medians=tuple(r.median_s for r in rounds), runs=sum(r.runs for r in rounds),
                  seconds=sum(r.seconds for r in rounds), stable=best.stable and apart <= max_spread,
                  round_stable=tuple(r.stable for r in rounds))


def settle(take_round: Callable[[], Series], policy: Policy, quantile: float = 0.0) -> Figure:
    """`combine` (at `quantile`) of policy.rounds rounds of `take_round`, then of up to policy.retries more,
    taken one at a time while the figure is unstable: for a timing measured alone (the caller cannot
    interleave it)."""
    rounds = [take_round() for _ in range(policy.rounds)]
    figure = combine(rounds, policy.max_spread, quantile)
    for _ in range(policy.retries):
        if figure.stable:
            break
        rounds.append(take_round())
        figure = combine(rounds, policy.max_spread, quantile)
    return figure


# --------------------------------------------------------------------------------------------------
# Models and sessions


def model(nodes, inputs, outputs, inits=()) -> bytes:
    g = helper.make_graph(nodes, "bench", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="edgec-profile")
    m.ir_version = _IR_VERSION
    return m.SerializeToString()


def vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


# The execution providers every micro-benchmark session runs (`edgec profile --providers`; measure_host sets them
# for its run and puts the CPU's back after): one profile run per process, as `edgec profile` is.
_providers: list[str] = [CPU]
_plain: list[bool] = [False]  # plain runs even on the CPU provider (bound_run)


def measure_with(providers: list[str], plain: bool = False) -> None:
    """The providers the next sessions are created with (in order; the CPU's alone by default), and whether
    CPU-provider sessions are timed in plain runs too (bound_run)."""
    _providers[:] = providers
    _plain[0] = plain


def session(data: bytes, threads: int, opt=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = opt
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(data, so, providers=list(_providers))
    lost = [p for p in _providers if p not in sess.get_providers()]
    if lost:  # never a CPU figure under another provider's name
        raise InputError(f"--providers: onnxruntime did not register {lost[0]} for a benchmark session "
                         f"(it has {', '.join(sess.get_providers())})")
    return sess


# the benchmarks' output types: float, and the int8 kernels' (QLinearConv, QLinearMatMul) uint8
_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}


def bound_run(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
    """One inference per call, its inputs and outputs bound to buffers allocated here, once: the timing is
    then the kernels' alone, as inside a model (whose tensors live in onnxruntime's arena), without the
    Python binding's per-run output allocation and copy.  The inputs are copied, so every session gets
    buffers of its own (another placement in memory). Under another provider than the CPU's, plain runs: with
    onnxruntime-openvino 1.24.1, a 8x512 MatMul run through an io_binding to numpy outputs corrupts the heap
    ("corrupted double-linked list", checked 2026-11-29), and its outputs are the provider's to allocate anyway.
    Plain runs on the CPU provider too where measure_with says so: the `cpu:` figures of a profile measured with
    an accelerator are timed as its other figures are, and in onnxruntime-openvino 1.24.1's build a CPU-only
    profile timed through io_bindings crashed (a segmentation fault in a later session's creation, 2026-11-29)."""
    if _plain[0] or sess.get_providers()[0] != CPU:
        fed = {name: np.array(array, copy=True) for name, array in feeds.items()}
        return lambda: sess.run(None, fed)
    io = sess.io_binding()
    for name, array in feeds.items():
        io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.array(array, copy=True)))
    for out in sess.get_outputs():
        if out.type not in _NUMPY_TYPES or not all(isinstance(d, int) for d in out.shape):
            raise ValueError(f"benchmark output {out.name!r} must be a static float or 8-bit integer tensor, got {out.type} {out.shape}")
        buf = np.empty(out.shape, _NUMPY_TYPES[out.type])
        io.bind_ortvalue_output(out.name, ort.OrtValue.ortvalue_from_numpy(buf))
    return lambda: sess.run_with_iobinding(io)


def warm_up(run: Callable[[], None], policy: Policy, clock: Callable[[], float] = time.perf_counter) -> int:
    """Run at least policy.warmup times and for at least policy.warmup_s seconds: a count alone is over in
    microseconds for a tiny model, before caches and branch predictors have settled.  Returns the runs."""
    start, n = clock(), 0
    while n < policy.warmup or clock() - start < policy.warmup_s:
        run()
        n += 1
    return n


def sample_fn(run: Callable[[], None], policy: Policy) -> Callable[[], float]:
    """Warm `run` up, then return a sampler: seconds per run, averaged over enough runs to last
    policy.min_sample_s (at least one; with policy.long_samples, as many as the first such stretch held)."""
    warm_up(run, policy)
    t0 = time.perf_counter()
    run()
    reps = 1
    if policy.long_samples:
        while time.perf_counter() - t0 < policy.min_sample_s:
            run()
            reps += 1
    else:
        one = max(time.perf_counter() - t0, 1e-7)
        reps = max(1, min(1000, math.ceil(policy.min_sample_s / one)))

    def sample() -> float:
        t = time.perf_counter()
        for _ in range(reps):
            run()
        return (time.perf_counter() - t) / reps

    return sample


def time_model(data: bytes, feeds: dict[str, np.ndarray], threads: int, policy: Policy,
               opt=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> Series:
    """One round: a fresh session of the model, bound buffers, warm-up, samples until stable or the round's
    share of the time bound."""
    sampler = sample_fn(bound_run(session(data, threads, opt), feeds), policy)
    return measure_stable(sampler, policy, seconds=policy.round_seconds)


def sig(x: float, digits: int = 3) -> float:
    """Round to `digits` significant figures: measured figures carry no more precision than that."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))
