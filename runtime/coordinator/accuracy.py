"""`edgec run --report FILE.json`: the plan's predictions against what the run measured.

The report is one JSON object, its keys always in this order::

    {"manifest": str,        the manifest whose plan finished the run (a fallback's after a failover), absolute
     "repeat": int,          the timed requests asked for (--repeat; the warm-up is not timed)
     "fragments": [{"id", "device", "predicted_ms", "measured_ms", "error"}],    the manifest's fragments, in order
     "transfers": [{"tensor", "src", "dst", "bytes", "predicted_ms", "measured_ms", "error", "clock_bound_ms"}],
                             the manifest's transfers (device-to-device sends), in order
     "latency": {"predicted_ms", "measured_ms", "error"},
     "throughput": {"predicted_ips", "measured_ips", "error"},
     "failovers": [{"device", "at_request", "plan"}]}      the plan switches, as in `edgec run --json`

`measured_ms` is the median over the timed requests (of the last MAX_SAMPLES, which bounds the memory of a
long run); `error` is measured / predicted - 1 (+0.25: 25% slower or, for throughput, higher than predicted).
A figure that cannot be had is null: a prediction the manifest does not hold, a transfer entry that no send
step of the schedule matches, and then its error. Milliseconds are rounded to 4 decimals.

- A fragment's measured time is its onnxruntime run on its worker (with --emulate, the padded run: the
  emulated times are reported). Its prediction is the manifest's `predicted_ms`.
- A transfer's measured time runs from the moment its sender started sending (before compression) to the
  moment the receiver took the whole message off its data socket and decoded it (decompressed, where the
  sender compressed it); a receiver busy running a fragment takes it when the run ends: device/session.py. The two moments are read on two workers' clocks, brought onto the
  coordinator's clock by each worker's offset, estimated when the session starts with Cristian's method:
  the coordinator notes its clock t0, asks for the worker's clock c (`sync`), notes t1 when the answer
  arrives; offset = c - (t0 + t1) / 2, wrong by at most the round trip's half, (t1 - t0) / 2, of the
  fastest of SYNC_ROUNDS rounds. `clock_bound_ms` is that bound of the sender plus the receiver's (about
  0.1 ms for workers on this machine, which share one clock anyway). Clocks drifting apart during a long
  run (a few parts per million) add to it. The prediction is the cost model's: bytes / bandwidth + latency
  of the manifest's network link between src and dst (runtime's one Mbps conversion, manifest/types.py).
- Latency is the median request latency; its prediction, the manifest's `predicted.latency_ms`, is a lone
  request's: with more than one request in flight the measured latency includes queueing. Throughput is
  the steady-state rate of the timed requests (the outputs after the first over the time from the first
  output to the last: window.steady_throughput); its prediction, `predicted.throughput_ips`.
- After a failover the fragments and transfers are the fallback plan's, measured on the requests it ran
  (re-runs included; a fallback gets no warm-up), latency and throughput the whole run's against the
  fallback's predictions. After an adaptation (`--adapt`) likewise: the plan in use at the end, measured on
  the requests it ran; `edgec run --json`'s `adaptations` lists the switches.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import InputError, RunError
from ..files import write_atomically
from ..manifest.types import HOST, Manifest, Send, region_ranges
from ..wire.protocol import timed_steps

__all__ = ["MAX_SAMPLES", "SYNC_ROUNDS", "ClockOffset", "estimate_offset", "Samples",
           "transfer_keys", "build_report", "summary_lines", "check_output_file", "check_report_path", "write_report"]

logger = logging.getLogger(__name__)

MAX_SAMPLES = 10_000  # per fragment and transfer: a 100k-request run keeps the last 10k
SYNC_ROUNDS = 5  # clock reads per worker; the fastest round trip gives the tightest offset
WORST = 3  # fragments and transfers named in the stderr summary

TransferKey = tuple[str, str, str]  # (src, dst, the name the receiver stores it under)


@dataclass(frozen=True)
class ClockOffset:
    """A worker's clock minus the coordinator's (seconds), and the most that estimate can be wrong by."""

    offset_s: float
    bound_s: float


def estimate_offset(sent_s: float, worker_clock_s: float, received_s: float) -> ClockOffset:
    """Cristian's method: the worker read its clock somewhere between the coordinator's sent_s and
    received_s, so taking the midpoint is wrong by at most half the round trip."""
    return ClockOffset(worker_clock_s - (sent_s + received_s) / 2.0, (received_s - sent_s) / 2.0)


class Samples:
    """Per fragment and per transfer, the last MAX_SAMPLES measured times (ms) of completed requests."""

    def __init__(self, manifest: Manifest):
        self.runs: dict[str, list[str]] = {}  # device -> fragment of each run step
        self.clocks: dict[str, list[tuple[str, TransferKey]]] = {}  # device -> ("send" | "recv", key) per step
        for device, steps in manifest.steps.items():
            timed = list(timed_steps(steps))
            self.runs[device] = [fid for kind, fid, _ in timed if kind == "run"]
            self.clocks[device] = [(kind, (device, peer, name) if kind == "send" else (peer, device, name))
                                   for kind, peer, name in timed if kind != "run"]
        self.fragment_ms: dict[str, deque[float]] = {}
        self.transfer_ms: dict[TransferKey, deque[float]] = {}

    def check(self, device: str, frag_ms: list, clocks: list) -> None:
        """RunError unless a worker's timings have one entry per timed step of its device."""
        want = (len(self.runs.get(device, ())), len(self.clocks.get(device, ())))
        if (len(frag_ms), len(clocks)) != want:
            raise RunError(f"device {device}: its worker timed {len(frag_ms)} run(s) and {len(clocks)} send(s) and "
                           f"receive(s), its steps hold {want[0]} and {want[1]}")

    def add(self, times: Mapping[str, tuple[list, list]], offsets: Mapping[str, ClockOffset]
            ) -> tuple[dict[str, float], dict[TransferKey, float]]:
        """One completed request: {device: (frag_ms, clocks)} as checked by `check`. Returns its measured
        times: ms per fragment (a fragment run twice: the request's total) and per transfer."""
        per_fragment: dict[str, float] = {}
        sent: dict[TransferKey, float] = {}
        arrived: dict[TransferKey, float] = {}
        for device, (frag_ms, clocks) in times.items():
            for fid, ms in zip(self.runs[device], frag_ms):
                per_fragment[fid] = per_fragment.get(fid, 0.0) + ms
            offset = offsets[device].offset_s
            for (kind, key), clock in zip(self.clocks[device], clocks):
                (sent if kind == "send" else arrived)[key] = clock - offset
        per_transfer = {key: (arrived[key] - start) * 1000.0 for key, start in sent.items() if key in arrived}
        for fid, ms in per_fragment.items():
            self._keep(self.fragment_ms, fid, ms)
        for key, ms in per_transfer.items():
            self._keep(self.transfer_ms, key, ms)
        return per_fragment, per_transfer

    @staticmethod
    def _keep(table: dict, key, ms: float) -> None:
        if key not in table:
            table[key] = deque(maxlen=MAX_SAMPLES)
        table[key].append(ms)

    def clear(self) -> None:
        self.fragment_ms.clear()
        self.transfer_ms.clear()


def _median(values: Iterable[float] | None) -> float | None:
    values = list(values or ())
    return statistics.median(values) if values else None


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _error(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or predicted is None or predicted <= 0:
        return None
    return round(measured / predicted - 1.0, 4)


def _predicted(manifest: Manifest, key: str) -> float | None:
    """A figure of the manifest's optional, free-form `predicted` section, when it is a positive number."""
    v = manifest.predicted.get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    return float(v) if ok else None


def transfer_keys(manifest: Manifest) -> list[TransferKey | None]:
    """Each transfer entry's send step, as the key its timings are kept under (None: no step matches).
    An entry names the sender's tensor and region; identical entries match identical sends in order."""
    pool: dict[tuple, list[TransferKey]] = {}
    for device, steps in manifest.steps.items():
        for s in steps:
            if isinstance(s, Send) and s.to != HOST:
                pool.setdefault((device, s.to, s.tensor, region_ranges(s.region)), []).append((device, s.to, s.name))
    keys = []
    for t in manifest.transfers:
        left = pool.get((t.src, t.dst, t.tensor, region_ranges(t.region)))
        keys.append(left.pop(0) if left else None)
    return keys


def build_report(manifest: Manifest, *, repeat: int, latency_ms: float, throughput_ips: float, samples: Samples,
                 offsets: Mapping[str, ClockOffset], failovers: list[dict]) -> dict:
    """The report object (see the module docstring)."""
    fragments = []
    for f in manifest.fragments.values():
        measured = _median(samples.fragment_ms.get(f.id))
        fragments.append({"id": f.id, "device": f.device, "predicted_ms": _ms(f.predicted_ms),
                          "measured_ms": _ms(measured), "error": _error(measured, f.predicted_ms)})
    transfers = []
    for t, key in zip(manifest.transfers, transfer_keys(manifest)):
        predicted = manifest.network.transfer_s(t.src, t.dst, t.bytes) * 1000.0
        measured = None if key is None else _median(samples.transfer_ms.get(key))
        bound = sum(offsets[d].bound_s for d in (t.src, t.dst) if d in offsets) * 1000.0
        transfers.append({"tensor": t.tensor, "src": t.src, "dst": t.dst, "bytes": t.bytes,
                          "predicted_ms": _ms(predicted), "measured_ms": _ms(measured),
                          "error": _error(measured, predicted), "clock_bound_ms": _ms(bound)})
    lat, ips = _predicted(manifest, "latency_ms"), _predicted(manifest, "throughput_ips")
    return {
        "manifest": os.path.abspath(manifest.path),  # `edgec profile --refine` reads it from anywhere
        "repeat": repeat,
        "fragments": fragments,
        "transfers": transfers,
        "latency": {"predicted_ms": _ms(lat), "measured_ms": _ms(latency_ms), "error": _error(latency_ms, lat)},
        "throughput": {"predicted_ips": _ms(ips), "measured_ips": _ms(throughput_ips),
                       "error": _error(throughput_ips, ips)},
        "failovers": [dict(f) for f in failovers],
    }


def summary_lines(report: dict) -> list[str]:
    """The stderr summary: latency and throughput, then the WORST fragments and transfers by |error|."""
    def pct(e: float | None) -> str:
        return "n/a" if e is None else f"{e * 100:+.1f}%"

    lat, ips = report["latency"], report["throughput"]
    lines = [f"accuracy: latency {pct(lat['error'])}, throughput {pct(ips['error'])} against the prediction"]
    for kind, entries in (("fragment", report["fragments"]), ("transfer", report["transfers"])):
        worst = sorted((e for e in entries if e["error"] is not None), key=lambda e: -abs(e["error"]))[:WORST]
        for e in worst:
            what = f"fragment {e['id']} on {e['device']}" if kind == "fragment" else \
                f"transfer {e['tensor']} {e['src']} -> {e['dst']} ({e['bytes']} bytes)"
            lines.append(f"accuracy: {what}: predicted {e['predicted_ms']:.3f} ms, measured "
                         f"{e['measured_ms']:.3f} ms ({pct(e['error'])})")
    return lines


def check_output_file(path: str | os.PathLike, option: str, what: str) -> Path:
    """InputError, before any run starts, for a path given to `option` that cannot be written: its folder
    is missing or not writable, or the path is a folder. `what` names the file: "the report"."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise InputError(f"{path}: is a directory; {option} takes a file name")
    if not folder.is_dir():
        raise InputError(f"{path}: no folder {folder} to write {what} in")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{path}: folder {folder} is not writable")
    return target


def check_report_path(path: str | os.PathLike) -> Path:
    return check_output_file(path, "--report", "the report")


def write_report(path: str | os.PathLike, report: dict) -> None:
    """Write atomically: a temporary file in the same folder, then os.replace (never a half-written report)."""
    target = check_report_path(path)
    text = json.dumps(report, indent=1) + "\n"
    write_atomically(target, "the report", lambda fh: fh.write(text.encode("utf-8")))
