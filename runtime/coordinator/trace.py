"""`edgec run --trace FILE.json`: the measured timeline of the timed requests, in Chrome's trace event format
(it opens in Perfetto, ui.perfetto.dev, and in chrome://tracing; `edgec simulate --plot --trace` overlays it).

The file is one JSON object::

    {"traceEvents": [...], "displayTimeUnit": "ms",
     "otherData": {"producer": "edgec run --trace", "manifest": str (absolute), "medium": "switched" | "shared",
                   "emulated": bool, "requests": int (in the file), "dropped": int (older ones left out),
                   "clock_bound_ms": {device: float}}}

Every event has `ts` (its start) and, for a complete event ("ph": "X"), `dur`, in microseconds from the
earliest event in the file (the first request's start, unless a clock offset's error puts a worker's stamp
before it), all on the coordinator's clock. Process 0 is the coordinator, then one process per device; their
names come as metadata events ("ph": "M"). The timed events, each with `args` that name it fully (`args.kind`
and `args.request`, the timed request's number from 0, in completion order):

- "request N" on the coordinator: from the request's inputs being sent to its last output arriving, the
  latency `edgec run` reports; args {kind: "request", request, latency_ms, plan (its manifest)}.
- a fragment id on thread "compute" of its device: one per run step, from its worker starting it; args
  {kind: "compute", request, device, fragment}; `dur` is the worker's measured run time (padded under
  --emulate).
- "TENSOR -> DST" on thread "send" of the sender: one per device-to-device send, from the sender starting it to
  the receiver taking the whole message off its socket; args {kind: "transfer", request, src, dst, tensor (the
  sender's name), name (the receiver's), ms (the measured time; below 0 when shorter than the clock offsets'
  error, `dur` being 0 then)}.
- "TENSOR <- SRC", an instant event ("ph": "i") on thread "recv" of the receiver, when it took the message.

The durations are the samples that `--report` takes medians of (accuracy.py: the same worker timings, clock
offsets and, under --emulate, undilation), so a trace and a report of one run agree. Where events of one thread
would overlap (requests in flight, a sender's messages under way together), the later ones go to threads
"compute 2", "send 2", ..., because the trace viewers draw only nested slices on one thread.

A device's events are where its worker stamped them (wire/protocol.py, `done`), brought onto the coordinator's clock
by that worker's clock offset (accuracy.py): a run starts when the worker stamped it just before onnxruntime ran
it (under --emulate, the moment its padded run is counted from: when its device was ready for it), a send when
the sender started it, a receive when the receiver took the message. So each is placed where it happened, wrong
by at most its device's otherData.clock_bound_ms; a request's start and latency are the coordinator's own
readings. Only the last MAX_REQUESTS timed requests are kept.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass
from typing import Mapping

from .accuracy import MAX_SAMPLES, ClockOffset, check_output_file
from ..wire.protocol import is_timed
from ..errors import RunError
from ..files import write_atomically
from ..manifest.types import Manifest, Recv, Run, Send

__all__ = ["MAX_REQUESTS", "Trace", "check_trace_path", "write_trace"]

MAX_REQUESTS = MAX_SAMPLES  # bounds the memory of a long run, as the report's samples are
_COORDINATOR_PID = 0
_THREADS = ("requests", "compute", "send", "recv")
# Runs placed back to back can overlap by this much once start and duration are rounded apart (microseconds).
_ROUNDING_US = 0.002


@dataclass(frozen=True)
class _Timed:
    """One completed request as the coordinator got it: worker timings {device: (frag_ms, clocks)} and clock
    offsets as accuracy.Samples.add takes them, each run's start {device: [worker clock (s) per run step]}, the
    request's start on the coordinator's clock (s) and its latency (ms)."""

    manifest: Manifest
    times: Mapping[str, tuple[list, list]]
    starts: Mapping[str, list]
    offsets: Mapping[str, ClockOffset]
    issued_s: float
    latency_ms: float


class Trace:
    """Collects the timed requests of a run (across a failover too) and renders them as a trace object."""

    def __init__(self, emulated: bool = False):
        self.emulated = emulated
        self.timed: deque[_Timed] = deque(maxlen=MAX_REQUESTS)
        self.count = 0
        self.first: Manifest | None = None

    def add(self, manifest: Manifest, times: Mapping[str, tuple[list, list]], starts: Mapping[str, list],
            offsets: Mapping[str, ClockOffset], issued_s: float, latency_ms: float) -> None:
        """One completed request, its timings as checked by Samples.check, with one start per run time."""
        for device, (frag_ms, _) in times.items():
            if len(starts.get(device, ())) != len(frag_ms):
                raise RunError(f"device {device}: its worker stamped {len(starts.get(device, ()))} run start(s) "
                               f"for {len(frag_ms)} run(s)")
        self.first = self.first or manifest
        self.timed.append(_Timed(manifest, dict(times), dict(starts), dict(offsets), issued_s, latency_ms))
        self.count += 1

    def clear(self) -> None:
        self.timed.clear()
        self.count = 0

    def as_json(self) -> dict:
        """The trace object (see the module docstring)."""
        requests = enumerate(self.timed, self.count - len(self.timed))
        events = [e for number, t in requests for e in _request_events(number, t)]
        origin = min((e["ts"] for e in events), default=0.0)
        pids = _device_pids(self.timed)
        for e in events:
            e["ts"] = _us(e["ts"] - origin)
            e["pid"] = pids.get(e.pop("device"), _COORDINATOR_PID)
        bounds: dict[str, float] = {}
        for t in self.timed:
            bounds.update({d: round(o.bound_s * 1000.0, 4) for d, o in t.offsets.items()})
        manifest = self.first
        return {
            "traceEvents": _metadata(pids) + _with_lanes(events),
            "displayTimeUnit": "ms",
            "otherData": {
                "producer": "edgec run --trace",
                "manifest": None if manifest is None else os.path.abspath(manifest.path),
                "medium": None if manifest is None else manifest.network.medium,
                "emulated": self.emulated,
                "requests": len(self.timed),
                "dropped": self.count - len(self.timed),
                "clock_bound_ms": bounds,
            },
        }


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _request_events(number: int, t: _Timed) -> list[dict]:
    """The request's events, `ts` in seconds on the coordinator's clock, `dur` in microseconds, `device`
    naming the process (None: the coordinator's)."""
    events = [{"name": f"request {number}", "ph": "X", "cat": "request", "device": None, "tid": "requests",
               "ts": t.issued_s, "dur": round(t.latency_ms * 1000.0, 3),
               "args": {"kind": "request", "request": number, "latency_ms": round(t.latency_ms, 4),
                        "plan": str(t.manifest.path)}}]
    sent: dict[tuple[str, str, str], tuple[float, Send]] = {}
    arrived: dict[tuple[str, str, str], float] = {}
    for device in t.times:
        offset = t.offsets[device].offset_s
        runs = [s for s in t.manifest.steps[device] if isinstance(s, Run)]
        for step, start, ms in zip(runs, t.starts[device], t.times[device][0]):
            events.append({"name": step.fragment, "ph": "X", "cat": "compute", "device": device, "tid": "compute",
                           "ts": start - offset, "dur": round(ms * 1000.0, 3),
                           "args": {"kind": "compute", "request": number, "device": device,
                                    "fragment": step.fragment}})
        for step, clock in _stamped(t, device):
            if isinstance(step, Send):
                sent[(device, step.to, step.name)] = (clock, step)
            else:
                arrived[(step.src, device, step.tensor)] = clock
                events.append({"name": f"{step.tensor} <- {step.src}", "ph": "i", "s": "t", "cat": "recv",
                               "device": device, "tid": "recv", "ts": clock,
                               "args": {"kind": "recv", "request": number, "src": step.src, "dst": device,
                                        "name": step.tensor}})
    for (src, dst, name), (start, step) in sent.items():
        if (src, dst, name) not in arrived:
            continue
        ms = (arrived[(src, dst, name)] - start) * 1000.0  # as accuracy.Samples.add measures it
        # A transfer shorter than the clock offsets' error can come out negative, which no viewer draws: its
        # bar is empty and args.ms keeps the figure the report takes the median of.
        events.append({"name": f"{step.tensor} -> {dst}", "ph": "X", "cat": "transfer", "device": src,
                       "tid": "send", "ts": start, "dur": round(max(ms, 0.0) * 1000.0, 3),
                       "args": {"kind": "transfer", "request": number, "src": src, "dst": dst,
                                "tensor": step.tensor, "name": name, "ms": ms}})
    return events


def _stamped(t: _Timed, device: str) -> list[tuple[Send | Recv, float]]:
    """The device's timed sends and receives in step order, each with its stamp on the coordinator's clock."""
    offset = t.offsets[device].offset_s
    steps = [s for s in t.manifest.steps[device] if is_timed(s) and not isinstance(s, Run)]
    return [(s, clock - offset) for s, clock in zip(steps, t.times[device][1])]


def _device_pids(timed) -> dict[str, int]:
    """A process per device, numbered in the first manifest's device order, then any a fallback adds."""
    pids: dict[str, int] = {}
    for t in timed:
        for name in sorted(t.times, key=lambda d: (t.manifest.device_names.index(d), d)):
            pids.setdefault(name, len(pids) + 1)
    return pids


def _with_lanes(events: list[dict]) -> list[dict]:
    """Thread ids: per process, a thread per name ("compute", "send", "recv", "requests"), and a further
    thread ("compute 2", ...) for an event that would overlap one already on it."""
    ends: dict[tuple[int, str], list[float]] = {}  # (pid, name) -> end of each lane's last event
    tids: dict[tuple[int, str], int] = {}
    order: dict[tuple[int, str], int] = {}  # a device's threads shown compute, send, recv, each lane after lane
    for e in sorted(events, key=lambda e: (e["pid"], e["ts"])):
        lanes = ends.setdefault((e["pid"], e["tid"]), [])
        end = e["ts"] + e.get("dur", 0.0)
        lane = next((k for k, last in enumerate(lanes) if last <= e["ts"] + _ROUNDING_US), len(lanes))
        if lane == len(lanes):
            lanes.append(end)
        else:
            lanes[lane] = end
        thread = e["tid"] if lane == 0 else f"{e['tid']} {lane + 1}"
        order.setdefault((e["pid"], thread), _THREADS.index(e["tid"]) * 1000 + lane)
        e["tid"] = tids.setdefault((e["pid"], thread), len(tids) + 1)
    names = [{"name": meta, "ph": "M", "pid": pid, "tid": tid, "args": arg}
             for (pid, thread), tid in tids.items()
             for meta, arg in (("thread_name", {"name": thread}),
                               ("thread_sort_index", {"sort_index": order[(pid, thread)]}))]
    return names + sorted(events, key=lambda e: (e["ts"], e["pid"], e["tid"]))


def _metadata(pids: Mapping[str, int]) -> list[dict]:
    out = [{"name": "process_name", "ph": "M", "pid": _COORDINATOR_PID, "args": {"name": "coordinator"}},
           {"name": "process_sort_index", "ph": "M", "pid": _COORDINATOR_PID, "args": {"sort_index": 0}}]
    for device, pid in pids.items():
        out += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": device}},
                {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
    return out


def check_trace_path(path: str | os.PathLike):
    """InputError, before any run starts, for a trace path that cannot be written."""
    return check_output_file(path, "--trace", "the trace")


def write_trace(path: str | os.PathLike, trace: dict) -> None:
    """Write atomically (never a half-written trace)."""
    target = check_trace_path(path)
    text = json.dumps(trace, separators=(",", ":")) + "\n"
    write_atomically(target, "the trace", lambda fh: fh.write(text.encode("utf-8")))
