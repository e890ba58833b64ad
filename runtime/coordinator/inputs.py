"""Model inputs for a run: from an .npz, from NAME=FILE.npy pairs, or random; validated against the manifest.

Every input's size is checked against this machine's memory before anything is allocated, and a file's
names, shapes and dtypes (its .npy headers) before any array data is read: a small, highly compressed
.npz cannot make the run allocate more than the manifest's inputs need.
"""

from __future__ import annotations

import logging
import os
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO, Iterable

import numpy as np
from numpy.lib import format as npy_format

from ..errors import InputError
from ..manifest.types import Manifest, TensorSpec

__all__ = ["load_inputs", "random_inputs", "random_tensor", "check_inputs", "check_memory", "memory_budget"]

logger = logging.getLogger(__name__)

_HEADER_LIMIT = 10_000  # bytes of .npy header dict (numpy's own default limit)
_CHUNK = 1 << 20  # bytes read at a time into the destination array
_NPY_MAGIC, _ZIP_MAGIC = b"\x93NUMPY", b"PK\x03\x04"


def load_inputs(manifest: Manifest, *, npz: str | None = None, pairs: Iterable[str] = (),
                random: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs from `--inputs FILE.npz` and/or `--input NAME=FILE.npy` (pairs override the .npz), or
    `--random-inputs`; every model input must be given, with the manifest's shape and dtype."""
    pairs = list(pairs)
    if random and (npz or pairs):
        raise InputError("--random-inputs cannot be combined with --inputs or --input")
    check_memory(manifest)
    if random:
        return random_inputs(manifest.inputs, seed)
    specs = {t.name: t for t in manifest.inputs}
    named = [_parse_pair(pair) for pair in pairs]
    arrays: dict[str, np.ndarray] = {}
    sources: dict[str, str] = {}
    if npz:
        for name, array in _read_npz(npz, specs, skip={name for name, _ in named}).items():
            arrays[name], sources[name] = array, npz
    for name, file in named:
        arrays[name], sources[name] = _read_npy(file, name, specs), file
    if not arrays and not named and manifest.inputs:
        raise InputError(f"{manifest.path}: the model needs inputs: pass --inputs FILE.npz, --input NAME=FILE.npy "
                         "or --random-inputs")
    check_inputs(manifest, arrays, sources, origin=npz or "--input")
    return arrays


def _parse_pair(pair: str) -> tuple[str, str]:
    name, _, file = pair.partition("=")
    if not name or not file:
        raise InputError(f"--input {pair!r}: expected NAME=FILE.npy")
    return name, file


def check_inputs(manifest: Manifest, arrays: dict[str, np.ndarray], sources: dict[str, str], origin: str) -> None:
    """One-line InputError naming the file for an unknown, missing, mis-shaped or mis-typed input."""
    specs = {t.name: t for t in manifest.inputs}
    for name, array in arrays.items():
        _check_spec(sources.get(name, origin), name, tuple(array.shape), array.dtype, specs)
    missing = [n for n in specs if n not in arrays]
    if missing:
        raise InputError(f"{origin}: missing model input(s) {', '.join(map(repr, missing))}")


def _check_spec(file: str, name: str, shape: tuple[int, ...], dtype: np.dtype, specs: dict[str, TensorSpec]) -> TensorSpec:
    spec = specs.get(name)
    if spec is None:
        raise InputError(f"{file}: {name!r} is not a model input (the model's inputs: {', '.join(specs) or 'none'})")
    if tuple(shape) != spec.shape:
        raise InputError(f"{file}: input {name!r} has shape {list(shape)}, the manifest expects {list(spec.shape)}")
    if dtype.name != spec.dtype:
        raise InputError(f"{file}: input {name!r} has dtype {dtype.name}, the manifest expects {spec.dtype}")
    return spec


def memory_budget() -> int | None:
    """Bytes of inputs this machine can hold: half its physical memory, since the inputs are held here and
    again by the workers that receive them. None where the platform cannot tell (not POSIX)."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * page_size // 2 if pages > 0 and page_size > 0 else None


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_memory(manifest: Manifest, budget: int | None = None) -> None:
    """InputError when an input, or all of them together, would not fit in `budget` bytes (default:
    memory_budget()); checked before any input is allocated, random or read."""
    budget = memory_budget() if budget is None else budget
    if budget is None:
        return
    total = 0
    for spec in manifest.inputs:
        n = spec.nbytes
        total += n
        if n > budget:
            raise InputError(f"{manifest.path}: input {spec.name!r} (shape {list(spec.shape)}, {spec.dtype}) needs "
                             f"{_size(n)}, more than this machine can hold for inputs ({_size(budget)}, half its memory)")
    if total > budget:
        raise InputError(f"{manifest.path}: the inputs need {_size(total)} together, more than this machine can hold "
                         f"for inputs ({_size(budget)}, half its memory)")


def _read_npz(path: str, specs: dict[str, TensorSpec], skip: set[str]) -> dict[str, np.ndarray]:
    """The members of an .npz (np.savez), each checked by name, declared size and .npy header before its
    data is read; members named in `skip` (given by --input) are checked but not read."""
    if not Path(path).is_file():
        raise InputError(f"{path}: inputs file not found")
    try:
        with open(path, "rb") as fh:
            if fh.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
                raise InputError(f"{path}: a single array (.npy), not an .npz archive: pass it as "
                                 f"--input NAME={path}, or save all the inputs in one .npz (np.savez)")
            fh.seek(0)
            with zipfile.ZipFile(fh) as archive:
                members = _npz_members(path, archive, specs)
                return {name: _read_member(path, archive, info, name, specs)
                        for name, info in members.items() if name not in skip}
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, NotImplementedError) as exc:
        raise InputError(f"{path}: cannot read as .npz ({exc})") from None


def _npz_members(path: str, archive: zipfile.ZipFile, specs: dict[str, TensorSpec]) -> dict[str, zipfile.ZipInfo]:
    """Member name -> entry, refusing unknown or repeated names, encrypted members, and members whose
    declared size exceeds what the manifest's shape and dtype need (plus an .npy header)."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")  # np.load's naming of np.savez members
        spec = specs.get(name)
        if spec is None:
            raise InputError(f"{path}: {name!r} is not a model input (the model's inputs: {', '.join(specs) or 'none'})")
        if name in members:
            raise InputError(f"{path}: input {name!r} appears twice")
        if info.flag_bits & 0x1:
            raise InputError(f"{path}: input {name!r} is encrypted")
        limit = spec.nbytes + len(_NPY_MAGIC) + 6 + _HEADER_LIMIT
        if info.file_size > limit:
            raise InputError(f"{path}: input {name!r} holds {_size(info.file_size)} uncompressed, more than its "
                             f"shape {list(spec.shape)} {spec.dtype} needs ({_size(spec.nbytes)})")
        members[name] = info
    return members


def _read_member(path: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str,
                 specs: dict[str, TensorSpec]) -> np.ndarray:
    with archive.open(info) as stream:
        array = _read_array(stream, path, name, specs, size=info.file_size)
        if stream.read(1):  # unreachable when the size matched; reading to the end checks the CRC
            raise InputError(f"{path}: input {name!r} has data past its array")
    return array


def _read_npy(path: str, name: str, specs: dict[str, TensorSpec]) -> np.ndarray:
    if not Path(path).is_file():
        raise InputError(f"{path}: input file not found")
    if name not in specs:
        raise InputError(f"{path}: {name!r} is not a model input (the model's inputs: {', '.join(specs) or 'none'})")
    try:
        with open(path, "rb") as fh:
            if fh.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC:
                raise InputError(f"{path}: expected an .npy array (np.save), got an .npz archive (pass it as --inputs)")
            fh.seek(0)
            return _read_array(fh, path, name, specs, size=os.fstat(fh.fileno()).st_size)
    except OSError as exc:
        raise InputError(f"{path}: cannot read as .npy ({exc})") from None


def _read_array(stream: BinaryIO, path: str, name: str, specs: dict[str, TensorSpec], size: int) -> np.ndarray:
    """An .npy stream of `size` bytes, its header checked against the manifest before its data is read."""
    shape, fortran, dtype = _read_header(stream, path)
    if dtype.hasobject:
        raise InputError(f"{path}: input {name!r} holds Python objects, not numbers")
    spec = _check_spec(path, name, shape, dtype, specs)
    need = stream.tell() + spec.nbytes
    if size != need:
        raise InputError(f"{path}: input {name!r} is {size} bytes, its header (shape {list(shape)}, {dtype.name}) "
                         f"says {need}")
    try:
        array = np.empty(shape[::-1] if fortran else shape, dtype)
    except MemoryError:
        raise InputError(f"{path}: input {name!r} ({_size(spec.nbytes)}) does not fit in memory") from None
    _fill(stream, array, path, name)
    array = array.T if fortran else array
    return array if dtype.isnative else array.astype(dtype.newbyteorder("="))


def _read_header(stream: BinaryIO, path: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = npy_format.read_magic(stream)
        if version == (1, 0):
            return npy_format.read_array_header_1_0(stream, max_header_size=_HEADER_LIMIT)
        if version == (2, 0):
            return npy_format.read_array_header_2_0(stream, max_header_size=_HEADER_LIMIT)
    except ValueError as exc:
        raise InputError(f"{path}: cannot read as .npy ({exc})") from None
    raise InputError(f"{path}: .npy format version {version[0]}.{version[1]} is not supported (np.save writes 1.0)")


def _fill(stream: BinaryIO, array: np.ndarray, path: str, name: str) -> None:
    """Read the array's bytes straight into it, a chunk at a time (no second copy of the data)."""
    view = memoryview(array.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        got = stream.readinto(view[done:done + _CHUNK])
        if not got:
            raise InputError(f"{path}: input {name!r} is truncated ({done} of {len(view)} data bytes)")
        done += got


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
