"""Compressed tensor transfers: the codecs `none`, `lz4` and `zstd`, and bounded decoding. Which codec a
transfer uses (`auto`'s choice, on this machine's measured codec costs) is chooser.py's.

The transport sends a tensor as (codec, payload) and the receiver knows the tensor's dtype and shape,
hence its exact size. So:

- `encode(codec, buffer)` compresses one tensor's bytes.
- `decode(codec, payload, expected_nbytes)` returns exactly `expected_nbytes` bytes or raises
  `PayloadError`. Its output buffer is never larger than `expected_nbytes`, whatever a peer sends: a
  decompression bomb, a zstd frame header that claims a huge size, truncated or trailing bytes.

Codec choices:
- lz4 uses the block format (lz4.block) without a stored size. The block decoder is LZ4_decompress_safe
  into a buffer of the size we pass, so the output is bounded by construction. lz4.frame is no faster
  (tests/bench/bench_compress.py: the same ratio and compress speed, decompression within 2%) and its
  one-shot decoder sizes its buffer from a header the peer writes.
- zstd uses level 1 (`ZSTD_LEVEL`). On ResNet-50/VGG-16 activations level 3 writes only 2.6% fewer bytes
  but compresses at under half the speed; level -1 is 1.4x faster but writes 10% more (lz4 covers the
  fast end). On an edge CPU the compress time decides whether compression pays at all, so level 1.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import lz4.block
import numpy as np
import zstandard

from ..errors import EdgecRuntimeError, InputError

__all__ = ["CODECS", "MODES", "ZSTD_LEVEL", "LZ4_MAX_INPUT", "PayloadError", "parse_mode", "encode", "decode",
           "decode_array", "expected_nbytes", "as_bytes_view"]

logger = logging.getLogger(__name__)

CODECS = ("none", "lz4", "zstd")
MODES = CODECS + ("auto",)
ZSTD_LEVEL = 1
LZ4_MAX_INPUT = 0x7E000000  # LZ4_MAX_INPUT_SIZE: the block format's largest input (about 2 GB)
# dtype kinds a tensor on the wire may have: bool, signed/unsigned integers, floats, complex.
_WIRE_KINDS = frozenset("biufc")


class PayloadError(EdgecRuntimeError, ValueError):
    """A received payload that is malformed, uses an unknown codec, or does not decode to exactly the
    expected number of bytes. The transport drops such a message and logs it."""


def parse_mode(text: str) -> str:
    """Validate a `--compress` value: one of MODES, else InputError (exit 2, one line)."""
    mode = str(text).strip().lower()
    if mode not in MODES:
        raise InputError(f"--compress {text!r}: expected one of {', '.join(MODES)}")
    return mode


# ----------------------------------------------------------------------------------------------------
# encode / decode

_local = threading.local()  # zstd contexts are not safe to share between threads: one pair per thread


def _zstd_compressor() -> zstandard.ZstdCompressor:
    cctx = getattr(_local, "cctx", None)
    if cctx is None:
        # The frame header carries the content size; decode checks it before allocating anything.
        cctx = _local.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True,
                                                      write_checksum=False)
    return cctx


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def as_bytes_view(buffer: Any) -> memoryview:
    """A flat, C-contiguous, read-only byte view of `buffer` (an ndarray, bytes, bytearray, memoryview...).

    A non-contiguous ndarray is copied once into C order; everything else is viewed without a copy.
    """
    if isinstance(buffer, np.ndarray):
        arr = buffer if buffer.flags.c_contiguous else buffer.copy(order="C")
        flat = arr.reshape(-1).view(np.uint8)  # a view: arr is contiguous (works for 0-d and empty arrays)
        return memoryview(flat).toreadonly()
    view = memoryview(buffer)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    if view.format != "B" or view.ndim != 1:
        try:
            view = view.cast("B")
        except TypeError:  # cast() refuses some views (an empty multi-dimensional one): copy the bytes
            view = memoryview(view.tobytes())
    return view.toreadonly()


def encode(codec: str, buffer: Any) -> bytes | memoryview:
    """Compress `buffer` (any C-contiguous bytes-like object, or an ndarray in any layout) with `codec`.

    Returns bytes for lz4 and zstd. For "none" it returns a flat read-only memoryview of the input
    (no copy; len() is the byte count), which pyzmq sends as is.
    """
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}: expected one of {', '.join(CODECS)}")
    view = as_bytes_view(buffer)
    if codec == "none":
        return view
    if codec == "lz4":
        if view.nbytes > LZ4_MAX_INPUT:
            raise ValueError(f"lz4: a {view.nbytes}-byte tensor exceeds the block format's "
                             f"{LZ4_MAX_INPUT}-byte limit; use zstd or none")
        return lz4.block.compress(view, store_size=False)
    return _zstd_compressor().compress(view)


def decode(codec: str, payload: Any, expected_nbytes: int, *, limit: int | None = None) -> bytes | memoryview:
    """The `expected_nbytes` bytes that `payload` (encoded with `codec`) decodes to.

    Raises PayloadError when the codec is unknown, the payload is corrupt, or it would decode to more or
    fewer than `expected_nbytes` bytes. The output buffer is at most `expected_nbytes` long: decoding a
    bomb stops at that bound. (python-lz4 decodes into its own buffer and then copies that into the
    returned bytes, so an lz4 decode peaks at twice `expected_nbytes`.) `limit` (optional) refuses an
    `expected_nbytes` above it, for callers whose expected size itself comes from a peer's header.
    For "none" the payload itself is returned (no copy).
    """
    if isinstance(expected_nbytes, bool) or not isinstance(expected_nbytes, (int, np.integer)):
        raise PayloadError(f"expected size {expected_nbytes!r} is not an integer")
    expected = int(expected_nbytes)
    if expected < 0:
        raise PayloadError(f"expected size {expected} is negative")
    if limit is not None and expected > limit:
        raise PayloadError(f"a {expected}-byte tensor exceeds the {limit}-byte limit")
    try:
        view = memoryview(payload)
    except TypeError:
        raise PayloadError(f"{codec} payload is a {type(payload).__name__}, not bytes") from None
    if codec == "none":
        if view.nbytes != expected:
            raise PayloadError(f"raw payload has {view.nbytes} bytes, expected {expected}")
        return payload
    if codec == "lz4":
        out = _lz4_decode(view, expected)
    elif codec == "zstd":
        out = _zstd_decode(view, expected)
    else:
        raise PayloadError(f"unknown codec {codec!r}: expected one of {', '.join(CODECS)}")
    if len(out) != expected:
        raise PayloadError(f"{codec} payload decodes to {len(out)} bytes, expected {expected}")
    return out


def _lz4_decode(view: memoryview, expected: int) -> bytes:
    if not view.nbytes:
        raise PayloadError("empty lz4 payload")
    if expected > LZ4_MAX_INPUT:
        raise PayloadError(f"a {expected}-byte lz4 block exceeds the format's {LZ4_MAX_INPUT}-byte limit")
    # With uncompressed_size given, python-lz4 allocates exactly that and runs LZ4_decompress_safe, which
    # fails rather than write past it; a shorter result comes back short and decode() refuses it.
    try:
        return lz4.block.decompress(view, uncompressed_size=expected)
    except lz4.block.LZ4BlockError as exc:
        raise PayloadError(f"lz4 payload is corrupt or decodes to more than {expected} bytes: {exc}") from None


def _zstd_decode(view: memoryview, expected: int) -> bytes:
    # zstandard's one-shot decompress sizes its output from the frame header's content size when there is
    # one and ignores max_output_size: so check that size against `expected` before decompressing.
    try:
        content = zstandard.frame_content_size(view)
    except zstandard.ZstdError:
        raise PayloadError("zstd payload has no valid frame header") from None
    if content not in (-1, expected):  # -1: the header does not say; then max_output_size bounds the output
        raise PayloadError(f"zstd frame declares {content} bytes, expected {expected}")
    if content == 0:
        # zstandard returns b"" for a frame declaring 0 bytes without looking further, trailing data
        # included: accept only the empty frame itself (header, one empty last raw block, checksum or not).
        try:
            header = zstandard.frame_header_size(view)
            checksum = 4 if zstandard.get_frame_parameters(view).has_checksum else 0
        except zstandard.ZstdError:
            raise PayloadError("zstd payload has no valid frame header") from None
        if view.nbytes != header + 3 + checksum or bytes(view[header:header + 3]) != b"\x01\x00\x00":
            raise PayloadError("zstd payload for an empty tensor is not one empty frame")
        return b""
    try:
        return _zstd_decompressor().decompress(view, max_output_size=expected, read_across_frames=False,
                                                allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise PayloadError(f"zstd payload is corrupt or decodes to more than {expected} bytes: {exc}") from None


def expected_nbytes(dtype: Any, shape: Any, *, limit: int | None = None) -> int:
    """Byte size of a tensor described by a (possibly hostile) header; PayloadError if it is not a plain
    numeric dtype, the shape is not a list of non-negative ints, or the size exceeds `limit`."""
    dt = _wire_dtype(dtype)
    if not isinstance(shape, (list, tuple)) or len(shape) > 32:
        raise PayloadError(f"shape {shape!r} is not a list of at most 32 dimensions")
    n = dt.itemsize
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise PayloadError(f"shape {shape!r} has a dimension that is not a non-negative integer")
        n *= int(d)  # Python ints do not overflow
    if limit is not None and n > limit:
        raise PayloadError(f"a {n}-byte tensor {list(shape)} exceeds the {limit}-byte limit")
    return n


def _wire_dtype(dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise PayloadError(f"dtype {dtype!r} is not a numpy dtype") from None
    if dt.kind not in _WIRE_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise PayloadError(f"dtype {dt} cannot travel as a tensor")
    return dt


def decode_array(codec: str, payload: Any, dtype: Any, shape: Any, *, limit: int | None = None) -> np.ndarray:
    """decode() then view the bytes as an array of `dtype` and `shape` (read-only, no further copy)."""
    dt = _wire_dtype(dtype)
    data = decode(codec, payload, expected_nbytes(dt, shape, limit=limit))
    return np.frombuffer(data, dtype=dt).reshape(tuple(int(d) for d in shape))
