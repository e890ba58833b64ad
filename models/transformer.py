"""A DistilBERT-style encoder built with onnx.helper (no torch), full size and a tiny variant."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from .common import Builder, normal, tensor_input, uniform

# LayerNormalization needs opset 17. Gelu is spelled with Erf: the Gelu op needs opset 20, which
# older runtimes and our compiler's ingest need not support, while the Erf pattern is what
# torch.onnx exports and what onnxruntime fuses back into one Gelu kernel.
OPSET = 17


@dataclass(frozen=True)
class Config:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    max_positions: int
    init_std: float  # std of the N(0, std) weights


CONFIGS = {
    "transformer": Config(layers=6, hidden=768, heads=12, seq=128, vocab=30522, max_positions=512,
                          init_std=0.02),
    # At hidden 64, BERT's 0.02 leaves attention almost uniform, which would hide errors in the
    # scores; 1/sqrt(hidden) gives q.k of order one, so softmax rows are clearly peaked.
    "tinytransformer": Config(layers=2, hidden=64, heads=4, seq=16, vocab=100, max_positions=64,
                              init_std=0.125),
}


def build(name: str) -> onnx.ModelProto:
    cfg = CONFIGS[name]
    b = Builder(name)
    x = _embeddings(b, cfg)
    mask_bias = _mask_bias(b, cfg)
    for i in range(cfg.layers):
        x = _layer(b, cfg, x, mask_bias, f"layer{i}")
    b.nodes[-1].output[0] = "last_hidden_state"  # the last LayerNorm is the graph output
    ids = [tensor_input(n, np.int64, [1, cfg.seq]) for n in ("input_ids", "attention_mask")]
    out = tensor_input("last_hidden_state", np.float32, [1, cfg.seq, cfg.hidden])
    return b.model(ids, [out], OPSET, name)


def _weight(b: Builder, cfg: Config, name: str, shape: tuple[int, ...]) -> str:
    return b.const(name, normal(b.rng(name), shape, cfg.init_std))


def _embeddings(b: Builder, cfg: Config) -> str:
    words = b.op("Gather", [_weight(b, cfg, "embeddings.word", (cfg.vocab, cfg.hidden)), "input_ids"],
                 axis=0)
    pos_ids = b.const("embeddings.position_ids", np.arange(cfg.seq, dtype=np.int64)[None, :])
    pos_table = _weight(b, cfg, "embeddings.position", (cfg.max_positions, cfg.hidden))
    pos = b.op("Gather", [pos_table, pos_ids], axis=0)
    return _layer_norm(b, cfg, b.op("Add", [words, pos]), "embeddings.ln")


def _mask_bias(b: Builder, cfg: Config) -> str:
    """(1 - mask) * -1e4 as [1,1,1,seq], computed once and added to every layer's scores."""
    m = b.op("Cast", ["attention_mask"], to=onnx.TensorProto.FLOAT)
    bias = b.op("Mul", [b.op("Sub", [b.scalar("mask.one", 1.0), m]), b.scalar("mask.neg", -1e4)])
    return b.op("Reshape", [bias, b.const("mask.shape", np.array([1, 1, 1, cfg.seq], np.int64))])


def _layer_norm(b: Builder, cfg: Config, x: str, name: str) -> str:
    gamma = b.const(f"{name}.gamma", uniform(b.rng(f"{name}.gamma"), (cfg.hidden,), 0.8, 1.2))
    beta = b.const(f"{name}.beta", normal(b.rng(f"{name}.beta"), (cfg.hidden,), cfg.init_std))
    return b.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)


def _linear(b: Builder, cfg: Config, x: str, cin: int, cout: int, name: str) -> str:
    h = b.op("MatMul", [x, _weight(b, cfg, f"{name}.weight", (cin, cout))])
    return b.op("Add", [h, _weight(b, cfg, f"{name}.bias", (cout,))])


def _layer(b: Builder, cfg: Config, x: str, mask_bias: str, name: str) -> str:
    x = _layer_norm(b, cfg, b.op("Add", [x, _attention(b, cfg, x, mask_bias, f"{name}.attn")]),
                    f"{name}.ln1")
    h = _linear(b, cfg, x, cfg.hidden, 4 * cfg.hidden, f"{name}.ffn1")
    h = _linear(b, cfg, _gelu(b, h), 4 * cfg.hidden, cfg.hidden, f"{name}.ffn2")
    return _layer_norm(b, cfg, b.op("Add", [x, h]), f"{name}.ln2")


def _attention(b: Builder, cfg: Config, x: str, mask_bias: str, name: str) -> str:
    dh = cfg.hidden // cfg.heads
    split = b.const(f"{name}.split_shape", np.array([1, cfg.seq, cfg.heads, dh], np.int64))
    merge = b.const(f"{name}.merge_shape", np.array([1, cfg.seq, cfg.hidden], np.int64))

    def heads(proj: str, perm: list[int]) -> str:
        h = _linear(b, cfg, x, cfg.hidden, cfg.hidden, f"{name}.{proj}")
        return b.op("Transpose", [b.op("Reshape", [h, split])], perm=perm)

    q = heads("q", [0, 2, 1, 3])  # [1, heads, seq, dh]
    k = heads("k", [0, 2, 3, 1])  # [1, heads, dh, seq]
    v = heads("v", [0, 2, 1, 3])
    scale = b.scalar("attn.scale", 1.0 / math.sqrt(dh))
    scores = b.op("Add", [b.op("Mul", [b.op("MatMul", [q, k]), scale]), mask_bias])
    ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge])
    return _linear(b, cfg, ctx, cfg.hidden, cfg.hidden, f"{name}.out")


def _gelu(b: Builder, x: str) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2)))."""
    e = b.op("Erf", [b.op("Mul", [x, b.scalar("gelu.inv_sqrt2", 1 / math.sqrt(2))])])
    e = b.op("Add", [e, b.scalar("gelu.one", 1.0)])
    return b.op("Mul", [b.op("Mul", [x, e]), b.scalar("gelu.half", 0.5)])
