"""Compressed tensor transfers: the codecs `none`, `lz4` and `zstd`, bounded decoding, and `auto`.

The transport sends a tensor as (codec, payload) and the receiver knows the tensor's dtype and shape,
hence its exact size. So:

- `encode(codec, buffer)` compresses one tensor's bytes.
- `decode(codec, payload, expected_nbytes)` returns exactly `expected_nbytes` bytes or raises
  `PayloadError`. Its output buffer is never larger than `expected_nbytes`, whatever a peer sends: a
  decompression bomb, a zstd frame header that claims a huge size, truncated or trailing bytes.
- `Chooser` picks the codec per transfer. In `auto` mode it compresses only when
      t_compress + nbytes * ratio / bandwidth + t_decompress  <  nbytes / bandwidth,
  with compress/decompress speeds measured on this machine (`calibrate()`, once per process, about
  0.1 s) and ratios learnt per tensor name from the transfers themselves (an exponential average).

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
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import lz4.block
import numpy as np
import zstandard

from ..errors import EdgecRuntimeError, InputError
from ..linkmodel import mbps_to_bytes_per_s

__all__ = [
    "CODECS", "MODES", "ZSTD_LEVEL", "LZ4_MAX_INPUT", "PayloadError", "parse_mode", "encode", "decode",
    "decode_array", "expected_nbytes", "CodecSpeed", "Calibration", "calibrate", "Chooser",
]

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


def _as_bytes_view(buffer: Any) -> memoryview:
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
    view = _as_bytes_view(buffer)
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


# ----------------------------------------------------------------------------------------------------
# calibration: what compression costs on this machine

@dataclass(frozen=True)
class CodecSpeed:
    """One codec's measured cost on one sample: `ratio` = compressed/raw bytes, speeds in raw bytes/s."""

    ratio: float
    compress_bps: float
    decompress_bps: float


@dataclass(frozen=True)
class Calibration:
    """Measured costs, per codec: `points` are CodecSpeed on samples of different compressibility (the
    speeds depend mostly on the ratio: lz4 skips incompressible data at GB/s); `overhead_s` is the fixed
    cost of one compress + decompress call; `priors` maps a dtype family ("float32", "float16", "int64")
    to each codec's ratio on a sample of that family, the guess for a tensor not seen yet."""

    points: dict[str, tuple[CodecSpeed, ...]]
    overhead_s: dict[str, float]
    priors: dict[str, dict[str, float]]
    seconds: float = 0.0  # how long the calibration took

    def costs(self, codec: str, ratio: float) -> tuple[float, float]:
        """(compress, decompress) seconds per raw byte at `ratio`: piecewise-linear in the ratio between
        the measured points, clamped at the ends."""
        pts = sorted(self.points[codec], key=lambda p: p.ratio)
        xs = [p.ratio for p in pts]
        return (float(np.interp(ratio, xs, [1.0 / p.compress_bps for p in pts])),
                float(np.interp(ratio, xs, [1.0 / p.decompress_bps for p in pts])))

    def to_dict(self) -> dict:
        """Plain data (msgpack/JSON), e.g. for a worker to tell its peers how fast it decompresses."""
        return {"points": {c: [[p.ratio, p.compress_bps, p.decompress_bps] for p in pts]
                           for c, pts in self.points.items()},
                "overhead_s": dict(self.overhead_s), "priors": {k: dict(v) for k, v in self.priors.items()},
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        """Inverse of to_dict; PayloadError if the data is not a well-formed calibration."""
        try:
            points = {str(c): tuple(CodecSpeed(float(r), float(cs), float(ds)) for r, cs, ds in pts)
                      for c, pts in data["points"].items()}
            overhead = {str(c): float(v) for c, v in data["overhead_s"].items()}
            priors = {str(k): {str(c): float(r) for c, r in v.items()} for k, v in data["priors"].items()}
            seconds = float(data.get("seconds", 0.0))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PayloadError(f"malformed calibration: {exc}") from None
        compressing = [c for c in CODECS if c != "none"]
        for c in compressing:
            pts = points.get(c)
            if not pts or c not in overhead:
                raise PayloadError(f"malformed calibration: no measurements for {c}")
            if not all(math.isfinite(v) and v > 0 for p in pts for v in (p.ratio, p.compress_bps, p.decompress_bps)):
                raise PayloadError(f"malformed calibration: {c} has a non-positive measurement")
            if not (math.isfinite(overhead[c]) and overhead[c] >= 0):
                raise PayloadError(f"malformed calibration: {c} has a bad overhead")
        for family, ratios in priors.items():
            if not all(c in ratios and math.isfinite(ratios[c]) and ratios[c] > 0 for c in compressing):
                raise PayloadError(f"malformed calibration: prior for {family} is incomplete")
        if "float32" not in priors:
            raise PayloadError("malformed calibration: no float32 prior")
        return cls(points, overhead, priors, seconds)


def _family(dtype: Any) -> str:
    """The calibration sample that stands for a dtype."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return "float16" if dt.itemsize == 2 else "float32"
    if dt.kind in "iub":
        return "int64"
    return "float32"


def _samples(nbytes: int) -> dict[str, np.ndarray]:
    """Seeded samples: post-ReLU float activations (about half zeros), a dense float tensor, token ids."""
    rng = np.random.default_rng(20240610)
    n = nbytes // 4
    return {"float32": np.maximum(rng.standard_normal(n, dtype=np.float32), 0),
            "float16": np.maximum(rng.standard_normal(2 * n, dtype=np.float32), 0).astype(np.float16),
            "int64": rng.integers(0, 32000, nbytes // 8, dtype=np.int64),
            "dense": rng.standard_normal(n, dtype=np.float32)}


def _best_time(fn, reps: int) -> float:
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def _measure(sample_bytes: int = 1 << 20, reps: int = 3) -> Calibration:
    t_start = time.perf_counter()
    points: dict[str, list[CodecSpeed]] = {c: [] for c in CODECS if c != "none"}
    priors: dict[str, dict[str, float]] = {}
    for family, arr in _samples(sample_bytes).items():
        raw = _as_bytes_view(arr)
        for codec in points:
            payload = encode(codec, raw)
            t_c = _best_time(lambda: encode(codec, raw), reps)
            t_d = _best_time(lambda: decode(codec, payload, raw.nbytes), reps)
            ratio = max(len(payload), 1) / raw.nbytes
            points[codec].append(CodecSpeed(ratio, raw.nbytes / t_c, raw.nbytes / t_d))
            if family != "dense":
                priors.setdefault(family, {})[codec] = ratio
    tiny = _as_bytes_view(np.zeros(16, np.float32))
    overhead = {}
    for codec in points:
        payload = encode(codec, tiny)
        overhead[codec] = (_best_time(lambda: encode(codec, tiny), 50)
                           + _best_time(lambda: decode(codec, payload, tiny.nbytes), 50))
    return Calibration({c: tuple(p) for c, p in points.items()}, overhead, priors,
                       seconds=time.perf_counter() - t_start)


_calibration: Calibration | None = None
_calibration_lock = threading.Lock()


def calibrate(refresh: bool = False) -> Calibration:
    """This machine's codec costs: measured on first use (about 0.1 s), then cached for the process."""
    global _calibration
    with _calibration_lock:
        if _calibration is None or refresh:
            _calibration = _measure()
            logger.debug("compression calibrated in %.3f s: %s", _calibration.seconds, _calibration.to_dict())
        return _calibration


# ----------------------------------------------------------------------------------------------------
# the per-transfer choice

@dataclass
class _History:
    ratio: dict[str, float] = field(default_factory=dict)  # codec -> exponential average of observed ratio
    uncompressed_run: int = 0  # transfers in a row sent raw (auto re-measures after `reprobe_every`)


class Chooser:
    """Which codec each transfer uses.

    `mode` is "none", "lz4" or "zstd" (always that codec) or "auto". In auto mode, for a tensor of
    `nbytes` on a link of `bandwidth_mbps` (10^6 bit/s), each codec's predicted time is
        overhead + nbytes * (compress + decompress seconds per byte at the ratio) + nbytes * ratio / bandwidth
    and the codec with the lowest time wins, "none" (nbytes / bandwidth) included; ties go to "none".

    The ratio for a tensor name is the exponential average (weight `alpha` to the newest) of what that
    codec achieved on the name's past transfers; for a codec not yet tried on it, another codec's average
    scaled by their calibration ratios; for a new name, the calibration prior for its dtype (a post-ReLU
    sample: optimistic, so a slow link tries compression and learns the real ratio). A name sent raw for
    `reprobe_every` transfers in a row is compressed once more, if the prior says compression could pay,
    so that a tensor whose data became compressible is noticed.

    `calibration` (default: `calibrate()`, measured once per process) gives this machine's compress costs;
    `peer_calibration` (default: the same) the receiver's decompress costs. Inject both to make it
    deterministic. Thread-safe.
    """

    def __init__(self, mode: str = "auto", bandwidth_mbps: float | None = None, *,
                 calibration: Calibration | None = None, peer_calibration: Calibration | None = None,
                 alpha: float = 0.3, reprobe_every: int = 50, min_nbytes: int = 1024, max_names: int = 4096):
        if mode not in MODES:
            raise ValueError(f"unknown compression mode {mode!r}: expected one of {', '.join(MODES)}")
        if mode == "auto" and bandwidth_mbps is not None and not bandwidth_mbps > 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth_mbps!r} Mbps")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.mode = mode
        self.bandwidth_mbps = bandwidth_mbps
        self.alpha = alpha
        self.reprobe_every = reprobe_every
        self.min_nbytes = min_nbytes
        self.max_names = max_names
        self._cal = calibration
        self._peer = peer_calibration
        self._history: OrderedDict[str, _History] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def calibration(self) -> Calibration:
        if self._cal is None:
            self._cal = calibrate()
        return self._cal

    @property
    def peer_calibration(self) -> Calibration:
        return self._peer if self._peer is not None else self.calibration

    # -- predictions ----------------------------------------------------------------------------------

    def ratio(self, name: str, dtype: Any, codec: str) -> float:
        """The ratio expected for `codec` on the next transfer of tensor `name`."""
        if codec == "none":
            return 1.0
        with self._lock:
            hist = self._history.get(name)
            seen = dict(hist.ratio) if hist is not None else {}
        return self._estimate(seen, dtype, codec)

    def _estimate(self, seen: dict[str, float], dtype: Any, codec: str) -> float:
        if codec in seen:
            return seen[codec]
        prior = self._prior(dtype)
        if seen:  # another codec's history: scale it by how the two codecs compare on the sample
            other, r = next(iter(seen.items()))
            return r * prior[codec] / prior[other]
        return prior[codec]

    def _prior(self, dtype: Any) -> dict[str, float]:
        priors = self.calibration.priors
        return priors.get(_family(dtype)) or priors["float32"]

    def predict(self, nbytes: int, codec: str, ratio: float, bandwidth_mbps: float) -> float:
        """Seconds to move `nbytes` with `codec` at `ratio`: compress + wire + decompress."""
        wire_bps = mbps_to_bytes_per_s(bandwidth_mbps)
        if codec == "none":
            return nbytes / wire_bps
        c_per_byte, _ = self.calibration.costs(codec, ratio)
        _, d_per_byte = self.peer_calibration.costs(codec, ratio)
        overhead = self.calibration.overhead_s[codec]
        return overhead + nbytes * (c_per_byte + d_per_byte) + nbytes * ratio / wire_bps

    # -- decisions ------------------------------------------------------------------------------------

    def choose(self, name: str, dtype: Any, nbytes: int, bandwidth_mbps: float | None = None) -> str:
        """The codec for one transfer of tensor `name` (`nbytes` raw bytes of `dtype`)."""
        if self.mode != "auto":
            if self.mode == "lz4" and nbytes > LZ4_MAX_INPUT:
                return "zstd"  # beyond the lz4 block format (2 GB): still compressed, as asked
            return self.mode
        bw = self.bandwidth_mbps if bandwidth_mbps is None else bandwidth_mbps
        if bw is None or not bw > 0:
            raise ValueError(f"auto compression needs a positive link bandwidth, got {bw!r} Mbps")
        if nbytes < self.min_nbytes or math.isinf(bw):
            return "none"
        with self._lock:
            hist = self._history.get(name)
            seen = dict(hist.ratio) if hist is not None else {}
            raw_run = hist.uncompressed_run if hist is not None else 0
        candidates = [c for c in CODECS if c != "none" and not (c == "lz4" and nbytes > LZ4_MAX_INPUT)]
        best, best_t = "none", self.predict(nbytes, "none", 1.0, bw)
        for codec in candidates:
            t = self.predict(nbytes, codec, self._estimate(seen, dtype, codec), bw)
            if t < best_t:
                best, best_t = codec, t
        if best == "none" and seen and raw_run + 1 >= self.reprobe_every:
            prior = self._prior(dtype)
            probe, probe_t = "none", best_t
            for codec in candidates:
                t = self.predict(nbytes, codec, prior[codec], bw)
                if t < probe_t:
                    probe, probe_t = codec, t
            best = probe
        return best

    def observe(self, name: str, codec: str, nbytes: int, compressed_nbytes: int) -> None:
        """Record one transfer of `name`: `codec` turned `nbytes` into `compressed_nbytes`."""
        if codec not in CODECS:
            raise ValueError(f"unknown codec {codec!r}: expected one of {', '.join(CODECS)}")
        with self._lock:
            hist = self._history.get(name)
            if hist is None:
                hist = self._history[name] = _History()
                while len(self._history) > self.max_names:
                    self._history.popitem(last=False)
            else:
                self._history.move_to_end(name)
            if codec == "none":
                hist.uncompressed_run += 1
                return
            hist.uncompressed_run = 0
            if nbytes <= 0:
                return
            r = compressed_nbytes / nbytes
            old = hist.ratio.get(codec)
            hist.ratio[codec] = r if old is None else (1 - self.alpha) * old + self.alpha * r

    def encode(self, name: str, array: np.ndarray, bandwidth_mbps: float | None = None) -> tuple[str, Any]:
        """Choose, encode and learn, for one transfer: (codec, payload) to put on the wire.

        A compressed payload that is not smaller than the raw bytes is replaced by the raw bytes ("none"):
        the receiver is then spared a useless decompression.
        """
        arr = np.asarray(array)
        codec = self.choose(name, arr.dtype, arr.nbytes, bandwidth_mbps)
        payload = encode(codec, arr)
        if codec != "none":
            self.observe(name, codec, arr.nbytes, len(payload))
            if len(payload) >= arr.nbytes:
                return "none", encode("none", arr)
        else:
            self.observe(name, "none", arr.nbytes, arr.nbytes)
        return codec, payload
