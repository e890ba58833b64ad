"""Model inputs for a run: from an .npz, from NAME=FILE.npy pairs, or random; validated against the manifest."""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path
from typing import Iterable

import numpy as np

from .errors import InputError
from .manifest import Manifest, TensorSpec

__all__ = ["load_inputs", "random_inputs", "random_tensor", "check_inputs"]

logger = logging.getLogger(__name__)


def load_inputs(manifest: Manifest, *, npz: str | None = None, pairs: Iterable[str] = (),
                random: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs from `--inputs FILE.npz` and/or `--input NAME=FILE.npy` (pairs override the .npz), or
    `--random-inputs`; every model input must be given, with the manifest's shape and dtype."""
    pairs = list(pairs)
    if random:
        if npz or pairs:
            raise InputError("--random-inputs cannot be combined with --inputs or --input")
        return random_inputs(manifest.inputs, seed)
    arrays: dict[str, np.ndarray] = {}
    sources: dict[str, str] = {}
    if npz:
        for name, array in _read_npz(npz).items():
            arrays[name], sources[name] = array, npz
    for pair in pairs:
        name, _, file = pair.partition("=")
        if not name or not file:
            raise InputError(f"--input {pair!r}: expected NAME=FILE.npy")
        arrays[name], sources[name] = _read_npy(file), file
    if not arrays and manifest.inputs:
        raise InputError(f"{manifest.path}: the model needs inputs: pass --inputs FILE.npz, --input NAME=FILE.npy "
                         "or --random-inputs")
    check_inputs(manifest, arrays, sources, origin=npz or "--input")
    return arrays


def check_inputs(manifest: Manifest, arrays: dict[str, np.ndarray], sources: dict[str, str], origin: str) -> None:
    """One-line InputError naming the file for an unknown, missing, mis-shaped or mis-typed input."""
    specs = {t.name: t for t in manifest.inputs}
    for name, array in arrays.items():
        file = sources.get(name, origin)
        spec = specs.get(name)
        if spec is None:
            raise InputError(f"{file}: {name!r} is not a model input (the model's inputs: {', '.join(specs) or 'none'})")
        if tuple(array.shape) != spec.shape:
            raise InputError(f"{file}: input {name!r} has shape {list(array.shape)}, the manifest expects {list(spec.shape)}")
        if array.dtype.name != spec.dtype:
            raise InputError(f"{file}: input {name!r} has dtype {array.dtype.name}, the manifest expects {spec.dtype}")
    missing = [n for n in specs if n not in arrays]
    if missing:
        raise InputError(f"{origin}: missing model input(s) {', '.join(map(repr, missing))}")


def _read_npz(path: str) -> dict[str, np.ndarray]:
    if not Path(path).is_file():
        raise InputError(f"{path}: inputs file not found")
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise InputError(f"{path}: expected an .npz archive (np.savez), got a single array")
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InputError(f"{path}: cannot read as .npz ({exc})") from None


def _read_npy(path: str) -> np.ndarray:
    if not Path(path).is_file():
        raise InputError(f"{path}: input file not found")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{path}: cannot read as .npy ({exc})") from None
    if not isinstance(data, np.ndarray):
        data.close()
        raise InputError(f"{path}: expected an .npy array (np.save), got an .npz archive")
    return data


def random_inputs(specs: Iterable[TensorSpec], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {spec.name: random_tensor(spec, rng) for spec in specs}


def random_tensor(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Floats standard normal; ints in [0, 100) (small enough for token-id embedding Gathers); names
    containing "mask" all ones; "token_type"/"segment" ids zero and "position" ids 0..n-1 along the last
    axis, so that BERT-like embeddings stay in range."""
    name, dtype, shape = spec.name.lower(), np.dtype(spec.dtype), spec.shape
    if "mask" in name:
        return np.ones(shape, dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if "token_type" in name or "segment" in name:
        return np.zeros(shape, dtype)
    if "position" in name and shape:
        return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
    return rng.integers(0, 100, shape).astype(dtype)
