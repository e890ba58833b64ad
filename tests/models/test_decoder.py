"""Decoder LMs (models/decoder.py): the KV cache reproduces cache-free runs, padding is masked, sizes are as stated."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgec import models
from edgec.models import decoder

TOL = dict(rtol=1e-4, atol=1e-4)


class LM:
    """An onnxruntime session over a decoder with optimum's interface, and its config."""

    def __init__(self, path: Path, cfg: decoder.Config):
        self.cfg = cfg
        self.sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.sess.get_outputs()]

    def empty_cache(self, batch: int) -> dict[str, np.ndarray]:
        shape = (batch, self.cfg.kv_heads, 0, self.cfg.head_dim)
        return {f"past_key_values.{i}.{kv}": np.zeros(shape, np.float32)
                for i in range(self.cfg.layers) for kv in ("key", "value")}

    def step(self, ids: np.ndarray, mask: np.ndarray, cache: dict[str, np.ndarray]):
        """Runs `ids` after `cache`; returns (logits, the next cache)."""
        # HF's convention: positions count real tokens only; padded slots get a dummy 1.
        positions = np.cumsum(mask, axis=1) - 1
        positions = np.where(mask == 0, 1, positions)[:, -ids.shape[1]:]
        out = dict(zip(self.outputs, self.sess.run(None, {
            "input_ids": ids, "attention_mask": mask, "position_ids": positions, **cache})))
        present = {name.replace("present", "past_key_values"): value for name, value in out.items()
                   if name.startswith("present.")}
        return out["logits"], present

    def full(self, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Logits of the whole sequence with no cache."""
        mask = np.ones_like(ids) if mask is None else mask
        return self.step(ids, mask, self.empty_cache(ids.shape[0]))[0]


@pytest.fixture(scope="module")
def tinylm_path(tmp_path_factory) -> Path:
    return models.build("tinylm", tmp_path_factory.mktemp("lm"))


# The same checks on transformers' Llama exported by torch.onnx (~1 min to export): the interface,
# not our builder's layout, is what they test.
TORCH = pytest.param("tinylm_torch", marks=[
    pytest.mark.slow, pytest.mark.skipif(bool(models.TORCH_MISSING), reason=str(models.TORCH_MISSING))])


@pytest.fixture(scope="module", params=["tinylm", TORCH])
def lm_path(request, tinylm_path, tmp_path_factory) -> Path:
    if request.param == "tinylm":
        return tinylm_path
    return models.build(request.param, tmp_path_factory.mktemp("lm_torch"))


@pytest.fixture(scope="module")
def lm(lm_path) -> LM:
    return LM(lm_path, decoder.CONFIGS["tinylm"])  # tinylm_torch is configured from it too


def prompt(lm: LM, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, lm.cfg.vocab, (1, n), dtype=np.int64)


def weights(model: onnx.ModelProto) -> int:
    """Parameters: float initializers but the rotary frequencies and the scalars."""
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer
               if t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) > 1 and not t.name.startswith("rope."))


def test_lm_is_valid_with_optimums_interface(lm_path):
    model = onnx.load(lm_path)
    onnx.checker.check_model(model, full_check=True)
    cfg = decoder.CONFIGS["tinylm"]

    def dims(vi):
        return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]

    ins = {vi.name: dims(vi) for vi in model.graph.input}
    outs = {vi.name: dims(vi) for vi in model.graph.output}
    cache = ["batch", cfg.kv_heads, "past_sequence_length", cfg.head_dim]
    assert list(ins) == ["input_ids", "attention_mask", "position_ids",
                         *(f"past_key_values.{i}.{kv}" for i in range(cfg.layers) for kv in ("key", "value"))]
    assert ins["input_ids"] == ins["position_ids"] == ["batch", "sequence_length"]
    assert ins["attention_mask"] == ["batch", "total_sequence_length"]
    assert ins["past_key_values.3.value"] == cache
    assert outs["logits"] == ["batch", "sequence_length", cfg.vocab]
    assert outs["present.0.key"] == ["batch", cfg.kv_heads, "total_sequence_length", cfg.head_dim]
    assert len(outs) == 1 + 2 * cfg.layers
    ops = {n.op_type for n in model.graph.node}
    assert {"Gather", "MatMul", "Softmax", "Sigmoid", "Cos", "Sin", "ReduceMean", "Where"} <= ops
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)  # no contrib ops
    assert lm_path.stat().st_size < 50_000_000


def test_edgec_ingest_shapes_a_decode_step(lm_path):
    """With every dim pinned, onnxruntime's shape inference (edgec's ingest) resolves each tensor; it
    rejects what onnxruntime itself runs, e.g. a Range fed rank-1 "scalars"."""
    from edgec.compiler.ingest import load_model

    cfg = decoder.CONFIGS["tinylm"]
    shapes = {"input_ids": (1, 1), "position_ids": (1, 1), "attention_mask": (1, 5),
              **{f"past_key_values.{i}.{kv}": (1, cfg.kv_heads, 4, cfg.head_dim)
                 for i in range(cfg.layers) for kv in ("key", "value")}}
    assert load_model(lm_path, shapes).graph.layers


def test_parameter_counts_are_in_their_class(tinylm_path):
    assert weights(onnx.load(tinylm_path)) == decoder.parameter_count(decoder.CONFIGS["tinylm"])
    assert 8e6 < decoder.parameter_count(decoder.CONFIGS["tinylm"]) < 15e6
    assert 0.4e9 < decoder.parameter_count(decoder.CONFIGS["lm500m"]) < 0.6e9


def test_weights_are_seeded_random_and_builds_identical(tinylm_path, tmp_path):
    model = onnx.load(tinylm_path)
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) > 1 and not t.name.startswith("rope."):
            assert np.frombuffer(t.raw_data, np.float32)[:4096].std() > 0, t.name
    assert models.build("tinylm", tmp_path).read_bytes() == tinylm_path.read_bytes()


def test_logits_depend_on_the_input_and_are_not_flat(lm):
    a, b = lm.full(prompt(lm, 6, 1)), lm.full(prompt(lm, 6, 2))
    assert np.isfinite(a).all()
    assert np.abs(a - b).max() > 0.1
    last = a[0, -1].astype(np.float64)
    p = np.exp(last - last.max())
    p /= p.sum()
    assert 20 / lm.cfg.vocab < p.max() < 0.99


def test_cached_greedy_decode_equals_rerunning_the_whole_sequence(lm):
    ids = prompt(lm, 5, 3)
    logits, cache = lm.step(ids, np.ones_like(ids), lm.empty_cache(1))
    np.testing.assert_allclose(logits, lm.full(ids), **TOL)
    for _ in range(6):
        token = logits[:, -1].argmax(-1)[:, None]
        whole = lm.full(np.concatenate([ids, token], axis=1))
        assert whole[0, -2].argmax() == token[0, 0]  # the cache-free run picks the same token
        ids = np.concatenate([ids, token], axis=1)
        logits, cache = lm.step(token, np.ones_like(ids), cache)
        assert logits.shape == (1, 1, lm.cfg.vocab)
        np.testing.assert_allclose(logits[0, -1], whole[0, -1], **TOL)
        for name, value in cache.items():
            assert value.shape == (1, lm.cfg.kv_heads, ids.shape[1], lm.cfg.head_dim), name


def test_cache_grows_by_the_chunk_length(lm):
    ids = prompt(lm, 9, 4)
    _, cache = lm.step(ids[:, :4], np.ones((1, 4), np.int64), lm.empty_cache(1))
    logits, cache = lm.step(ids[:, 4:], np.ones((1, 9), np.int64), cache)  # a 5-token chunk after 4
    assert {v.shape[2] for v in cache.values()} == {9}
    np.testing.assert_allclose(logits, lm.full(ids)[:, 4:], **TOL)


def test_left_padding_gives_the_unpadded_logits(lm):
    long, short = prompt(lm, 8, 5), prompt(lm, 5, 6)
    ids = np.concatenate([long, np.pad(short, ((0, 0), (3, 0)))])
    mask = np.array([[1] * 8, [0] * 3 + [1] * 5], np.int64)
    logits, cache = lm.step(ids, mask, lm.empty_cache(2))
    np.testing.assert_allclose(logits[0], lm.full(long)[0], **TOL)
    np.testing.assert_allclose(logits[1, 3:], lm.full(short)[0], **TOL)
    # Decoding on: the padded row keeps matching its unpadded self.
    alone, alone_cache = lm.step(short, np.ones_like(short), lm.empty_cache(1))
    for _ in range(3):
        tokens = logits[:, -1].argmax(-1)[:, None]
        assert tokens[1, 0] == alone[0, -1].argmax()
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
        logits, cache = lm.step(tokens, mask, cache)
        short = np.concatenate([short, tokens[1:]], axis=1)
        alone, alone_cache = lm.step(tokens[1:], np.ones_like(short), alone_cache)
        np.testing.assert_allclose(logits[1], alone[0], **TOL)


def test_padding_tokens_do_not_leak(lm):
    ids = np.pad(prompt(lm, 5, 7), ((0, 0), (3, 0)))
    mask = np.array([[0] * 3 + [1] * 5], np.int64)
    base = lm.step(ids, mask, lm.empty_cache(1))[0]
    ids[0, :3] = [11, 12, 13]
    np.testing.assert_allclose(lm.step(ids, mask, lm.empty_cache(1))[0][0, 3:], base[0, 3:], **TOL)


def test_registry_builds_the_large_model_only_on_request():
    assert {"tinylm", "lm500m"} <= set(models.GENERATIVE)
    assert "tinylm" in models.MODEL_NAMES
    assert "lm500m" in models.ON_REQUEST_NAMES and "lm500m" not in models.MODEL_NAMES
    from edgec.models.__main__ import _names

    assert _names(None) == list(models.MODEL_NAMES) and _names(["lm500m"]) == ["lm500m"]


@pytest.mark.slow
def test_lm500m_builds_and_its_cache_matches(tmp_path):
    path = models.build("lm500m", tmp_path)
    onnx.checker.check_model(str(path))
    assert weights(onnx.load(path)) == decoder.parameter_count(decoder.CONFIGS["lm500m"])
    lm = LM(path, decoder.CONFIGS["lm500m"])
    ids = prompt(lm, 6, 8)
    logits, cache = lm.step(ids, np.ones_like(ids), lm.empty_cache(1))
    for _ in range(2):
        token = logits[:, -1].argmax(-1)[:, None]
        ids = np.concatenate([ids, token], axis=1)
        logits, cache = lm.step(token, np.ones_like(ids), cache)
        np.testing.assert_allclose(logits[0, -1], lm.full(ids)[0, -1], **TOL)
