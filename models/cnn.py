"""VGG-16 and MobileNetV2 with torchvision's layer layout, built with onnx.helper at opset 13."""
from __future__ import annotations

import numpy as np
import onnx

from .calibrate import calibrate_batchnorm
from .common import Builder, tensor_input

OPSET = 13
_IMAGE = [1, 3, 224, 224]

_VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]

# MobileNetV2 inverted-residual settings: expand ratio t, channels c, repeats n, first stride s.
_MBV2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
         (6, 160, 3, 2), (6, 320, 1, 1)]


def vgg16() -> onnx.ModelProto:
    b = Builder("vgg16")
    h, cin = "input", 3
    for v in _VGG16:
        if v == "M":
            h = b.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
        else:
            h, cin = b.op("Relu", [b.conv(h, cin, v, 3)]), v
    # torchvision's AdaptiveAvgPool2d((7, 7)) is the identity at 224x224, so it is left out;
    # Dropout is a no-op in inference and is left out as an eval-mode export would.
    h = b.op("Flatten", [h], axis=1)
    h = b.op("Relu", [b.gemm(h, 512 * 7 * 7, 4096)])
    h = b.op("Relu", [b.gemm(h, 4096, 4096)])
    out = b.gemm(h, 4096, 1000, out="logits")
    return b.model([tensor_input("input", np.float32, _IMAGE)],
                   [tensor_input(out, np.float32, [1, 1000])], OPSET, "vgg16")


def _conv_bn(b: Builder, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
             relu6: bool = True) -> str:
    h = b.bn(b.conv(x, cin, cout, k, stride=stride, group=group, bias=False), cout)
    return b.clip6(h) if relu6 else h


def _inverted_residual(b: Builder, x: str, cin: int, cout: int, stride: int, t: int) -> str:
    hidden = cin * t
    h = _conv_bn(b, x, cin, hidden, 1) if t != 1 else x
    h = _conv_bn(b, h, hidden, hidden, 3, stride=stride, group=hidden)  # depthwise
    h = _conv_bn(b, h, hidden, cout, 1, relu6=False)  # linear bottleneck
    return b.op("Add", [x, h]) if stride == 1 and cin == cout else h


def mobilenetv2() -> onnx.ModelProto:
    b = Builder("mobilenetv2")
    h, cin = _conv_bn(b, "input", 3, 32, 3, stride=2), 32
    for t, c, n, s in _MBV2:
        for i in range(n):
            h, cin = _inverted_residual(b, h, cin, c, s if i == 0 else 1, t), c
    h = _conv_bn(b, h, cin, 1280, 1)
    h = b.op("Flatten", [b.op("GlobalAveragePool", [h])], axis=1)
    out = b.gemm(h, 1280, 1000, out="logits")
    model = b.model([tensor_input("input", np.float32, _IMAGE)],
                    [tensor_input(out, np.float32, [1, 1000])], OPSET, "mobilenetv2")
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    calibrate_batchnorm(model, bns, "mobilenetv2")
    return model
