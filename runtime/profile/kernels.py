"""The throughput figures and the per-operator overhead of one thread count: each function adds its model(s)
to a Bench and returns the formula of its figure (gflops.*, memory_gbps, weight_gbps, gemm_weight_gbps,
op_overhead_us); blocked_layout reads whether onnxruntime runs convolutions in its blocked layout.  What each
figure is: see the package docstring."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from edgec.runtime.errors import InputError

from .bench import DRAM_ROUNDS, Bench, Formula, Times, threads_label
from .timing import model, rand, vi

__all__ = ["bench_conv", "bench_depthwise", "bench_gemm", "bench_conv_int8", "bench_gemm_int8", "bench_other",
           "bench_memory", "bench_weights",
           "bench_gemm_weights", "gemm_weight_figure", "dispatch_floor_us", "small_layer_overhead_us", "blocked_layout", "weights_matmul",
           "memory_bytes", "memory_floats", "WEIGHTS", "DEPTHWISE_CHAIN", "GEMM_COLD_LAYERS", "GEMM_COLD_ROWS",
           "GEMM_ROWS", "add_gemm", "gemm_kn", "gemm_weights", "conv_model", "relu_chain"]

# 7x7: each Conv's FLOPs take ~2 us, so the per-node overhead is about a third of the chain's extra time and
# errors of a few % in the conv rate subtracted from it move it by a few %; at 28x28 it was ~5% of it, and
# a 2% error in the conv rate moved it by ~40% between two profiles.
_CHAIN_PAIRS, _CHAIN_CH, _CHAIN_HW = 50, 16, 7
GEMM_ROWS = (512, 256, 128, 64, 32, 16, 8)  # gflops.gemm's rows (quick: the second), and the gemm curve's

def conv_model(c: int, h_out: int, w: int, weights, pad_rows: bool) -> tuple[bytes, dict]:
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
    data, shapes = conv_model(c, hw, hw, w, pad_rows=True)
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
            raise InputError(f"{what}; profile on a quiet machine, or without --strict to write the profile with a "
                            "warning")
        # recorded like an unstable timing: measurement.warnings and the profile's one-line warning
        b.unstable.append(f"{what}: the figure is the chain's time per conv instead, conversions included (a "
                          "lower bound on the rate)")
        b.unstable_names.append(f"gflops.depthwise_conv at {b.threads} thr (chain no slower than one conv)")
        return DEPTHWISE_CHAIN * flops / t[chain] / 1e9

    return formula


def gemm_kn(quick: bool) -> int:
    return 512 if quick else 1024


def add_gemm(b: Bench, name: str, m: int, weights) -> float:
    """Adds an (m x k) by (k x n) MatMul; returns its FLOPs."""
    k, n = weights.dims
    data = model([helper.make_node("MatMul", ["a", "b"], ["y"])], [vi("a", (m, k))], [vi("y", (m, n))], [weights])
    b.add(name, data, {"a": rand(b.rng, m, k)})
    return 2 * m * k * n


def gemm_weights(b: Bench):
    kn = gemm_kn(b.quick)
    return numpy_helper.from_array(rand(b.rng, kn, kn) * 0.05, "b")


def bench_gemm(b: Bench) -> Formula:
    m = GEMM_ROWS[1 if b.quick else 0]
    return _rate(add_gemm(b, "gflops.gemm", m, gemm_weights(b)), "gflops.gemm")


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
    m, kn = GEMM_ROWS[1 if b.quick else 0], gemm_kn(b.quick)
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


GEMM_COLD_LAYERS = 12  # MatMuls of 1024 x 1024 weights, 48 MB in all: more than a 32 MB L3 holds (a larger
#   cache may keep them: gemm_weight_figure leaves such a figure out)
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


def gemm_weight_figure(gemm_gbps: float | None, weight_gbps: float) -> float | None:
    """gemm_weight_gbps as the profile records it: None (the cost model then prices a GEMM's weights at
    weight_gbps) where the chain's weights cost nothing measurable or came in faster than a batch-1 MatMul
    streams weights from memory. A GEMM waits on its weights longer per byte than that (bench_gemm_weights), so
    a faster chain read them from a cache: under a 0.9-core CFS quota here the chain took 3.88 ms against 3.80
    for its twelve layers hot (646 GB/s, weight_gbps 22.3), and priced the transformer's 128-row MatMuls as
    if their weights were free (predicted 77.7 ms a request, measured 99)."""
    return None if gemm_gbps is None or gemm_gbps > weight_gbps else gemm_gbps


# --------------------------------------------------------------------------------------------------
# Per-operator overhead


# One node of trivial work: its time is what any model's run costs regardless of its size.
_ONE_NODE = "op_overhead_us.relu_chain_1"


def relu_chain(length: int) -> bytes:
    names = ["x"] + [f"t{i}" for i in range(length - 1)] + ["y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"relu{i}") for i in range(length)]
    return model(nodes, [vi("x", (1, 16))], [vi("y", (1, 16))])


def dispatch_floor_us(b: Bench) -> Formula:
    """Microseconds per node of a 200-node chain of tiny Relu nodes over a 1-node chain: the pure dispatch
    cost, with graph optimisation off so nothing folds the chain."""
    feeds = {"x": rand(b.rng, 1, 16)}
    off = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    b.add("op_overhead_us.relu_chain_200", relu_chain(200), feeds, off)
    b.add(_ONE_NODE, relu_chain(1), feeds, off)
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
