"""Micro-benchmarks at one intra-op thread count: the figures of one `threads:` entry of a profile.

Three steps (`measure_figures`): every benchmark model is added to a Bench (`Bench.add`), the Bench times
them all (`Bench.run`), then the figures are computed from the times.  Timing them all together lets the
rounds interleave: round 1 of every model, then round 2 of every model, ..., so that a model's rounds are
seconds apart, and a burst of load or a slow moment of the process spoils at most one of them
(timing.combine keeps the fastest stable round).  Each timing leaves a measurement entry (runs, median,
spread, stable, the load meanwhile).  What each figure is: see the package docstring.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from edgec.compiler.errors import UserError

from .load import LoadProbe, LoadSample, describe_load
from .timing import Figure, Policy, Series, combine, model, rand, sig, time_model, vi

__all__ = ["Bench", "Job", "measure_figures", "OP_TABLE_OPS", "CONV_HEIGHTS", "GEMM_ROWS", "MAX_EFFICIENCY",
           "blocked_layout"]

# A tile faster per FLOP than the large benchmark is possible (cache), but not by more than this; a larger
# ratio means the tile's time was all per-operator overhead, where the cost model's overhead term rules.
MAX_EFFICIENCY = 4.0
CONV_HEIGHTS = (56, 28, 14, 7, 4, 2, 1)
GEMM_ROWS = (512, 256, 128, 64, 32, 16, 8)
# 7x7: each Conv's FLOPs take ~2 us, so the per-node overhead is about a third of the chain's extra time and
# errors of a few % in the conv rate subtracted from it move it by a few %; at 28x28 it was ~5% of it, and
# a 2% error in the conv rate moved it by ~40% between two profiles.
_CHAIN_PAIRS, _CHAIN_CH, _CHAIN_HW = 50, 16, 7
_ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL

Times = dict[str, float]  # timing name -> seconds per run
Formula = Callable[[Times], float]  # a figure from the times


@dataclass(frozen=True)
class Job:
    name: str
    data: bytes  # the serialized model
    feeds: dict[str, np.ndarray]
    opt: ort.GraphOptimizationLevel = _ALL
    per_pass: int = 1  # rounds in each pass over the models, spread through it (`pass_order`)
    pick: float | None = None  # which stable round gives the figure (timing.combine's quantile); None: `quantile`
    beside: "Beside | None" = None  # processes its rounds run beside (shared.py's co-runners)

    @property
    def quantile(self) -> float:
        """Which stable round gives the figure (timing.combine): `pick` if given, else the fastest, or for a
        spread timing the one at SPREAD_QUANTILE."""
        if self.pick is not None:
            return self.pick
        return SPREAD_QUANTILE if self.per_pass > 1 else 0.0


# Timings that read beyond the core's own caches (DRAM, or the last-level cache the machine's other tenants
# share) move with those tenants' memory traffic and with where their buffers land in memory, which the load
# check cannot see (it is not CPU time).  Timed here as a profile times them (a fresh session per round),
# alternating for 200 s: memory_gbps 23-40 GB/s, weight_gbps 15-25, in phases of seconds to tens of seconds
# and from round to round.  They get more rounds per pass, spread through it, each as much shorter (same time
# in all), and their figure is the round at the fastest quarter (SPREAD_QUANTILE), not the fastest: over that
# run's 337 pairs of back-to-back 26 s windows, the figures of the two windows differed by more than 10%
#   4 rounds, the fastest (as before):        memory_gbps 40 pairs, weight_gbps 91
#   12 rounds, the fastest:                             22             64
#   24 rounds, the fastest:                              6             37
#   24 rounds, the fastest quarter's (nearest rank):    12             23
# The op table's (0.4-1.6 MB working sets, beyond a core's L2) moved less: 12 rounds.
DRAM_ROUNDS = 6
SPREAD_ROUNDS = 3
SPREAD_QUANTILE = 0.25


# One round of one model: (model, feeds, threads, policy, optimisation level) -> its Series; tests script it.
Timer = Callable[[bytes, dict, int, Policy, ort.GraphOptimizationLevel], Series]


class Beside(Protocol):
    """Processes a job's rounds run beside (shared.CoRunners): `timer` times its rounds (resuming them around
    each), `jiffies` is their CPU time so far (counted as this process's own in the job's load; None where
    unreadable), and `note` goes into the warning of the job's figure when it is unstable."""

    timer: Timer

    def jiffies(self) -> int | None: ...

    def note(self) -> str: ...


class Bench:
    """Collects models (`add`), then times them all in interleaved rounds (`run`), recording each timing
    under its name in `entries`."""

    def __init__(self, threads: int, quick: bool, policy: Policy, probe: LoadProbe, strict: bool,
                 progress: Callable[[str], None], timer: Timer = time_model):
        self.threads, self.quick, self.policy, self.probe, self.strict = threads, quick, policy, probe, strict
        self.say = progress
        self.timer = timer
        self.rng = np.random.default_rng(0)  # fixed: the same inputs and weights in every profile
        self.jobs: list[Job] = []
        self.entries: dict[str, dict] = {}
        self.figures: dict[str, Figure] = {}  # each timing's, once run
        self.unstable: list[str] = []  # one line per timing whose spread stayed large
        self.unstable_names: list[str] = []  # "<timing> at <threads> thr (<spread>)" for the one-line warning

    def add(self, name: str, data: bytes, feeds: dict, opt=_ALL, per_pass: int = 1, *, pick: float | None = None,
            beside: Beside | None = None) -> None:
        """A model to time under `name`; `per_pass` > 1: that many shorter rounds in each pass, spread through
        it (for the timings that follow the machine's memory traffic: DRAM_ROUNDS, SPREAD_ROUNDS). `pick`,
        `beside`: see Job."""
        if any(j.name == name for j in self.jobs):
            raise ValueError(f"benchmark {name!r} added twice")
        if per_pass < 1:
            raise ValueError(f"benchmark {name!r}: per_pass must be at least 1, got {per_pass}")
        self.jobs.append(Job(name, data, feeds, opt, per_pass, pick, beside))

    def run(self) -> Times:
        """Seconds per run of every added model: policy.rounds rounds, each a pass over all models in the
        order added, then up to policy.retries passes over those still unstable (timing.py), combined per
        model by timing.combine.  An unstable timing is refused with strict (the
        first in that order), else a warning."""
        rounds: dict[str, list[Series]] = {j.name: [] for j in self.jobs}
        spans: dict[str, list[tuple[LoadSample, LoadSample]]] = {j.name: [] for j in self.jobs}
        # a job of k rounds per pass has the same time in all as any other: each round is 1/k as long
        policies = {j.name: self.policy if j.per_pass == 1 else
                    replace(self.policy, max_seconds=self.policy.max_seconds / j.per_pass) for j in self.jobs}

        def one_round(job: Job) -> None:
            before = self._sample(job)
            timer = job.beside.timer if job.beside else self.timer
            rounds[job.name].append(timer(job.data, job.feeds, self.threads, policies[job.name], job.opt))
            spans[job.name].append((before, self._sample(job)))

        for _ in range(self.policy.rounds):
            for job in pass_order(self.jobs):
                one_round(job)
        for _ in range(self.policy.retries):  # timing.py: the unsettled timings' extra rounds, interleaved
            unsettled = [j for j in self.jobs if not combine(rounds[j.name], self.policy.max_spread, j.quantile).stable]
            if not unsettled:
                break
            for job in pass_order(unsettled):
                one_round(job)
        return {job.name: self._record(job, combine(rounds[job.name], self.policy.max_spread, job.quantile),
                                       spans[job.name]) for job in self.jobs}

    def _sample(self, job: Job) -> LoadSample:
        """The probe's reading, the CPU time of the processes the job runs beside counted as this process's own."""
        s = self.probe.sample()
        extra = job.beside.jiffies() if job.beside and s.cpu else None
        return s if extra is None else replace(s, cpu=replace(s.cpu, own=s.cpu.own + extra))

    def _record(self, job: Job, f: Figure, spans: list[tuple[LoadSample, LoadSample]]) -> float:
        name = job.name
        self.figures[name] = f
        others = other_cpus_over(spans)
        last = spans[-1][1]
        self.entries[name] = {
            "runs": f.runs,
            "rounds": len(f.round_medians),
            "median_ms": sig(f.median_s * 1e3, 4),
            "spread": sig(f.spread, 2) if math.isfinite(f.spread) else 1e9,
            "stable": f.stable,
            "loadavg_1m": last.loadavg[0] if last.loadavg else None,
            "other_cpus": None if others is None else round(others, 2),
        }
        if not f.stable:
            cpus = last.cpu.cpus if last.cpu else 0
            load = describe_load(others, cpus, last.loadavg) + (f"; {job.beside.note()}" if job.beside else "")
            if f.spread > self.policy.max_spread:
                said = (f"spread {f.spread:.0%} over {f.runs} runs in {f.seconds:.1f} s stayed above "
                        f"{self.policy.max_spread:.0%} (its round's window {f.window_spread:.0%}, nearest other of "
                        f"{len(f.round_medians)} rounds {f.rounds_apart:.0%} away; {load})")
            else:  # each round agreed with itself, but none counted (a round the Beside left out, a short one)
                said = f"none of its {len(f.round_medians)} rounds was stable ({f.runs} runs in {f.seconds:.1f} s; {load})"
            what = f"{threads_label(self.threads)}, {name}: {said}"
            if self.strict:
                raise UserError(f"{what}; profile on a quiet machine, or without --strict to write the profile "
                                "with a warning")
            self.unstable.append(what)
            said_short = f"{f.spread:.0%}" if f.spread > self.policy.max_spread else "no stable round"
            self.unstable_names.append(f"{name} at {self.threads} thr ({said_short})")
        return f.median_s


def pass_order(jobs: list[Job]) -> list[Job]:
    """One pass over the jobs: each once, in the order added, and a job of k rounds per pass k times, at even
    intervals through the pass, so that its rounds sample the whole of the profile's time rather than one
    moment of it.  The s-th of S such jobs has its m-th round after the fraction (m + (s + 1/2) / S) / k of
    the others: staggered, so that they do not all sample the same moments."""
    single = [j for j in jobs if j.per_pass == 1]
    spread = [j for j in jobs if j.per_pass > 1]
    keyed = [((i + 1.0, 0, i), j) for i, j in enumerate(single)]
    for s, j in enumerate(spread):
        keyed += [(((m + (s + 0.5) / len(spread)) * len(single) / j.per_pass, 1, s), j) for m in range(j.per_pass)]
    return [j for _, j in sorted(keyed, key=lambda kj: kj[0])]


def threads_label(n: int) -> str:
    return f"{n} thread{'s' if n > 1 else ''}"


def other_cpus_over(spans: list[tuple[LoadSample, LoadSample]]) -> float | None:
    """Average CPUs other processes used over several intervals (a timing's rounds), as load.other_cpus does
    over one; None when unknown (no /proc, or no jiffy elapsed in them all)."""
    others = total = 0
    cpus = 0
    for a, b in spans:
        if a.cpu is None or b.cpu is None:
            return None
        others += (b.cpu.busy - a.cpu.busy) - (b.cpu.own - a.cpu.own)
        total += b.cpu.total - a.cpu.total
        cpus = b.cpu.cpus
    if total <= 0:
        return None
    return max(others, 0) / total * cpus


# --------------------------------------------------------------------------------------------------
# Throughput figures: each adds its model(s) and returns the formula of its figure


def _conv_model(c: int, h_out: int, w: int, weights, pad_rows: bool) -> tuple[bytes, dict]:
    """3x3 Conv c -> c channels giving h_out x w outputs; without pad_rows the input carries the 2 halo
    rows, as a tile of a larger map does."""
    h_in = h_out if pad_rows else h_out + 2
    pads = [1, 1, 1, 1] if pad_rows else [0, 1, 0, 1]
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=pads)
    return model([node], [vi("x", (1, c, h_in, w))], [vi("y", (1, c, h_out, w))], [weights]), {"x": (1, c, h_in, w)}


def _conv_size(quick: bool) -> tuple[int, int]:
    return (64, 28) if quick else (128, 56)


def _rate(work: float, name: str) -> Formula:
    """work (FLOPs or bytes) per second of the timing, in billions."""
    return lambda t: work / t[name] / 1e9


def bench_conv(b: Bench) -> Formula:
    c, hw = _conv_size(b.quick)
    w = numpy_helper.from_array(rand(b.rng, c, c, 3, 3) * 0.05, "w")
    data, shapes = _conv_model(c, hw, hw, w, pad_rows=True)
    b.add("gflops.conv", data, {"x": rand(b.rng, *shapes["x"])})
    return _rate(2 * c * c * 9 * hw * hw, "gflops.conv")


DEPTHWISE_CHAIN = 5  # depthwise convs in the chain whose time beyond one's is gflops.depthwise_conv's


def _depthwise_chain(c: int, hw: int, length: int, weights) -> bytes:
    names = ["x"] + [f"t{i}" for i in range(length - 1)] + ["y"]
    nodes = [helper.make_node("Conv", [names[i], f"w{i}"], [names[i + 1]], pads=[1, 1, 1, 1], group=c)
             for i in range(length)]
    return model(nodes, [vi("x", (1, c, hw, hw))], [vi("y", (1, c, hw, hw))], weights[:length])


def bench_depthwise(b: Bench) -> Formula:
    """A 3x3 depthwise Conv on a map that stays in cache, 192 channels on 28x28 (quick: 64), a MobileNet layer of
    the middle depths, timed inside a chain: DEPTHWISE_CHAIN of them less one alone, per conv.  Alone, half its
    time was onnxruntime's layout conversions in and out of the blocked layout (0.027 of 0.052 ms), which a
    network pays once at its ends, not per layer: 52 GFLOP/s alone, 109 in the chain, and MobileNetV2's
    depthwise layers took 0.74 ms in the model where the lone rate priced 1.17.  (On 96 channels at 112x112, a
    4.8 MB map, the figure until 2026-11-26 followed the memory traffic of the machine's other tenants: 18-38
    GFLOP/s within 90 s on idle CPUs, 12-28% apart between back-to-back profiles.)"""
    c, hw = (64, 28) if b.quick else (192, 28)
    weights = [numpy_helper.from_array(rand(b.rng, c, 1, 3, 3) * 0.3, f"w{i}") for i in range(DEPTHWISE_CHAIN)]
    feeds = {"x": rand(b.rng, 1, c, hw, hw)}
    chain, one = f"gflops.depthwise_conv.chain_{DEPTHWISE_CHAIN}", "gflops.depthwise_conv.chain_1"
    b.add(chain, _depthwise_chain(c, hw, DEPTHWISE_CHAIN, weights), feeds)
    b.add(one, _depthwise_chain(c, hw, 1, weights), feeds)
    flops = 2 * c * 9 * hw * hw

    def formula(t: Times) -> float:
        beyond = t[chain] - t[one]
        if beyond > 0:
            return (DEPTHWISE_CHAIN - 1) * flops / beyond / 1e9
        what = (f"{threads_label(b.threads)}, gflops.depthwise_conv: {DEPTHWISE_CHAIN} depthwise convs took no "
                f"longer than one ({t[chain] * 1e3:.4g} against {t[one] * 1e3:.4g} ms)")
        if b.strict:
            raise UserError(f"{what}; profile on a quiet machine, or without --strict to write the profile with a "
                            "warning")
        # recorded like an unstable timing: measurement.warnings and the profile's one-line warning
        b.unstable.append(f"{what}: the figure is the chain's time per conv instead, conversions included (a "
                          "lower bound on the rate)")
        b.unstable_names.append(f"gflops.depthwise_conv at {b.threads} thr (chain no slower than one conv)")
        return DEPTHWISE_CHAIN * flops / t[chain] / 1e9

    return formula


def _gemm_kn(quick: bool) -> int:
    return 512 if quick else 1024


def _add_gemm(b: Bench, name: str, m: int, weights) -> float:
    """Adds an (m x k) by (k x n) MatMul; returns its FLOPs."""
    k, n = weights.dims
    data = model([helper.make_node("MatMul", ["a", "b"], ["y"])], [vi("a", (m, k))], [vi("y", (m, n))], [weights])
    b.add(name, data, {"a": rand(b.rng, m, k)})
    return 2 * m * k * n


def _gemm_weights(b: Bench):
    kn = _gemm_kn(b.quick)
    return numpy_helper.from_array(rand(b.rng, kn, kn) * 0.05, "b")


def bench_gemm(b: Bench) -> Formula:
    m = GEMM_ROWS[1 if b.quick else 0]
    return _rate(_add_gemm(b, "gflops.gemm", m, _gemm_weights(b)), "gflops.gemm")


def _int8_inputs(b: Bench, name: str, shape) -> tuple[onnx.ValueInfoProto, dict, list]:
    """A uint8 activation input with its scale and zero point (initializers), as a QDQ model quantizes them."""
    x = b.rng.integers(0, 256, shape, dtype=np.uint8)
    return (helper.make_tensor_value_info(name, onnx.TensorProto.UINT8, list(shape)), {name: x},
            [numpy_helper.from_array(np.array(0.02, np.float32), f"{name}_s"),
             numpy_helper.from_array(np.array(128, np.uint8), f"{name}_z")])


def _int8_weights(b: Bench, name: str, shape) -> list:
    """int8 weights (symmetric, zero point 0) with their scale."""
    return [numpy_helper.from_array(b.rng.integers(-127, 128, shape, dtype=np.int8), name),
            numpy_helper.from_array(np.array(0.003, np.float32), f"{name}_s"),
            numpy_helper.from_array(np.array(0, np.int8), f"{name}_z")]


def _out_u8(name: str, shape) -> tuple[onnx.ValueInfoProto, list]:
    return (helper.make_tensor_value_info(name, onnx.TensorProto.UINT8, list(shape)),
            [numpy_helper.from_array(np.array(0.05, np.float32), f"{name}_s"),
             numpy_helper.from_array(np.array(128, np.uint8), f"{name}_z")])


def bench_conv_int8(b: Bench) -> Formula:
    """gflops.conv_int8: the gflops.conv benchmark's 3x3 Conv as onnxruntime's int8 kernel (QLinearConv, uint8
    activations, int8 weights: what a quantized model's Conv units run)."""
    c, hw = _conv_size(b.quick)
    xin, feeds, xq = _int8_inputs(b, "x", (1, c, hw, hw))
    yout, yq = _out_u8("y", (1, c, hw, hw))
    node = helper.make_node("QLinearConv", ["x", "x_s", "x_z", "w", "w_s", "w_z", "y_s", "y_z"], ["y"], pads=[1, 1, 1, 1])
    b.add("gflops.conv_int8", model([node], [xin], [yout], xq + _int8_weights(b, "w", (c, c, 3, 3)) + yq), feeds)
    return _rate(2 * c * c * 9 * hw * hw, "gflops.conv_int8")


def bench_gemm_int8(b: Bench) -> Formula:
    """gflops.gemm_int8: the gflops.gemm benchmark's MatMul as onnxruntime's int8 kernel (QLinearMatMul)."""
    m, kn = GEMM_ROWS[1 if b.quick else 0], _gemm_kn(b.quick)
    ain, feeds, aq = _int8_inputs(b, "a", (m, kn))
    yout, yq = _out_u8("y", (m, kn))
    node = helper.make_node("QLinearMatMul", ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"], ["y"])
    b.add("gflops.gemm_int8", model([node], [ain], [yout], aq + _int8_weights(b, "b", (kn, kn)) + yq), feeds)
    return _rate(2 * m * kn * kn, "gflops.gemm_int8")


def bench_other(b: Bench) -> Callable[[Times], tuple[float, float]]:
    """A ConvTranspose (2x upsampling) and a batch-1 LSTM: ops without a GEMM-shaped fast path.  The figure is
    the slower; both are returned, for the progress line."""
    ci, co, hw = (32, 32, 28) if b.quick else (128, 64, 56)
    w = numpy_helper.from_array(rand(b.rng, ci, co, 2, 2) * 0.05, "w")
    data = model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])],
                 [vi("x", (1, ci, hw, hw))], [vi("y", (1, co, 2 * hw, 2 * hw))], [w])
    b.add("gflops.other.ConvTranspose", data, {"x": rand(b.rng, 1, ci, hw, hw)})
    convt = _rate(2 * ci * co * 4 * hw * hw, "gflops.other.ConvTranspose")
    seq, inp, hid = (16, 128, 128) if b.quick else (32, 256, 256)
    W = numpy_helper.from_array(rand(b.rng, 1, 4 * hid, inp) * 0.05, "W")
    R = numpy_helper.from_array(rand(b.rng, 1, 4 * hid, hid) * 0.05, "R")
    data = model([helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hid)],
                 [vi("x", (seq, 1, inp))], [vi("y", (seq, 1, 1, hid))], [W, R])
    b.add("gflops.other.LSTM", data, {"x": rand(b.rng, seq, 1, inp)})
    lstm = _rate(seq * 2 * 4 * hid * (inp + hid), "gflops.other.LSTM")
    return lambda t: (convt(t), lstm(t))


def memory_floats(quick: bool) -> int:
    """Elements of each of memory_gbps' tensors."""
    return (2 if quick else 8) * 2**20


def memory_bytes(quick: bool) -> int:
    """Bytes one run of memory_gbps' Add moves: 3 x 4 per element (2 inputs, 1 output)."""
    return 3 * 4 * memory_floats(quick)


def bench_memory(b: Bench) -> Formula:
    """Elementwise Add of two tensors far larger than any cache (8M floats: 96 MB move per run), so that
    DRAM decides it, not what the caches happen to hold."""
    n = memory_floats(b.quick)
    data = model([helper.make_node("Add", ["a", "b"], ["y"])], [vi("a", (n,)), vi("b", (n,))], [vi("y", (n,))])
    b.add("memory_gbps", data, {"a": rand(b.rng, n), "b": rand(b.rng, n)}, per_pass=DRAM_ROUNDS)
    return _rate(memory_bytes(b.quick), "memory_gbps")


def _weights_kn(quick: bool) -> int:
    return 2048 if quick else 4096


def weights_matmul(rng, quick: bool) -> tuple[bytes, dict, int]:
    """weight_gbps' model: a batch-1 MatMul (1 x k by k x n) whose weights (64 MB) no cache holds, its feeds
    and its weights' bytes (shared.py times it beside co-runners too)."""
    kn = _weights_kn(quick)
    w = numpy_helper.from_array(rand(rng, kn, kn) * 0.05, "b")
    data = model([helper.make_node("MatMul", ["a", "b"], ["y"])], [vi("a", (1, kn))], [vi("y", (1, kn))], [w])
    return data, {"a": rand(rng, 1, kn)}, 4 * kn * kn


WEIGHTS = "weight_gbps"  # its timing's name (shared.py pairs its own rounds with this one's)


def bench_weights(b: Bench) -> Formula:
    """weights_matmul: its time is reading the weights in, which is what a layer pays for its weights beyond
    its FLOPs (cost/table.py weight_ms)."""
    data, feeds, nbytes = weights_matmul(b.rng, b.quick)
    b.add(WEIGHTS, data, feeds, per_pass=DRAM_ROUNDS)
    return _rate(nbytes, WEIGHTS)


GEMM_COLD_LAYERS = 12  # MatMuls of 1024 x 1024 weights, 48 MB in all: more than this machine's 32 MB L3 holds
# Rows of its MatMuls: the figure is a difference of two timings, so the fewer the rows, the larger the weights'
# share of the chain's time and the less the timings' noise moves it. At 128 rows the weights are about 16% of
# the chain's time, and two profiles back to back put the figure 14-16% apart in two pairs of four. At 32 rows
# about 40%: shared_weight_gbps apart, it was the stability target's worst figure in 8 pairs of 15, over 10% in
# 2. At 16 rows 55%: timed in alternating rounds with 32 for 8 minutes here (2026-11-26, scratch gw/rows.py),
# windows of 24 rounds at the fastest quarter, consecutive windows lay 1.6% apart (median), none over 10%,
# against 2.7% and 3 of 83 on 32 rows; the figure came out 5-8% higher (20-24 GB/s against 18-24; 23 on 128).
# How it follows the machine (2026-11-27): timed in turns with memory_gbps' Add and weight_gbps' MatMul for 8
# minutes (scratch gw/rows2.py), over windows of 24 rounds it moved 2.7 times as much as memory_gbps (log-log
# slope; weight_gbps 0.8 times): a GEMM waits on each weight panel between its arithmetic, so it pays the memory
# path's latency as well as its rate.  The move is the machine's moment, not the process's: two processes timing
# the chain in turns agreed within 2% while both moved 9% over two minutes (gw/procs.py).  No other pick of
# the rounds did better in all of three such traces (gw/sim.py, back-to-back profiles replayed): the median, the
# mean, a trimmed mean and the fastest tenth each missed 10% less often than the fastest quarter in some replays
# and more often in others.  So two profiles whose memory rates lie 4% apart put this figure about 10% apart:
# the stability benchmark's misses on it (+10.2%, +11.0%) had memory_gbps 1.5-4.9% apart.  At 8 rows it moved
# 1.75 times as much, but it is another figure (37 GB/s against 25): such a GEMM streams its weights almost as a batch-1
# MatMul does, and would price the transformer's 128-row MatMuls as if they did.
GEMM_COLD_ROWS = 16
_COLD, _HOT = "gemm_weight_gbps.chain", "gemm_weight_gbps.one"


def bench_gemm_weights(b: Bench) -> Callable[[Times], float | None]:
    """A chain of GEMM_COLD_LAYERS MatMuls (GEMM_COLD_ROWS x 1024 by 1024 x 1024, each its own weights) against
    one of them alone, its weights hot: the chain's time beyond its layers' hot time, per weight byte, is what a GEMM
    of several rows pays to read its weights from memory (cost/table.py weight_ms).  Measured here: 20-25 GB/s,
    where a batch-1 MatMul streams them at about 46 (weight_gbps): a GEMM reads its weights in panels between
    its arithmetic, and what it waits for is not hidden.  The transformer's MatMuls (128 rows, 2.4-9.4 MB each)
    ran 0.1-0.5 ms longer in the model than alone.  None when the chain took no longer than its layers hot."""
    k, m = 1024, GEMM_COLD_ROWS
    weights = [numpy_helper.from_array(rand(b.rng, k, k) * 0.03, f"w{i}") for i in range(GEMM_COLD_LAYERS)]
    names = ["a"] + [f"t{i}" for i in range(GEMM_COLD_LAYERS - 1)] + ["y"]
    chain = [helper.make_node("MatMul", [names[i], f"w{i}"], [names[i + 1]]) for i in range(GEMM_COLD_LAYERS)]
    feeds = {"a": rand(b.rng, m, k)}
    b.add(_COLD, model(chain, [vi("a", (m, k))], [vi("y", (m, k))], weights), feeds, per_pass=DRAM_ROUNDS)
    b.add(_HOT, model([helper.make_node("MatMul", ["a", "w0"], ["y"])], [vi("a", (m, k))], [vi("y", (m, k))],
                      weights[:1]), feeds)

    def formula(t: Times) -> float | None:
        extra = t[_COLD] - GEMM_COLD_LAYERS * t[_HOT]
        return GEMM_COLD_LAYERS * 4 * k * k / extra / 1e9 if extra > 0 else None

    return formula


# --------------------------------------------------------------------------------------------------
# Per-operator overhead


# One node of trivial work: its time is what any model's run costs regardless of its size.
_ONE_NODE = "op_overhead_us.relu_chain_1"


def _relu_chain(length: int) -> bytes:
    names = ["x"] + [f"t{i}" for i in range(length - 1)] + ["y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"relu{i}") for i in range(length)]
    return model(nodes, [vi("x", (1, 16))], [vi("y", (1, 16))])


def dispatch_floor_us(b: Bench) -> Formula:
    """Microseconds per node of a 200-node chain of tiny Relu nodes over a 1-node chain: the pure dispatch
    cost, with graph optimisation off so nothing folds the chain."""
    feeds = {"x": rand(b.rng, 1, 16)}
    off = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    b.add("op_overhead_us.relu_chain_200", _relu_chain(200), feeds, off)
    b.add(_ONE_NODE, _relu_chain(1), feeds, off)
    return lambda t: max((t["op_overhead_us.relu_chain_200"] - t[_ONE_NODE]) / 199, 0.0) * 1e6


def _conv_relu_chain(pairs: int, w) -> bytes:
    names = ["x"] + [f"t{i}" for i in range(2 * pairs - 1)] + ["y"]
    nodes = []
    for i in range(pairs):
        nodes.append(helper.make_node("Conv", [names[2 * i], "w"], [names[2 * i + 1]], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [names[2 * i + 1]], [names[2 * i + 2]], name=f"relu{i}"))
    shape = (1, _CHAIN_CH, _CHAIN_HW, _CHAIN_HW)
    return model(nodes, [vi("x", shape)], [vi("y", shape)], [w])


def small_layer_overhead_us(b: Bench) -> Callable[[Times, float], float]:
    """Fixed cost per original ONNX node at small layer sizes: the extra time of a chain of 50 (Conv 16->16 on
    7x7 -> Relu) pairs over one pair, less the 49 extra Convs' FLOPs at the measured (large) conv rate,
    divided by their 98 nodes.  Layers this small are parallelised, so the figure holds dispatch, intra-op
    thread-pool synchronisation and small-layer inefficiency: what a layer costs beyond FLOPs / gflops.  The
    chain runs with the default optimisation level, so Conv+Relu fuse as in the runtime; dividing by the
    original node count gives the overhead per node the cost model counts.  Formula: (times, gflops.conv)."""
    w = numpy_helper.from_array(rand(b.rng, _CHAIN_CH, _CHAIN_CH, 3, 3) * 0.1, "w")
    feeds = {"x": rand(b.rng, 1, _CHAIN_CH, _CHAIN_HW, _CHAIN_HW)}
    long, short = f"op_overhead_us.conv_chain_{_CHAIN_PAIRS}", "op_overhead_us.conv_chain_1"
    b.add(long, _conv_relu_chain(_CHAIN_PAIRS, w), feeds)
    b.add(short, _conv_relu_chain(1, w), feeds)
    extra_pairs = _CHAIN_PAIRS - 1
    flops = extra_pairs * 2 * _CHAIN_CH * _CHAIN_CH * 9 * _CHAIN_HW * _CHAIN_HW

    def formula(t: Times, conv_gflops: float) -> float:
        return max((t[long] - t[short] - flops / (conv_gflops * 1e9)) / (2 * extra_pairs), 0.0) * 1e6

    return formula


# --------------------------------------------------------------------------------------------------
# Cutting a conv chain into tile fragments: the layout conversions at a fragment's ends


def blocked_layout(threads: int) -> bool:
    """Whether onnxruntime runs convolutions here in its blocked layout (NCHWc): the graph it optimises a
    small conv chain into holds ReorderInput / ReorderOutput nodes (x86 with AVX2 and up; not on ARM). The
    profile's `layout_conversions`; the cost model prices each conversion at memory_gbps (cost/tiles.py
    Relayout).  Read from the graph onnxruntime writes, not timed: timed as the difference of one- and
    two-fragment runs, a boundary's conversions moved by up to a third between back-to-back profiles on this
    shared machine, where memory_gbps holds within a few %."""
    c = 16
    w = numpy_helper.from_array(np.full((c, c, 1, 1), 0.1, np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    data = model(nodes, [vi("x", (1, c, 8, 8))], [vi("y", (1, c, 8, 8))], [w])
    with tempfile.TemporaryDirectory(prefix="edgec-layout-") as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        so.log_severity_level = 3
        ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        optimized = onnx.load(so.optimized_model_filepath)
    return any(n.op_type in ("ReorderInput", "ReorderOutput") for n in optimized.graph.node)


# --------------------------------------------------------------------------------------------------
# Op classes the roofline misses: milliseconds per million output elements


def _op_cases(quick: bool) -> dict[str, tuple]:
    """op key -> (node or nodes, input shape, output shape, initializers).  Shapes are those of the models that
    use them (inception_v1's LRN, the transformer's Softmax / LayerNormalization / Erf, MobileNetV2's
    ReLU6 after its 56x56 expansion); quick halves them.

    Clip is here because onnxruntime's NCHWc convolutions apply only Relu inside the kernel: a Clip after
    a Conv (ReLU6) is one more pass over the output, ~0.1 ms per million elements at 1 thread whether it
    is fused into the Conv or not (measured: 1x1 and depthwise Conv chains with Clip against the same
    chains with Relu), which the Conv's roofline misses (MobileNetV2's 35 Clips: ~0.6 ms of ~7.5)."""
    q = 2 if quick else 1
    lrn = (1, 64 // q, 56 // q, 56 // q)
    soft = (1, 12 // q, 128 // q, 128 // q)
    ln = (1, 128 // q, 768 // q)
    erf = (1, 128 // q, 3072 // q)
    img = (1, 64 // q, 56 // q, 56 // q)
    up = (1, 64 // q, 112 // q, 112 // q)
    relu6 = (1, 144 // q, 56 // q, 56 // q)
    bounds = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0.0), ("hi", 6.0))]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    gamma = numpy_helper.from_array(np.ones(ln[-1], np.float32), "gamma")
    beta = numpy_helper.from_array(np.zeros(ln[-1], np.float32), "beta")
    residual = numpy_helper.from_array(np.full(ln, 0.5, np.float32), "r")
    return {
        "LRN": (helper.make_node("LRN", ["x"], ["y"], size=5, alpha=1e-4, beta=0.75, bias=1.0), lrn, lrn, []),
        "Softmax": (helper.make_node("Softmax", ["x"], ["y"], axis=-1), soft, soft, []),
        "LayerNormalization": (helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1),
                               ln, ln, [gamma, beta]),
        # onnxruntime fuses a residual Add and the LayerNormalization after it into SkipLayerNormalization
        # (cost/table.py _skip_norm): ten times the LayerNormalization's time here
        "LayerNormalization:skip": ([helper.make_node("Add", ["x", "r"], ["s"]),
                                     helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1)],
                                    ln, ln, [gamma, beta, residual]),
        "Erf": (helper.make_node("Erf", ["x"], ["y"]), erf, erf, []),
        "Resize": (helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest"), img, up, [scales]),
        "Resize:linear": (helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear"), img, up, [scales]),
        "Clip": (helper.make_node("Clip", ["x", "lo", "hi"], ["y"]), relu6, relu6, bounds),
    }


OP_TABLE_OPS = tuple(_op_cases(False))


def op_table(b: Bench) -> Callable[[Times, float], dict[str, float]]:
    """ms per million output elements, net of one node's op_overhead_us (which the cost model adds per node
    anyway), so overhead + elements x price gives back the measured time at the benchmark's size.  Formula:
    (times, op_overhead_us)."""
    elements = {}
    for key, (nodes, shape_in, shape_out, inits) in _op_cases(b.quick).items():
        nodes = nodes if isinstance(nodes, list) else [nodes]
        b.add(f"op_ms_per_melem.{key}", model(nodes, [vi("x", shape_in)], [vi("y", shape_out)], inits),
              {"x": rand(b.rng, *shape_in)}, per_pass=SPREAD_ROUNDS)  # 0.4-1.6 MB each: beyond a core's L2
        elements[key] = math.prod(shape_out)

    def formula(t: Times, overhead_us: float) -> dict[str, float]:
        table = {}
        for key, n in elements.items():
            s = t[f"op_ms_per_melem.{key}"]
            net = max(s - overhead_us * 1e-6, 0.01 * s)  # an op never costs nothing beyond its dispatch
            table[key] = sig(net * 1e3 / (n / 1e6))
        return table

    return formula


# --------------------------------------------------------------------------------------------------
# Tile efficiency: throughput at smaller outputs as a fraction of the large benchmark's

Curve = Callable[[Times, float, float], list[list]]  # (times, peak gflops, op_overhead_us) -> points


def _fraction(flops: float, t: float, peak_gflops: float, overhead_us: float) -> float:
    """ideal time / time beyond the per-operator overhead: the cost model prices a tile as
    overhead + flops / (gflops x fraction)."""
    ideal = flops / (peak_gflops * 1e9)
    beyond = t - overhead_us * 1e-6
    return sig(MAX_EFFICIENCY if beyond <= ideal / MAX_EFFICIENCY else ideal / beyond)


def _curve(points: dict[str, tuple[int, float]]) -> Curve:
    """points: timing name -> (output elements, FLOPs)."""
    return lambda t, peak, overhead_us: sorted(
        [elems, _fraction(flops, t[name], peak, overhead_us)] for name, (elems, flops) in points.items())


# (output rows, width) of conv_positions_curve's points: tiles (and whole maps) of 28-, 14- and 7-wide maps,
# ResNet's and Inception's last stages, whose speed the 56-wide curve's one-row point (56 positions) never
# reached: 784, 224, 196, 56, 49, 28, 14 and 7 output positions.
CONV_POSITION_TILES = ((28, 28), (8, 28), (14, 14), (4, 14), (7, 7), (4, 7), (2, 7), (1, 7))
CONV_POSITION_TILES_QUICK = ((28, 28), (4, 14), (7, 7), (2, 7), (1, 7))


def conv_positions_channels(quick: bool) -> int:
    return 128 if quick else 256


def conv_positions_curve(b: Bench) -> Curve:
    """A 3x3 Conv (256 -> 256 channels; quick: 128) computing h rows of a w-wide map from h + 2 input rows, at
    CONV_POSITION_TILES: its rate by output positions (h x w), which decides a conv's speed whatever its
    channels (cost/table.py BY_POSITIONS), as a fraction of its largest point's (784 positions): a larger map
    runs at gflops.conv, and whole conv layers as well as tiles of fewer positions run slower.  Measured at
    1 thread: 0.63 at 7 positions, 0.84 at 28, 0.88 at 49, 0.95 at 56, 0.98 at 196."""
    c = conv_positions_channels(b.quick)
    w = numpy_helper.from_array(rand(b.rng, c, c, 3, 3) * 0.03, "w")
    points = {}
    tiles = CONV_POSITION_TILES_QUICK if b.quick else CONV_POSITION_TILES
    for h, width in tiles:
        data, shapes = _conv_model(c, h, width, w, pad_rows=False)
        name = f"efficiency.conv_positions.{h}x{width}"
        b.add(name, data, {"x": rand(b.rng, *shapes["x"])})
        points[name] = (h * width, 2 * c * c * 9 * h * width)
    return _own_rate(_curve(points), points, f"efficiency.conv_positions.{tiles[0][0]}x{tiles[0][1]}")


def _own_rate(curve: Curve, points: dict[str, tuple[int, float]], largest: str) -> Curve:
    """`curve` with its fractions of the rate of its point `largest`, not of a gflops figure."""
    def own_rate(t: Times, _peak: float, overhead_us: float) -> list[list]:
        flops = points[largest][1]
        return curve(t, flops / max(t[largest] - overhead_us * 1e-6, 1e-12) / 1e9, overhead_us)

    return own_rate


def _depthwise_size(quick: bool) -> tuple[int, int]:
    """(channels, width) of the depthwise curve's rows: about 8,000 output elements per row, as in
    MobileNet-style networks, whose depthwise layers keep channels x width near that while the map shrinks
    and the channels grow (144 x 56, 192 x 28, 576 x 14, 960 x 7), so that a layer's elements map to rows of
    this benchmark as its own rows do."""
    return (72, 28) if quick else (144, 56)


def depthwise_curve(b: Bench) -> Curve:
    """A depthwise 3x3 conv computing h of a map's rows from h + 2 input rows (its halo), as a tile does.
    Its fractions are of its own largest point's rate, not of gflops.depthwise_conv: that figure is timed on
    another shape (a lone padded map, mostly onnxruntime's layout conversions) and moves with memory
    bandwidth by up to ~18% between two profiles, while the curve's shape, all the tile model reads
    (eff(E) / eff(E_tile)), moved by under 1% between the same two."""
    c, width = _depthwise_size(b.quick)
    w = numpy_helper.from_array(rand(b.rng, c, 1, 3, 3) * 0.1, "w")
    points = {}
    for h in (h for h in CONV_HEIGHTS if h <= width):
        node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[0, 1, 0, 1], group=c)
        data = model([node], [vi("x", (1, c, h + 2, width))], [vi("y", (1, c, h, width))], [w])
        name = f"efficiency.depthwise_conv.rows_{h}"
        b.add(name, data, {"x": rand(b.rng, 1, c, h + 2, width)})
        points[name] = (c * h * width, 2 * c * 9 * h * width)
    largest = max(h for h in CONV_HEIGHTS if h <= width)
    return _own_rate(_curve(points), points, f"efficiency.depthwise_conv.rows_{largest}")


def gemm_curve(b: Bench) -> Curve:
    weights = _gemm_weights(b)
    kn = _gemm_kn(b.quick)
    points = {}
    for m in (m for m in GEMM_ROWS if m <= GEMM_ROWS[1 if b.quick else 0]):
        points[f"efficiency.gemm.rows_{m}"] = (m * kn, _add_gemm(b, f"efficiency.gemm.rows_{m}", m, weights))
    return _curve(points)


# --------------------------------------------------------------------------------------------------


def measure_figures(b: Bench, more: dict[str, Callable[[Bench], Formula]] | None = None) -> dict:
    """The figures of one thread count, in the profile's format (a `threads:` entry), and those of `more`
    under their names: each adds its timings to the Bench after the others (shared.CoRunners.add_to) and
    returns its figure's formula."""
    floor = dispatch_floor_us(b)
    small = small_layer_overhead_us(b)
    conv, dw, gemm, other, mem = bench_conv(b), bench_depthwise(b), bench_gemm(b), bench_other(b), bench_memory(b)
    int8 = {"conv_int8": bench_conv_int8(b), "gemm_int8": bench_gemm_int8(b)}
    weights = bench_weights(b)
    gemm_weights = bench_gemm_weights(b)
    ops = op_table(b)
    curves = {"conv_positions": conv_positions_curve(b), "depthwise_conv": depthwise_curve(b), "gemm": gemm_curve(b)}
    extra = {name: add(b) for name, add in (more or {}).items()}
    n = b.threads
    b.say(f"  {threads_label(n)}: {len(b.jobs)} timings, {b.policy.rounds} interleaved rounds each")
    t = b.run()

    g = {"conv": conv(t), "depthwise_conv": dw(t), "gemm": gemm(t)}
    floor_us, small_us = floor(t), small(t, g["conv"])
    overhead_us = sig(max(floor_us, small_us, 0.1), 2)
    b.say(f"    per-operator overhead {overhead_us:.1f} us (dispatch floor {floor_us:.1f} us, small layers {small_us:.1f} us)")
    b.say(f"    conv {g['conv']:.1f}, depthwise conv {g['depthwise_conv']:.1f}, gemm {g['gemm']:.1f} GFLOP/s")
    g8 = {k: formula(t) for k, formula in int8.items()}
    b.say(f"    int8: conv {g8['conv_int8']:.1f}, gemm {g8['gemm_int8']:.1f} GFLOP/s (depthwise: the float figure)")
    g_convt, g_lstm = other(t)
    b.say(f"    other: ConvTranspose {g_convt:.1f} GFLOP/s, LSTM {g_lstm:.1f} GFLOP/s")
    memory = mem(t)
    weight_gbps, gemm_weight_gbps = weights(t), gemm_weights(t)
    gemm_said = "not measured: its weights stayed in a cache" if gemm_weight_gbps is None else \
        f"{gemm_weight_gbps:.1f} GB/s"
    b.say(f"    memory (elementwise) {memory:.1f} GB/s, weights (batch-1 MatMul) {weight_gbps:.1f} GB/s, weights "
          f"(GEMM of {GEMM_COLD_ROWS} rows) {gemm_said}")
    table = ops(t, overhead_us)
    b.say("    ms per million output elements: " + ", ".join(f"{k} {v:g}" for k, v in table.items()))
    eff = {k: curve(t, g.get(k, 0.0), overhead_us) for k, curve in curves.items()}
    b.say("    tile efficiency: " + "; ".join(f"{k} " + " ".join(f"{e}:{f:g}" for e, f in pts) for k, pts in eff.items()))
    return {
        "op_overhead_us": overhead_us,
        "gflops": {"conv": sig(g["conv"]), "depthwise_conv": sig(g["depthwise_conv"]), "gemm": sig(g["gemm"]),
                   "other": sig(min(g_convt, g_lstm)), **{k: sig(v) for k, v in g8.items()}},
        "memory_gbps": sig(memory),
        "weight_gbps": sig(weight_gbps),
        **({} if gemm_weight_gbps is None else {"gemm_weight_gbps": sig(gemm_weight_gbps)}),
        "op_ms_per_melem": table,
        "efficiency": eff,
        **{name: sig(formula(t)) for name, formula in extra.items()},
    }
