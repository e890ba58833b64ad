"""The tables of one thread count: op classes the roofline misprices (`op_ms_per_melem`) and the tile efficiency
curves (`efficiency`); each function adds its models to a Bench and returns the formula of its table.  What
each is: see the package docstring."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from onnx import helper, numpy_helper

from .bench import SPREAD_ROUNDS, Bench, Times
from .kernels import GEMM_ROWS, add_gemm, conv_model, gemm_kn, gemm_weights
from .timing import model, rand, sig, vi

__all__ = ["op_table", "conv_positions_curve", "depthwise_curve", "gemm_curve", "OP_TABLE_OPS", "CONV_HEIGHTS",
           "GEMM_ROWS", "MAX_EFFICIENCY", "CONV_POSITION_TILES", "CONV_POSITION_TILES_QUICK",
           "conv_positions_channels", "Curve"]

# A tile faster per FLOP than the large benchmark is possible (cache), but not by more than this; a larger
# ratio means the tile's time was all per-operator overhead, where the cost model's overhead term rules.
MAX_EFFICIENCY = 4.0
CONV_HEIGHTS = (56, 28, 14, 7, 4, 2, 1)

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
        data, shapes = conv_model(c, h, width, w, pad_rows=False)
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
    weights = gemm_weights(b)
    kn = gemm_kn(b.quick)
    points = {}
    for m in (m for m in GEMM_ROWS if m <= GEMM_ROWS[1 if b.quick else 0]):
        points[f"efficiency.gemm.rows_{m}"] = (m * kn, add_gemm(b, f"efficiency.gemm.rows_{m}", m, weights))
    return _curve(points)
