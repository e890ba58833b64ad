"""Fit BatchNormalization mean/var to the activations they see, so random deep nets stay well-scaled."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .common import fill_tensor, rng_for

# Quarter-octave steps, written out so every machine computes the same float32 values.
_STEPS = np.array([1.0, 1.189207115002721, 1.4142135623730951, 1.681792830507429], np.float32)
# Floor on a channel's variance, relative to the layer's mean variance, so dead channels are not blown up.
_VAR_FLOOR = 1e-3


def quantize_std(std: np.ndarray) -> np.ndarray:
    """Rounds to a quarter-octave grid, so last-bit float differences between machines or thread
    counts almost never change the bytes (only a statistic within ~1e-6 of a grid edge would)."""
    k = np.round(4 * np.log2(np.maximum(std, 1e-30))).astype(np.int64)
    return np.ldexp(_STEPS[k % 4], (k // 4).astype(np.int32)).astype(np.float32)


def quantize_mean(mean: np.ndarray, std_q: np.ndarray) -> np.ndarray:
    return (np.round(mean / std_q * 8) / 8).astype(np.float32) * std_q


def _stats_graph(model: onnx.ModelProto, bn_names: set[str]) -> tuple[onnx.ModelProto, list[str]]:
    """Copy of `model` where each chosen BN sees its input normalised per channel, plus the stats as outputs.

    Normalising inside the graph gives every layer's statistics as if all upstream BNs were already
    calibrated, so a single forward pass suffices instead of one per layer.
    """
    calib = onnx.ModelProto()
    calib.CopyFrom(model)
    opset = next(o.version for o in calib.opset_import if o.domain in ("", "ai.onnx"))
    g = calib.graph
    nodes: list[onnx.NodeProto] = []
    outputs: list[str] = []
    floor = "calib__floor"
    nodes.append(helper.make_node("Constant", [], [floor], value=numpy_helper.from_array(
        np.array(_VAR_FLOOR, np.float32), floor)))
    for n in g.node:
        if n.op_type == "BatchNormalization" and n.name in bn_names:
            p = f"calib__{n.output[0]}__"
            nodes += _normalize_nodes(n.input[0], p, opset)
            n.input[0] = p + "norm"
            outputs += [p + "mean", p + "std"]
        nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    g.output.extend(helper.make_value_info(o, onnx.TypeProto()) for o in outputs)
    return calib, outputs


def _normalize_nodes(x: str, p: str, opset: int) -> list[onnx.NodeProto]:
    def mean(inp: str, out: str, axes: list[int] | None) -> list[onnx.NodeProto]:
        if axes is None:
            return [helper.make_node("ReduceMean", [inp], [out], keepdims=1)]
        if opset >= 18:  # axes moved from attribute to input
            ax = helper.make_node("Constant", [], [out + "_axes"],
                                  value=numpy_helper.from_array(np.array(axes, np.int64)))
            return [ax, helper.make_node("ReduceMean", [inp, out + "_axes"], [out], keepdims=1)]
        return [helper.make_node("ReduceMean", [inp], [out], axes=axes, keepdims=1)]

    axes = [0, 2, 3]  # every calibrated BN follows a 2-D conv: NCHW, per-channel statistics
    return [
        *mean(x, p + "mean", axes),
        helper.make_node("Sub", [x, p + "mean"], [p + "xc"]),
        helper.make_node("Mul", [p + "xc", p + "xc"], [p + "sq"]),
        *mean(p + "sq", p + "var", axes),
        *mean(p + "var", p + "mvar", None),
        helper.make_node("Mul", [p + "mvar", "calib__floor"], [p + "fl"]),
        helper.make_node("Add", [p + "var", p + "fl"], [p + "vf"]),
        helper.make_node("Sqrt", [p + "vf"], [p + "std"]),
        helper.make_node("Div", [p + "xc", p + "std"], [p + "norm"]),
    ]


def _name_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Zoo graphs leave node names empty; BN nodes need one to be picked out. Returns those named."""
    named = []
    for i, n in enumerate(model.graph.node):
        if n.op_type == "BatchNormalization" and not n.name:
            n.name = f"calib__bn{i}"
            named.append(n)
    return named


def calibrate_batchnorm(model: onnx.ModelProto, bn_nodes: Iterable[onnx.NodeProto], seed_name: str) -> None:
    """Rewrites mean/var of `bn_nodes` in place: mean = mu + m*sigma, var = v*sigma^2.

    m and v are the random values already there, (mu, sigma) the measured per-channel statistics
    of the BN input on a seeded N(0,1) input, so each BN behaves like a random BN on a standardised
    input. Mean and var must be initializers.
    """
    import onnxruntime as ort

    bns = list(bn_nodes)
    if not bns:
        return
    named = _name_nodes(model)
    calib, outputs = _stats_graph(model, {n.name for n in bns})
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # zoo graphs warn about their unused initializers
    sess = ort.InferenceSession(calib.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    stats = sess.run(outputs, _feeds(sess, seed_name))
    inits = {t.name: t for t in model.graph.initializer}
    for i, n in enumerate(bns):
        mean, std = stats[2 * i].ravel(), stats[2 * i + 1].ravel()
        std_q = quantize_std(std)
        _update(inits[n.input[3]], lambda m: quantize_mean(mean, std_q) + m * std_q)
        _update(inits[n.input[4]], lambda v: v * std_q * std_q)
    for n in named:
        n.name = ""


def _update(t: onnx.TensorProto, fn) -> None:
    fill_tensor(t, t.name, fn(numpy_helper.to_array(t)).astype(np.float32))


def _feeds(sess, seed_name: str) -> dict[str, np.ndarray]:
    rng = rng_for(seed_name, "calibration-input")
    return {i.name: rng.standard_normal(i.shape, dtype=np.float32) for i in sess.get_inputs()
            if i.type == "tensor(float)" and all(isinstance(d, int) for d in i.shape)}
