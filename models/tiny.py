"""Small, fast models for unit and end-to-end tests: tinyconv, tinychain and dynamic."""
from __future__ import annotations

import numpy as np
import onnx

from .calibrate import calibrate_batchnorm
from .common import Builder, tensor_input

OPSET = 13


def tinyconv() -> onnx.ModelProto:
    """Every spatial op a tiler must get right, on sizes (37x29) that no power of two divides."""
    b = Builder("tinyconv")
    x = "input"
    c1 = b.op("Relu", [b.bn(b.conv(x, 3, 16, 3, stride=2), 16)])  # 16x19x15
    c2 = b.clip6(b.bn(b.conv(c1, 16, 16, 3, dilation=2), 16))  # padding 2 keeps 19x15
    r = b.op("Add", [c1, c2])  # residual of equal shapes
    p = b.op("MaxPool", [r], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])  # 16x10x8
    grouped = b.op("Relu", [b.conv(p, 16, 16, 3, group=4)])
    avg = b.op("AveragePool", [p], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    depthwise = b.op("Relu", [b.conv(b.conv(avg, 16, 16, 3, group=16), 16, 8, 1)])
    cat = b.op("Concat", [grouped, depthwise], axis=1)  # 24x10x8
    head = b.op("Relu", [b.conv(cat, 24, 32, 3, stride=2, pad=0)])  # unpadded, odd stride: 32x4x3
    flat = b.op("Flatten", [b.op("GlobalAveragePool", [head])], axis=1)
    out = b.op("Softmax", [b.gemm(flat, 32, 10)], name="probs", axis=-1)
    model = b.model([tensor_input(x, np.float32, [1, 3, 37, 29])],
                    [tensor_input(out, np.float32, [1, 10])], OPSET, "tinyconv")
    calibrate_batchnorm(model, [n for n in model.graph.node if n.op_type == "BatchNormalization"],
                        "tinyconv")
    return model


def _chain(batch: int | str) -> onnx.ModelProto:
    # Seeded as "tinychain" for both variants so `dynamic` computes exactly what tinychain does.
    b = Builder("tinychain")
    x = "input"
    widths = [3, 8, 8, 16, 16, 16, 32, 32, 32]
    strides = [1, 1, 2, 1, 1, 2, 1, 1]  # 32x32 -> 8x8
    h = x
    for cin, cout, s in zip(widths, widths[1:], strides):
        h = b.op("Relu", [b.conv(h, cin, cout, 3, stride=s)])
    flat = b.op("Flatten", [h], axis=1)
    out = b.gemm(flat, 32 * 8 * 8, 10, out="logits")
    graph_name = "tinychain" if batch == 1 else "dynamic"
    return b.model([tensor_input(x, np.float32, [batch, 3, 32, 32])],
                   [tensor_input(out, np.float32, [batch, 10])], OPSET, graph_name)


def tinychain() -> onnx.ModelProto:
    return _chain(1)


def dynamic() -> onnx.ModelProto:
    return _chain("N")
