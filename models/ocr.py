"""A PP-OCRv3-style text recogniser (SVTR-LCNet): a depthwise backbone with SE, an SVTR neck, a CTC head.

The shape of what paddle2onnx exports for PP-OCRv3's recogniser: BatchNormalization nodes after the
convolutions, HardSwish and HardSigmoid, squeeze-and-excitation blocks, strides of (2, 1) that keep the
text line's width, then four global-attention transformer blocks over the width and a MatMul head with
per-step class logits (CTC). Width and depth are scaled down so that it runs in a second on a CPU.
"""
from __future__ import annotations

import numpy as np
import onnx

from .calibrate import calibrate_batchnorm
from .common import Builder, he_normal, normal, tensor_input, uniform

__all__ = ["ocr_rec"]

OPSET = 17  # LayerNormalization
_IMAGE = [1, 3, 48, 320]  # PP-OCRv3's recogniser input: a 48-pixel text line, 320 wide
_CLASSES = 97  # 95 printable ASCII characters, space, and the CTC blank
_STEPS = 40  # width after the backbone: one CTC step per 8 input columns
# depthwise-separable blocks: (channels out, stride (h, w), depthwise kernel, squeeze-excitation)
_BLOCKS = [(32, (1, 1), 3, False), (64, (2, 2), 3, False), (64, (1, 1), 3, False), (128, (2, 1), 3, False),
           (128, (1, 1), 3, False), (256, (2, 1), 3, False), *[(256, (1, 1), 5, False)] * 3,
           *[(256, (1, 1), 5, True)] * 6, (512, (2, 1), 5, True), *[(512, (1, 1), 5, True)] * 4]
_CALIBRATE_AT_ONCE = 4
_DIM, _HEADS, _MLP, _DEPTH = 120, 8, 240, 4  # SVTR neck: width, attention heads, feed-forward width, blocks


def _conv_bn(b: Builder, x: str, cin: int, cout: int, k, stride=(1, 1), group: int = 1, act: str | None = "hs") -> str:
    """Conv without bias, BatchNormalization, then HardSwish ("hs"), Swish ("swish") or nothing."""
    kh, kw = (k, k) if isinstance(k, int) else k
    name = b.fresh("conv")
    w = b.const(f"{name}.weight", he_normal(b.rng(f"{name}.weight"), (cout, cin // group, kh, kw), cin // group * kh * kw))
    h = b.op("Conv", [x, w], name=name, kernel_shape=[kh, kw], strides=list(stride),
             pads=[kh // 2, kw // 2, kh // 2, kw // 2], group=group)
    h = b.bn(h, cout)
    if act == "hs":
        return b.op("HardSwish", [h])
    if act == "swish":
        return b.op("Mul", [h, b.op("Sigmoid", [h])])
    return h


def _se(b: Builder, x: str, c: int) -> str:
    """Squeeze-and-excitation as PP-LCNet writes it: pool, 1x1 reduce, ReLU, 1x1 expand, HardSigmoid, scale."""
    s = b.op("GlobalAveragePool", [x])
    s = b.op("Relu", [b.conv(s, c, c // 4, 1, pad=0)])
    name = b.fresh("se")
    # gates mostly open, as in a trained net: random gates around 0.5 would shrink one input's channels and
    # not another's at every block, and the backbone would amplify the difference layer after layer
    w = b.const(f"{name}.weight", he_normal(b.rng(f"{name}.weight"), (c, c // 4, 1, 1), c // 4) * np.float32(0.25))
    bias = b.const(f"{name}.bias", uniform(b.rng(f"{name}.bias"), (c,), 1.0, 3.0))
    s = b.op("HardSigmoid", [b.op("Conv", [s, w, bias], name=name, kernel_shape=[1, 1])], alpha=1.0 / 6, beta=0.5)
    return b.op("Mul", [x, s])


def _backbone(b: Builder, x: str) -> tuple[str, int]:
    h, cin = _conv_bn(b, x, 3, 16, 3, stride=(2, 2)), 16
    for cout, stride, k, se in _BLOCKS:
        h = _conv_bn(b, h, cin, cin, k, stride=stride, group=cin)  # depthwise
        if se:
            h = _se(b, h, cin)
        h, cin = _conv_bn(b, h, cin, cout, 1), cout  # pointwise
    return b.op("AveragePool", [h], kernel_shape=[2, 2], strides=[2, 2]), cin  # 1 x 40


def _param(b: Builder, name: str, shape, std: float = 0.02) -> str:
    return b.const(name, normal(b.rng(name), shape, std))


def _linear(b: Builder, x: str, cin: int, cout: int) -> str:
    name = b.fresh("linear")
    w = b.const(f"{name}.weight", he_normal(b.rng(f"{name}.weight"), (cin, cout), cin) * np.float32(0.5))
    return b.op("Add", [b.op("MatMul", [x, w]), _param(b, f"{name}.bias", (cout,))])


def _layer_norm(b: Builder, x: str) -> str:
    name = b.fresh("ln")
    gamma = b.const(f"{name}.scale", uniform(b.rng(f"{name}.scale"), (_DIM,), 0.8, 1.2))
    return b.op("LayerNormalization", [x, gamma, _param(b, f"{name}.bias", (_DIM,))], axis=-1, epsilon=1e-6)


def _heads(b: Builder, x: str, transpose) -> str:
    """[1, steps, dim] -> [1, heads, steps, dim / heads] (or its transpose for the keys)."""
    shape = b.const(b.fresh("heads.shape"), np.array([1, _STEPS, _HEADS, _DIM // _HEADS], np.int64))
    return b.op("Transpose", [b.op("Reshape", [x, shape])], perm=transpose)


def _attention(b: Builder, x: str) -> str:
    q, k, v = (_linear(b, x, _DIM, _DIM) for _ in range(3))
    q, k, v = _heads(b, q, [0, 2, 1, 3]), _heads(b, k, [0, 2, 3, 1]), _heads(b, v, [0, 2, 1, 3])
    scores = b.op("Mul", [b.op("MatMul", [q, k]), b.scalar("attn.scale", (_DIM // _HEADS) ** -0.5)])
    h = b.op("Transpose", [b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])], perm=[0, 2, 1, 3])
    h = b.op("Reshape", [h, b.const(b.fresh("merge.shape"), np.array([1, _STEPS, _DIM], np.int64))])
    return _linear(b, h, _DIM, _DIM)


def _svtr_block(b: Builder, x: str) -> str:
    """Pre-norm global mixing block: attention, then a Swish MLP, each with a residual."""
    x = b.op("Add", [x, _attention(b, _layer_norm(b, x))])
    h = _linear(b, _layer_norm(b, x), _DIM, _MLP)
    h = _linear(b, b.op("Mul", [h, b.op("Sigmoid", [h])]), _MLP, _DIM)
    return b.op("Add", [x, h])


def _neck(b: Builder, x: str, cin: int) -> tuple[str, int]:
    """EncoderWithSVTR: local convs, global blocks over the width, back to a map, fused with the input."""
    h = _conv_bn(b, x, cin, cin // 8, 3, act="swish")
    h = _conv_bn(b, h, cin // 8, _DIM, 1, act="swish")
    seq = b.op("Transpose", [b.op("Reshape", [h, b.const("neck.flat", np.array([1, _DIM, _STEPS], np.int64))])],
               perm=[0, 2, 1])
    for _ in range(_DEPTH):
        seq = _svtr_block(b, seq)
    seq = _layer_norm(b, seq)
    h = b.op("Reshape", [b.op("Transpose", [seq], perm=[0, 2, 1]),
                         b.const("neck.map", np.array([1, _DIM, 1, _STEPS], np.int64))])
    h = _conv_bn(b, h, _DIM, cin, 1, act="swish")
    h = _conv_bn(b, b.op("Concat", [x, h], axis=1), 2 * cin, cin // 8, (1, 3), act="swish")
    return _conv_bn(b, h, cin // 8, 64, 1, act="swish"), 64


def ocr_rec() -> onnx.ModelProto:
    b = Builder("ocr_rec")
    h, c = _backbone(b, "image")
    h, c = _neck(b, h, c)
    seq = b.op("Transpose", [b.op("Squeeze", [h, b.const("head.axes", np.array([2], np.int64))])], perm=[0, 2, 1])
    w = b.const("head.weight", he_normal(b.rng("head.weight"), (c, _CLASSES), c) * np.float32(0.3))
    b.op("Add", [b.op("MatMul", [seq, w]), _param(b, "head.bias", (_CLASSES,), 0.01)], name="logits")
    model = b.model([tensor_input("image", np.float32, _IMAGE)],
                    [tensor_input("logits", np.float32, [1, _STEPS, _CLASSES])], OPSET, "ocr_rec")
    # HardSwish grows faster than its input, so a BN's quantised statistics (calibrate.py) err more at every
    # layer after it: calibrated a few at a time, in graph order, each BN sees its calibrated predecessors
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    for k in range(0, len(bns), _CALIBRATE_AT_ONCE):
        calibrate_batchnorm(model, bns[k:k + _CALIBRATE_AT_ONCE], "ocr_rec")
    return model
