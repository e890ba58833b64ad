"""Seeded example feeds matching what the models were calibrated for."""
from __future__ import annotations

import numpy as np
import onnx

_ORT_TYPES = {"tensor(float)": onnx.TensorProto.FLOAT, "tensor(int64)": onnx.TensorProto.INT64}
# Token ids below this are valid for every vocabulary built here (tinytransformer has 100).
_SAFE_VOCAB = 100


def example_inputs(model, seed: int = 0, dim: int = 1) -> dict[str, np.ndarray]:
    """Feeds for every non-initializer graph input; symbolic dimensions become `dim`.

    `model` is a path, an onnx.ModelProto or an onnxruntime.InferenceSession (cheapest for the
    half-gigabyte models: no second parse).

    Float inputs are N(0,1), the distribution the BatchNorm statistics were fitted on (a
    normalised image looks like this; U(0,1) inputs push densenet121's logits to ~40x scale).
    `input_ids` are uniform in [0, 100), `attention_mask` masks the last quarter of positions.
    """
    rng = np.random.default_rng(seed)
    return {name: _sample(rng, name, elem, shape) for name, elem, shape in _specs(model, dim)}


def _specs(model, dim: int) -> list[tuple[str, int, list[int]]]:
    if hasattr(model, "get_inputs"):  # onnxruntime session: initializers are already excluded
        return [(i.name, _ORT_TYPES[i.type], [d if isinstance(d, int) else dim for d in i.shape])
                for i in model.get_inputs()]
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(model, load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:  # IR < 4 lists every initializer as an input too
            continue
        tt = vi.type.tensor_type
        specs.append((vi.name, tt.elem_type,
                      [d.dim_value if d.HasField("dim_value") else dim for d in tt.shape.dim]))
    return specs


def _sample(rng: np.random.Generator, name: str, elem_type: int, shape: list[int]) -> np.ndarray:
    if elem_type == onnx.TensorProto.FLOAT:
        return rng.standard_normal(shape, dtype=np.float32)
    if elem_type == onnx.TensorProto.INT64 and "mask" in name:
        mask = np.ones(shape, np.int64)
        mask[..., shape[-1] - shape[-1] // 4:] = 0
        return mask
    if elem_type == onnx.TensorProto.INT64:
        return rng.integers(0, _SAFE_VOCAB, shape, dtype=np.int64)
    raise ValueError(f"no example values for input {name!r} of element type {elem_type}")
