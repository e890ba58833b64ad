"""Decoder-only language models (Llama/Qwen2 layout) with a KV cache, in optimum's onnxruntime form.

Inputs: `input_ids` [batch, seq], `attention_mask` [batch, past+seq], `position_ids` [batch, seq] (int64)
and `past_key_values.{i}.key/value` [batch, kv_heads, past, head_dim]; outputs `logits` [batch, seq,
vocab] and `present.{i}.key/value` [batch, kv_heads, past+seq, head_dim]. A first step feeds an empty
past (past = 0). Each layer: RMSNorm, rotary q/k, grouped-query attention under the causal and padding
mask, RMSNorm, SwiGLU; then a final RMSNorm and an untied head. Plain ONNX ops only (no contrib ops).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.numpy_helper

from .common import Builder, normal, tensor_input, uniform

__all__ = ["Config", "CONFIGS", "build", "parameter_count"]

OPSET = 17  # as the encoder; ReduceMean still takes its axes as an attribute here
# Added to the scores of masked keys: exp() of it is exactly 0, and unlike finfo.min it cannot
# overflow to -inf when added to a score, so a row with every key masked stays finite.
_MASKED = -1e9


@dataclass(frozen=True)
class Config:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


CONFIGS = {
    # ~11.5M parameters: fast enough for unit tests, 46 MB on disk.
    "tinylm": Config(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=768, vocab=16384,
                     rope_theta=10000.0),
    # Qwen2.5-0.5B's body (24 layers, hidden 896, 14 heads / 2 KV heads, SwiGLU 4864, theta 1e6) with a
    # 64k vocabulary and an untied head: ~473M parameters, 1.9 GB, under protobuf's 2 GB limit for a
    # single file (Qwen's 152k vocabulary untied would not fit).
    "lm500m": Config(layers=24, hidden=896, heads=14, kv_heads=2, intermediate=4864, vocab=64000,
                     rope_theta=1e6),
}


def parameter_count(cfg: Config) -> int:
    """Weights the builder creates for `cfg` (embedding, layers, final norm, head)."""
    kv = cfg.kv_heads * cfg.head_dim
    layer = 2 * cfg.hidden * cfg.hidden + 2 * cfg.hidden * kv + 3 * cfg.hidden * cfg.intermediate + 2 * cfg.hidden
    return 2 * cfg.vocab * cfg.hidden + cfg.layers * layer + cfg.hidden


def build(name: str) -> onnx.ModelProto:
    cfg = CONFIGS[name]
    b = _Builder(name)
    x = b.op("Gather", [_weight(b, "embed_tokens", (cfg.vocab, cfg.hidden), 1.0), "input_ids"], axis=0)
    cos, sin = _rotary(b, cfg)
    bias = _mask_bias(b)
    for i in range(cfg.layers):
        x = _layer(b, cfg, x, cos, sin, bias, i)
    x = _rms_norm(b, cfg, x, "norm")
    # Logits of std ~2, like a trained model's: a clear argmax, a softmax that is not flat.
    b.op("MatMul", [x, _weight(b, "lm_head", (cfg.hidden, cfg.vocab), 2 / math.sqrt(cfg.hidden))],
         name="logits")
    return b.model(_inputs(cfg), _outputs(cfg), OPSET, name)


def _inputs(cfg: Config) -> list[onnx.ValueInfoProto]:
    cache = [tensor_input(f"past_key_values.{i}.{kv}", np.float32,
                          ["batch", cfg.kv_heads, "past_sequence_length", cfg.head_dim])
             for i in range(cfg.layers) for kv in ("key", "value")]
    return [tensor_input("input_ids", np.int64, ["batch", "sequence_length"]),
            tensor_input("attention_mask", np.int64, ["batch", "total_sequence_length"]),
            tensor_input("position_ids", np.int64, ["batch", "sequence_length"]), *cache]


def _outputs(cfg: Config) -> list[onnx.ValueInfoProto]:
    cache = [tensor_input(f"present.{i}.{kv}", np.float32,
                          ["batch", cfg.kv_heads, "total_sequence_length", cfg.head_dim])
             for i in range(cfg.layers) for kv in ("key", "value")]
    return [tensor_input("logits", np.float32, ["batch", "sequence_length", cfg.vocab]), *cache]


def _weight(b: Builder, name: str, shape: tuple[int, ...], std: float) -> str:
    return b.const(name, normal(b.rng(name), shape, std))


class _Builder(Builder):
    """Builder whose int64 constants (shapes, axes) are shared by name across layers."""

    def __init__(self, seed_name: str):
        super().__init__(seed_name)
        self._ints: dict[str, list[int]] = {}

    def ints(self, name: str, values: list[int]) -> str:
        if name not in self._ints:
            self._ints[name] = values
            self.const(name, np.array(values, np.int64))
        elif self._ints[name] != values:
            raise ValueError(f"constant {name!r} asked for with two values")
        return name


def _ints(b: _Builder, name: str, values: list[int]) -> str:
    return b.ints(name, values)


def _rotary(b: Builder, cfg: Config) -> tuple[str, str]:
    """cos and sin of position * inv_freq, [batch, 1, seq, head_dim], shared by every layer."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(half, dtype=np.float64) / half)
    pos = b.op("Unsqueeze", [b.op("Cast", ["position_ids"], to=onnx.TensorProto.FLOAT),
                             _ints(b, "rope.axis_last", [-1])])
    freqs = b.op("Mul", [pos, b.const("rope.inv_freq", inv_freq.astype(np.float32))])  # [B, S, half]
    angles = b.op("Unsqueeze", [b.op("Concat", [freqs, freqs], axis=-1), _ints(b, "rope.axis_heads", [1])])
    return b.op("Cos", [angles], name="rope.cos"), b.op("Sin", [angles], name="rope.sin")


def _mask_bias(b: Builder) -> str:
    """0 where query i may see key j, _MASKED elsewhere, [batch, 1, 1, seq, total].

    Query i sits at cache slot past + i (past = total - seq); it sees key j if j <= past + i
    (causal) and attention_mask[:, j] is 1 (padding). The extra axis broadcasts over the query
    groups that share a KV head.
    """
    zero, one = _scalar_int(b, "mask.zero", 0), _scalar_int(b, "mask.one", 1)
    total = b.op("Gather", [b.op("Shape", ["attention_mask"]), one], axis=0)
    seq = b.op("Gather", [b.op("Shape", ["input_ids"]), one], axis=0)
    keys = b.op("Range", [zero, total, one])  # [T]
    queries = b.op("Range", [b.op("Sub", [total, seq]), total, one])  # [S]: past + i
    causal = b.op("LessOrEqual", [keys, b.op("Unsqueeze", [queries, _ints(b, "mask.axis_col", [1])])])
    padding = b.op("Cast", ["attention_mask"], to=onnx.TensorProto.BOOL)  # [B, T]
    padding = b.op("Unsqueeze", [padding, _ints(b, "mask.axes_pad", [1, 2, 3])])  # [B, 1, 1, 1, T]
    allowed = b.op("And", [causal, padding])
    return b.op("Where", [allowed, b.scalar("mask.keep", 0.0), b.scalar("mask.masked", _MASKED)],
                name="mask.bias")


def _scalar_int(b: Builder, name: str, value: int) -> str:
    """A rank-0 int64 (Range wants true scalars; initializers written by fill_tensor are rank 1)."""
    tensor = onnx.numpy_helper.from_array(np.array(value, np.int64), name)
    b.nodes.append(onnx.helper.make_node("Constant", [], [name], name=name, value=tensor))
    return name


def _rms_norm(b: Builder, cfg: Config, x: str, name: str) -> str:
    """x / sqrt(mean(x^2) + eps) * weight, spelled as HF's exporters spell it."""
    ms = b.op("ReduceMean", [b.op("Mul", [x, x])], axes=[-1], keepdims=1)
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [ms, b.scalar("rms.eps", cfg.eps)])])])
    weight = b.const(f"{name}.weight", uniform(b.rng(f"{name}.weight"), (cfg.hidden,), 0.8, 1.2))
    return b.op("Mul", [b.op("Mul", [x, inv]), weight])


def _layer(b: Builder, cfg: Config, x: str, cos: str, sin: str, bias: str, i: int) -> str:
    name = f"layers.{i}"
    # Output projections are scaled down with depth so the residual stream keeps its size.
    out_std = 1 / math.sqrt(2 * cfg.layers)
    h = _attention(b, cfg, _rms_norm(b, cfg, x, f"{name}.input_norm"), cos, sin, bias, i)
    x = b.op("Add", [x, b.op("MatMul", [h, _weight(b, f"{name}.o_proj", (cfg.hidden, cfg.hidden),
                                                        out_std / math.sqrt(cfg.hidden))])])
    h = _rms_norm(b, cfg, x, f"{name}.post_attention_norm")
    gate, up = (b.op("MatMul", [h, _weight(b, f"{name}.{p}_proj", (cfg.hidden, cfg.intermediate),
                                           1 / math.sqrt(cfg.hidden))]) for p in ("gate", "up"))
    act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])  # SiLU(gate) * up
    down = _weight(b, f"{name}.down_proj", (cfg.intermediate, cfg.hidden), out_std / math.sqrt(cfg.intermediate))
    return b.op("Add", [x, b.op("MatMul", [act, down])])


def _attention(b: Builder, cfg: Config, x: str, cos: str, sin: str, bias: str, i: int) -> str:
    name, dh, groups = f"layers.{i}", cfg.head_dim, cfg.heads // cfg.kv_heads

    def project(proj: str, heads: int) -> str:  # [B, heads, S, dh]
        w = _weight(b, f"{name}.{proj}_proj", (cfg.hidden, heads * dh), 1 / math.sqrt(cfg.hidden))
        h = b.op("Reshape", [b.op("MatMul", [x, w]), _ints(b, f"attn.split{heads}", [0, 0, heads, dh])])
        return b.op("Transpose", [h], perm=[0, 2, 1, 3])

    q = _rotate(b, project("q", cfg.heads), cos, sin, dh)
    k = _rotate(b, project("k", cfg.kv_heads), cos, sin, dh)
    k = b.op("Concat", [f"past_key_values.{i}.key", k], axis=2, name=f"present.{i}.key")
    v = b.op("Concat", [f"past_key_values.{i}.value", project("v", cfg.kv_heads)], axis=2,
             name=f"present.{i}.value")
    # Query head h reads KV head h // groups (HF's repeat_kv): group the queries instead of
    # copying the cache, [B, kv_heads, groups, S, dh] against [B, kv_heads, 1, T, dh].
    q = b.op("Reshape", [q, _ints(b, "attn.group_q", [0, cfg.kv_heads, groups, -1, dh])])
    kt = b.op("Unsqueeze", [b.op("Transpose", [k], perm=[0, 1, 3, 2]), _ints(b, "attn.axis_group", [2])])
    scores = b.op("Mul", [b.op("MatMul", [q, kt]), b.scalar("attn.scale", 1 / math.sqrt(dh))])
    probs = b.op("Softmax", [b.op("Add", [scores, bias])], axis=-1)
    ctx = b.op("MatMul", [probs, b.op("Unsqueeze", [v, _ints(b, "attn.axis_group", [2])])])
    ctx = b.op("Reshape", [ctx, _ints(b, "attn.merge_heads", [0, cfg.heads, -1, dh])])
    ctx = b.op("Transpose", [ctx], perm=[0, 2, 1, 3])
    return b.op("Reshape", [ctx, _ints(b, "attn.merge", [0, 0, cfg.hidden])])


def _rotate(b: Builder, x: str, cos: str, sin: str, dh: int) -> str:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1) of the two halves."""
    half = _ints(b, "rope.halves", [dh // 2, dh // 2])
    x1, x2 = f"{x}.lo", f"{x}.hi"
    b.nodes.append(onnx.helper.make_node("Split", [x, half], [x1, x2], name=f"{x}.split", axis=-1))
    rotated = b.op("Concat", [b.op("Neg", [x2]), x1], axis=-1)
    return b.op("Add", [b.op("Mul", [x, cos]), b.op("Mul", [rotated, sin])])
