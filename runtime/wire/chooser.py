"""`--compress auto`: which codec each transfer uses, on what compression costs on this machine.

`Chooser` picks the codec per transfer. In `auto` mode it compresses only when
    t_compress + nbytes * ratio / bandwidth + t_decompress  <  nbytes / bandwidth,
with compress/decompress speeds measured on this machine (`calibrate()`, once per process, about 0.1 s) and
ratios learnt per tensor name from the transfers themselves (an exponential average). The codecs themselves
are compress.py's.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..linkmodel import mbps_to_bytes_per_s
from .compress import CODECS, LZ4_MAX_INPUT, MODES, PayloadError, as_bytes_view, decode, encode

__all__ = ["CodecSpeed", "Calibration", "calibrate", "Chooser"]

logger = logging.getLogger(__name__)


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
        raw = as_bytes_view(arr)
        for codec in points:
            payload = encode(codec, raw)
            t_c = _best_time(lambda: encode(codec, raw), reps)
            t_d = _best_time(lambda: decode(codec, payload, raw.nbytes), reps)
            ratio = max(len(payload), 1) / raw.nbytes
            points[codec].append(CodecSpeed(ratio, raw.nbytes / t_c, raw.nbytes / t_d))
            if family != "dense":
                priors.setdefault(family, {})[codec] = ratio
    tiny = as_bytes_view(np.zeros(16, np.float32))
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
