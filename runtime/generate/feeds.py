"""A generative step's model inputs, made as the manifest's `generate.feeds` says, and the shapes of the tensors
whose dimensions change from step to step (`generate.shapes`: a size, or the role seq / past / total)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import InputError
from ..manifest.types import Generate, Manifest

__all__ = ["step_shape", "step_inputs", "vocab_size"]


def step_shape(dims: Sequence[int | str], seq: int, past: int) -> tuple[int, ...]:
    """A tensor's shape at a step of `seq` new tokens after `past` ones."""
    sizes = {"seq": seq, "past": past, "total": past + seq}
    return tuple(sizes[d] if isinstance(d, str) else d for d in dims)


def vocab_size(m: Manifest) -> int:
    """The logits' last dimension: token ids run from 0 to this, exclusive."""
    g: Generate = m.generate
    dims = g.shapes.get(g.logits_output)
    if not dims or not isinstance(dims[-1], int) or dims[-1] < 1:
        raise InputError(f"{m.path}: generate.shapes gives no fixed vocabulary size for {g.logits_output!r}")
    return dims[-1]


def step_inputs(m: Manifest, tokens: Sequence[int], past: int) -> dict[str, np.ndarray]:
    """Every model input of the step that feeds `tokens` (the prompt, or the last token) after `past` tokens:
    the token ids, their positions past .. past + seq - 1, and an attention mask of ones over all past + seq."""
    g: Generate = m.generate
    seq, dtypes = len(tokens), {t.name: t.dtype for t in m.inputs}
    made = {"token": lambda dtype: np.asarray(tokens, dtype=dtype),
            "positions": lambda dtype: np.arange(past, past + seq, dtype=dtype),
            "mask": lambda dtype: np.ones(past + seq, dtype=dtype)}
    out = {}
    for name, how in g.feeds.items():
        dims = g.shapes.get(name)
        if dims is None:
            raise InputError(f"{m.path}: generate.shapes has no entry for model input {name!r}")
        out[name] = made[how](dtypes[name]).reshape(step_shape(dims, seq, past))
    return out
