"""A small YOLOv5-style detector: Focus stem (strided Slices + Concat), CSP backbone, upsampling neck, 1x1 heads."""
from __future__ import annotations

import numpy as np
import onnx

from .common import Builder, he_normal, normal, tensor_input

__all__ = ["yolo_focus"]

OPSET = 13
_IMAGE = [1, 3, 320, 320]
_ANCHORS, _CLASSES = 3, 4
_HEAD = _ANCHORS * (5 + _CLASSES)  # per anchor: box (4), objectness, class scores
_WIDTHS = (32, 64, 128, 256)  # YOLOv5s: stem, P2, P3, P4 channels
_END = np.iinfo(np.int64).max  # torch.onnx's end for an open slice `x[..., ::2]`


def _slice(b: Builder, x: str, axis: int, start: int) -> str:
    """x[start::2] along `axis`, one Slice node per axis as torch.onnx exports `x[..., ::2, 1::2]`."""
    key = b.fresh(f"focus.a{axis}s{start}")
    consts = [b.const(f"{key}.{what}", np.array([v], np.int64))
              for what, v in (("starts", start), ("ends", _END), ("axes", axis), ("steps", 2))]
    return b.op("Slice", [x, *consts])


def _focus(b: Builder, x: str, cout: int) -> str:
    """YOLOv5's Focus: the four pixel phases of each 2x2 cell stacked on channels, then a 3x3 conv."""
    phases = [(0, 0), (1, 0), (0, 1), (1, 1)]  # (row, column) offset, in YOLOv5's concat order
    parts = [_slice(b, _slice(b, x, 2, r), 3, c) for r, c in phases]
    return _conv_silu(b, b.op("Concat", parts, axis=1), 4 * _IMAGE[1], cout, 3)


def _conv_silu(b: Builder, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
    """Conv (BatchNorm folded into its bias, as exported) and SiLU as torch.onnx writes it: x * Sigmoid(x)."""
    h = b.conv(x, cin, cout, k, stride=stride)
    return b.op("Mul", [h, b.op("Sigmoid", [h])])


def _c3(b: Builder, x: str, cin: int, cout: int, shortcut: bool = True) -> str:
    """CSP bottleneck: two 1x1 branches, one through a residual 1x1 -> 3x3 bottleneck, concatenated, 1x1."""
    mid = cout // 2
    a = _conv_silu(b, x, cin, mid, 1)
    h = _conv_silu(b, _conv_silu(b, a, mid, mid, 1), mid, mid, 3)
    m = b.op("Add", [a, h]) if shortcut else h
    skip = _conv_silu(b, x, cin, mid, 1)
    return _conv_silu(b, b.op("Concat", [m, skip], axis=1), 2 * mid, cout, 1)


def _head(b: Builder, x: str, cin: int, out: str) -> str:
    """The detection head of one scale: a 1x1 conv to the raw box, objectness and class maps, named `out`."""
    w = b.const(f"{out}.weight", he_normal(b.rng(f"{out}.weight"), (_HEAD, cin, 1, 1), cin))
    bias = b.const(f"{out}.bias", normal(b.rng(f"{out}.bias"), (_HEAD,), 0.01))
    return b.op("Conv", [x, w, bias], name=out, kernel_shape=[1, 1])


def yolo_focus() -> onnx.ModelProto:
    b = Builder("yolo_focus")
    c0, c1, c2, c3 = _WIDTHS
    h = _focus(b, "images", c0)                                     # c0 x 160 x 160
    h = _c3(b, _conv_silu(b, h, c0, c1, 3, stride=2), c1, c1)       # c1 x 80 x 80
    p3 = _c3(b, _conv_silu(b, h, c1, c2, 3, stride=2), c2, c2)      # c2 x 40 x 40
    p4 = _c3(b, _conv_silu(b, p3, c2, c3, 3, stride=2), c3, c3)     # c3 x 20 x 20
    lateral = _conv_silu(b, p4, c3, c2, 1)
    scales = b.const("neck.scales", np.array([1, 1, 2, 2], np.float32))
    up = b.op("Resize", [lateral, "", scales], mode="nearest")     # c2 x 40 x 40
    n3 = _c3(b, b.op("Concat", [up, p3], axis=1), 2 * c2, c2, shortcut=False)
    _head(b, n3, c2, "p3_out")
    _head(b, lateral, c2, "p4_out")
    return b.model([tensor_input("images", np.float32, _IMAGE)],
                   [tensor_input("p3_out", np.float32, [1, _HEAD, 40, 40]),
                    tensor_input("p4_out", np.float32, [1, _HEAD, 20, 20])], OPSET, "yolo_focus")
