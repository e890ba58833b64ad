"""Micro-benchmarks at one intra-op thread count: the figures of one `threads:` entry of a profile.

Each timing goes through timing.measure_stable and leaves a measurement entry (runs, median, spread,
stable, the load meanwhile).  What each figure is: see the package docstring.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper

from edgec.compiler.errors import UserError

from .load import LoadProbe, describe_load, other_cpus
from .timing import Policy, measure_stable, model, rand, sample_fn, session, sig, vi

__all__ = ["Bench", "measure_figures", "OP_TABLE_OPS", "CONV_HEIGHTS", "GEMM_ROWS", "MAX_EFFICIENCY"]

# A tile faster per FLOP than the large benchmark is possible (cache), but not by more than this; a larger
# ratio means the tile's time was all per-operator overhead, where the cost model's overhead term rules.
MAX_EFFICIENCY = 4.0
CONV_HEIGHTS = (56, 28, 14, 7, 4, 2, 1)
GEMM_ROWS = (512, 256, 128, 64, 32, 16, 8)
_CHAIN_PAIRS, _CHAIN_CH, _CHAIN_HW = 50, 16, 28


class Bench:
    """Times models at one thread count; records each timing under its name in `entries`."""

    def __init__(self, threads: int, quick: bool, policy: Policy, probe: LoadProbe, strict: bool,
                 progress: Callable[[str], None]):
        self.threads, self.quick, self.policy, self.probe, self.strict = threads, quick, policy, probe, strict
        self.say = progress
        self.rng = np.random.default_rng(0)
        self.entries: dict[str, dict] = {}
        self.unstable: list[str] = []  # one line per timing whose spread stayed large
        self.unstable_names: list[str] = []  # "<threads> thr <timing> <spread>" for the one-line warning

    def time(self, name: str, data: bytes, feeds: dict, opt=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> float:
        """Seconds per run of the model, timed until stable (timing.py)."""
        sampler = sample_fn(session(data, self.threads, opt), feeds, self.policy)
        before = self.probe.sample()
        s = measure_stable(sampler, self.policy)
        after = self.probe.sample()
        others = other_cpus(before, after)
        self.entries[name] = {
            "runs": s.runs,
            "median_ms": sig(s.median_s * 1e3, 4),
            "spread": sig(s.spread, 2) if math.isfinite(s.spread) else 1e9,
            "stable": s.stable,
            "loadavg_1m": after.loadavg[0] if after.loadavg else None,
            "other_cpus": None if others is None else round(others, 2),
        }
        if not s.stable:
            cpus = after.cpu.cpus if after.cpu else 0
            what = (f"{self.threads} thread{'s' if self.threads > 1 else ''}, {name}: spread {s.spread:.0%} "
                    f"over {s.runs} runs in {s.seconds:.1f} s stayed above {self.policy.max_spread:.0%} "
                    f"({describe_load(others, cpus, after.loadavg)})")
            if self.strict:
                raise UserError(f"{what}; profile on a quiet machine, or without --strict to write the profile "
                                "with a warning")
            self.unstable.append(what)
            self.unstable_names.append(f"{name} at {self.threads} thr ({s.spread:.0%})")
        return s.median_s


# --------------------------------------------------------------------------------------------------
# Throughput figures


def _conv_model(c: int, h_out: int, w: int, weights, pad_rows: bool) -> tuple[bytes, dict]:
    """3x3 Conv c -> c channels giving h_out x w outputs; without pad_rows the input carries the 2 halo
    rows, as a tile of a larger map does."""
    h_in = h_out if pad_rows else h_out + 2
    pads = [1, 1, 1, 1] if pad_rows else [0, 1, 0, 1]
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=pads)
    return model([node], [vi("x", (1, c, h_in, w))], [vi("y", (1, c, h_out, w))], [weights]), {"x": (1, c, h_in, w)}


def _conv_size(quick: bool) -> tuple[int, int]:
    return (64, 28) if quick else (128, 56)


def bench_conv(b: Bench) -> float:
    c, hw = _conv_size(b.quick)
    w = numpy_helper.from_array(rand(b.rng, c, c, 3, 3) * 0.05, "w")
    data, shapes = _conv_model(c, hw, hw, w, pad_rows=True)
    t = b.time("gflops.conv", data, {"x": rand(b.rng, *shapes["x"])})
    return 2 * c * c * 9 * hw * hw / t / 1e9


def bench_depthwise(b: Bench) -> float:
    c, hw = (32, 56) if b.quick else (96, 112)
    w = numpy_helper.from_array(rand(b.rng, c, 1, 3, 3) * 0.1, "w")
    data = model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=c)],
                 [vi("x", (1, c, hw, hw))], [vi("y", (1, c, hw, hw))], [w])
    t = b.time("gflops.depthwise_conv", data, {"x": rand(b.rng, 1, c, hw, hw)})
    return 2 * c * 9 * hw * hw / t / 1e9


def _gemm_kn(quick: bool) -> int:
    return 512 if quick else 1024


def _gemm_s(b: Bench, name: str, m: int, weights) -> float:
    """Seconds of an (m x k) by (k x n) MatMul."""
    k, n = weights.dims
    data = model([helper.make_node("MatMul", ["a", "b"], ["y"])], [vi("a", (m, k))], [vi("y", (m, n))], [weights])
    return b.time(name, data, {"a": rand(b.rng, m, k)})


def _gemm_weights(b: Bench):
    kn = _gemm_kn(b.quick)
    return numpy_helper.from_array(rand(b.rng, kn, kn) * 0.05, "b")


def bench_gemm(b: Bench) -> float:
    m, kn = GEMM_ROWS[1 if b.quick else 0], _gemm_kn(b.quick)
    return 2 * m * kn * kn / _gemm_s(b, "gflops.gemm", m, _gemm_weights(b)) / 1e9


def bench_other(b: Bench) -> float:
    """The slower of a ConvTranspose (2x upsampling) and a batch-1 LSTM: ops without a GEMM-shaped fast path."""
    ci, co, hw = (32, 32, 28) if b.quick else (128, 64, 56)
    w = numpy_helper.from_array(rand(b.rng, ci, co, 2, 2) * 0.05, "w")
    data = model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])],
                 [vi("x", (1, ci, hw, hw))], [vi("y", (1, co, 2 * hw, 2 * hw))], [w])
    g_convt = 2 * ci * co * 4 * hw * hw / b.time("gflops.other.ConvTranspose", data, {"x": rand(b.rng, 1, ci, hw, hw)}) / 1e9
    seq, inp, hid = (16, 128, 128) if b.quick else (32, 256, 256)
    W = numpy_helper.from_array(rand(b.rng, 1, 4 * hid, inp) * 0.05, "W")
    R = numpy_helper.from_array(rand(b.rng, 1, 4 * hid, hid) * 0.05, "R")
    data = model([helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hid)],
                 [vi("x", (seq, 1, inp))], [vi("y", (seq, 1, 1, hid))], [W, R])
    g_lstm = seq * 2 * 4 * hid * (inp + hid) / b.time("gflops.other.LSTM", data, {"x": rand(b.rng, seq, 1, inp)}) / 1e9
    b.say(f"    other: ConvTranspose {g_convt:.1f} GFLOP/s, LSTM {g_lstm:.1f} GFLOP/s")
    return min(g_convt, g_lstm)


def bench_memory(b: Bench) -> float:
    n = (2 if b.quick else 8) * 2**20
    data = model([helper.make_node("Add", ["a", "b"], ["y"])], [vi("a", (n,)), vi("b", (n,))], [vi("y", (n,))])
    t = b.time("memory_gbps", data, {"a": rand(b.rng, n), "b": rand(b.rng, n)})
    return 3 * 4 * n / t / 1e9


# --------------------------------------------------------------------------------------------------
# Per-operator overhead


def _relu_chain(length: int) -> bytes:
    names = ["x"] + [f"t{i}" for i in range(length - 1)] + ["y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"relu{i}") for i in range(length)]
    return model(nodes, [vi("x", (1, 16))], [vi("y", (1, 16))])


def dispatch_floor_us(b: Bench) -> float:
    """Microseconds per node of a 200-node chain of tiny Relu nodes over a 1-node chain: the pure dispatch
    cost, with graph optimisation off so nothing folds the chain."""
    feeds = {"x": rand(b.rng, 1, 16)}
    off = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    t_long = b.time("op_overhead_us.relu_chain_200", _relu_chain(200), feeds, off)
    t_short = b.time("op_overhead_us.relu_chain_1", _relu_chain(1), feeds, off)
    return max((t_long - t_short) / 199, 0.0) * 1e6


def _conv_relu_chain(pairs: int, w) -> bytes:
    names = ["x"] + [f"t{i}" for i in range(2 * pairs - 1)] + ["y"]
    nodes = []
    for i in range(pairs):
        nodes.append(helper.make_node("Conv", [names[2 * i], "w"], [names[2 * i + 1]], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [names[2 * i + 1]], [names[2 * i + 2]], name=f"relu{i}"))
    shape = (1, _CHAIN_CH, _CHAIN_HW, _CHAIN_HW)
    return model(nodes, [vi("x", shape)], [vi("y", shape)], [w])


def time_op_chains(b: Bench) -> tuple[float, float]:
    """Seconds for a chain of 50 (small 3x3 Conv -> Relu) pairs (100 nodes) and for one pair."""
    w = numpy_helper.from_array(rand(b.rng, _CHAIN_CH, _CHAIN_CH, 3, 3) * 0.1, "w")
    feeds = {"x": rand(b.rng, 1, _CHAIN_CH, _CHAIN_HW, _CHAIN_HW)}
    t_long = b.time(f"op_overhead_us.conv_chain_{_CHAIN_PAIRS}", _conv_relu_chain(_CHAIN_PAIRS, w), feeds)
    t_short = b.time("op_overhead_us.conv_chain_1", _conv_relu_chain(1, w), feeds)
    return t_long, t_short


def small_layer_overhead_us(t_long: float, t_short: float, conv_gflops: float) -> float:
    """Fixed cost per original ONNX node at small layer sizes: the extra time of 49 (Conv 16->16 on 28x28
    -> Relu) pairs, less their Conv FLOPs at the measured (large) conv rate, divided by their 98 nodes.
    Layers this small are parallelised, so the figure holds dispatch, intra-op thread-pool synchronisation
    and small-layer inefficiency: what a layer costs beyond FLOPs / gflops.  The chain runs with the default
    optimisation level, so Conv+Relu fuse as in the runtime; dividing by the original node count gives the
    overhead per node the cost model counts."""
    extra_pairs = _CHAIN_PAIRS - 1
    flop_s = extra_pairs * 2 * _CHAIN_CH * _CHAIN_CH * 9 * _CHAIN_HW * _CHAIN_HW / (conv_gflops * 1e9)
    return max((t_long - t_short - flop_s) / (2 * extra_pairs), 0.0) * 1e6


# --------------------------------------------------------------------------------------------------
# Op classes the roofline misses: milliseconds per million output elements


def _op_cases(quick: bool) -> dict[str, tuple]:
    """op key -> (node, input shape, output shape, initializers).  Shapes are those of the models that
    use them (inception_v1's LRN, the transformer's Softmax / LayerNormalization / Erf); quick halves them."""
    q = 2 if quick else 1
    lrn = (1, 64 // q, 56 // q, 56 // q)
    soft = (1, 12 // q, 128 // q, 128 // q)
    ln = (1, 128 // q, 768 // q)
    erf = (1, 128 // q, 3072 // q)
    img = (1, 64 // q, 56 // q, 56 // q)
    up = (1, 64 // q, 112 // q, 112 // q)
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    gamma = numpy_helper.from_array(np.ones(ln[-1], np.float32), "gamma")
    beta = numpy_helper.from_array(np.zeros(ln[-1], np.float32), "beta")
    return {
        "LRN": (helper.make_node("LRN", ["x"], ["y"], size=5, alpha=1e-4, beta=0.75, bias=1.0), lrn, lrn, []),
        "Softmax": (helper.make_node("Softmax", ["x"], ["y"], axis=-1), soft, soft, []),
        "LayerNormalization": (helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1),
                               ln, ln, [gamma, beta]),
        "Erf": (helper.make_node("Erf", ["x"], ["y"]), erf, erf, []),
        "Resize": (helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest"), img, up, [scales]),
        "Resize:linear": (helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear"), img, up, [scales]),
    }


OP_TABLE_OPS = tuple(_op_cases(False))


def op_table(b: Bench, overhead_us: float) -> dict[str, float]:
    """ms per million output elements, net of one node's op_overhead_us (which the cost model adds per node
    anyway), so overhead + elements x price gives back the measured time at the benchmark's size."""
    table = {}
    for key, (node, shape_in, shape_out, inits) in _op_cases(b.quick).items():
        data = model([node], [vi("x", shape_in)], [vi("y", shape_out)], inits)
        t = b.time(f"op_ms_per_melem.{key}", data, {"x": rand(b.rng, *shape_in)})
        net = max(t - overhead_us * 1e-6, 0.01 * t)  # an op never costs nothing beyond its dispatch
        table[key] = sig(net * 1e3 / (math.prod(shape_out) / 1e6))
    return table


# --------------------------------------------------------------------------------------------------
# Tile efficiency: throughput at smaller outputs as a fraction of the large benchmark's


def _fraction(flops: float, t: float, peak_gflops: float, overhead_us: float) -> float:
    """ideal time / time beyond the per-operator overhead: the cost model prices a tile as
    overhead + flops / (gflops x fraction)."""
    ideal = flops / (peak_gflops * 1e9)
    beyond = t - overhead_us * 1e-6
    return sig(MAX_EFFICIENCY if beyond <= ideal / MAX_EFFICIENCY else ideal / beyond)


def conv_curve(b: Bench, peak: float, overhead_us: float) -> list[list]:
    c, width = _conv_size(b.quick)
    w = numpy_helper.from_array(rand(b.rng, c, c, 3, 3) * 0.05, "w")
    points = []
    for h in (h for h in CONV_HEIGHTS if h <= width):
        data, shapes = _conv_model(c, h, width, w, pad_rows=False)
        t = b.time(f"efficiency.conv.rows_{h}", data, {"x": rand(b.rng, *shapes["x"])})
        points.append([c * h * width, _fraction(2 * c * c * 9 * h * width, t, peak, overhead_us)])
    return sorted(points)


def gemm_curve(b: Bench, peak: float, overhead_us: float) -> list[list]:
    weights = _gemm_weights(b)
    kn = _gemm_kn(b.quick)
    points = []
    for m in (m for m in GEMM_ROWS if m <= GEMM_ROWS[1 if b.quick else 0]):
        t = _gemm_s(b, f"efficiency.gemm.rows_{m}", m, weights)
        points.append([m * kn, _fraction(2 * m * kn * kn, t, peak, overhead_us)])
    return sorted(points)


# --------------------------------------------------------------------------------------------------


def measure_figures(b: Bench) -> dict:
    """The figures of one thread count, in the profile's format (a `threads:` entry)."""
    n = b.threads
    b.say(f"  {n} thread{'s' if n > 1 else ''}:")
    floor_us = dispatch_floor_us(b)
    t_long, t_short = time_op_chains(b)
    conv = bench_conv(b)
    small_us = small_layer_overhead_us(t_long, t_short, conv)
    overhead_us = sig(max(floor_us, small_us, 0.1), 2)
    b.say(f"    per-operator overhead {overhead_us:.1f} us (dispatch floor {floor_us:.1f} us, small layers {small_us:.1f} us)")
    dw = bench_depthwise(b)
    gemm = bench_gemm(b)
    b.say(f"    conv {conv:.1f}, depthwise conv {dw:.1f}, gemm {gemm:.1f} GFLOP/s")
    other = bench_other(b)
    mem = bench_memory(b)
    b.say(f"    memory (elementwise) {mem:.1f} GB/s")
    ops = op_table(b, overhead_us)
    b.say("    ms per million output elements: " + ", ".join(f"{k} {v:g}" for k, v in ops.items()))
    eff = {"conv": conv_curve(b, conv, overhead_us), "gemm": gemm_curve(b, gemm, overhead_us)}
    b.say("    tile efficiency: " + "; ".join(f"{k} " + " ".join(f"{e}:{f:g}" for e, f in pts) for k, pts in eff.items()))
    return {
        "op_overhead_us": overhead_us,
        "gflops": {"conv": sig(conv), "depthwise_conv": sig(dw), "gemm": sig(gemm), "other": sig(other)},
        "memory_gbps": sig(mem),
        "op_ms_per_melem": ops,
        "efficiency": eff,
    }
