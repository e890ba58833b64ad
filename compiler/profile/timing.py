"""Timing until stable: repeat a micro-benchmark until its spread is small, or give up after a bounded time.

One *sample* is the mean time of one model run over enough back-to-back runs to last `min_sample_s`
(a tiny model is repeated, so the timer's and the scheduler's granularity do not dominate).  Samples are
taken until the last `window` of them agree:

  spread = (p90 - p10) / median   over the last `window` samples

at most `max_spread`.  The figure is then that window's median.  When `max_seconds` pass first, the
figure comes from the calmest window seen (the least spread; a disturbance only ever adds time, so the
calmest stretch is the best estimate of the machine's own speed), marked unstable with its spread.
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

__all__ = ["Policy", "DEFAULT", "QUICK", "Series", "spread", "measure_stable", "session", "model", "vi", "rand",
           "sample_fn", "sig"]

_IR_VERSION = 8  # opset 17 needs IR >= 8; old enough for any onnxruntime >= 1.14
_OPSET = 17


@dataclass(frozen=True)
class Policy:
    max_spread: float = 0.10  # the target: two runs within 10%
    window: int = 7
    max_seconds: float = 1.5  # per timed figure
    max_runs: int = 400  # a guard for a clock that does not advance
    min_sample_s: float = 0.004
    warmup: int = 2

    def __post_init__(self):
        if not (0 < self.max_spread < 10) or self.window < 3 or self.max_seconds <= 0 or self.max_runs < self.window:
            raise ValueError(f"invalid timing policy {self}")


DEFAULT = Policy()
QUICK = Policy(window=5, max_seconds=0.2, min_sample_s=0.001, warmup=1)


@dataclass(frozen=True)
class Series:
    median_s: float  # the figure's time: median of the chosen window
    spread: float  # (p90 - p10) / median of that window
    runs: int  # samples taken in all
    seconds: float  # wall time spent sampling
    stable: bool  # spread <= max_spread


def spread(samples: list[float]) -> float:
    med = statistics.median(samples)
    if med <= 0:
        return math.inf
    p10, p90 = np.percentile(samples, [10, 90])
    return float(p90 - p10) / med


def measure_stable(sample: Callable[[], float], policy: Policy, clock: Callable[[], float] = time.perf_counter) -> Series:
    """Call `sample` (seconds of one run) until the last `policy.window` samples have a spread of at most
    `policy.max_spread`, or `policy.max_seconds` have passed (then: the calmest window, unstable)."""
    w = policy.window
    samples: list[float] = []
    start = clock()
    while True:
        samples.append(sample())
        elapsed = clock() - start
        if len(samples) < w:
            if elapsed < policy.max_seconds or len(samples) < 3:
                continue
            # too slow for a full window within the time: judge what there is
            return Series(statistics.median(samples), spread(samples), len(samples), elapsed, False)
        last = spread(samples[-w:])
        if last <= policy.max_spread:
            return Series(statistics.median(samples[-w:]), last, len(samples), elapsed, True)
        if elapsed >= policy.max_seconds or len(samples) >= policy.max_runs:
            best = min(range(len(samples) - w + 1), key=lambda i: spread(samples[i:i + w]))
            win = samples[best:best + w]
            return Series(statistics.median(win), spread(win), len(samples), elapsed, False)


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


def session(data: bytes, threads: int, opt=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = opt
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def sample_fn(sess: ort.InferenceSession, feeds: dict, policy: Policy) -> Callable[[], float]:
    """Warm the session up, then return a sampler: seconds per run, averaged over enough runs to last
    policy.min_sample_s (at least one)."""
    for _ in range(policy.warmup):
        sess.run(None, feeds)
    t0 = time.perf_counter()
    sess.run(None, feeds)
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, min(1000, math.ceil(policy.min_sample_s / one)))

    def sample() -> float:
        t = time.perf_counter()
        for _ in range(reps):
            sess.run(None, feeds)
        return (time.perf_counter() - t) / reps

    return sample


def sig(x: float, digits: int = 3) -> float:
    """Round to `digits` significant figures: measured figures carry no more precision than that."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))
