"""--emulate on the coordinator: the shared medium's one channel, the fragment runs that overran their padding
(and the --dilate that would leave room), workers' timings brought back onto the emulated clock, and the worker
pool's handling of the workers' `channel` and `overrun` messages (Emulating, a part of WorkerPool). The model
and the device's side (padded runs, delayed links) are in device/emulate.py."""

from __future__ import annotations

import math
import time
from typing import Mapping

from .accuracy import ClockOffset
from .workers import WorkerLink

__all__ = ["ROOM", "Channel", "Overruns", "suggest_dilate", "undilated_times", "undilated_starts", "undilated_offsets",
           "Emulating"]

ROOM = 1.2  # the suggested dilation leaves 20% above the worst overrun seen


class Channel:
    """The shared medium's one channel, on the coordinator: bursts reserve it first come first served.

    A reservation starts when the channel is free (or now) and lasts the burst's duration, declared by its
    sender; the sender is told how long to wait. Reserving rather than waiting for a release keeps the
    hand-over exact: the next burst starts when the previous one ends by the book, not one message round
    trip later."""

    def __init__(self) -> None:
        self.free_at = 0.0  # time.monotonic() at which the last reservation ends

    def reserve(self, now: float, duration_s: float, since_s: float = 0.0) -> float:
        """Seconds from `now` until the burst starts, for a burst ready `since_s` before now (its sender's
        real time making it ready is free in the planner): negative when it starts in the past."""
        start = max(now - since_s, self.free_at)
        self.free_at = start + duration_s
        return start - now


def suggest_dilate(ratio: float) -> float:
    """The dilation that leaves ROOM above a run that took `ratio` x its predicted time: ROOM x ratio, rounded
    up to one decimal."""
    return math.ceil(round(ROOM * ratio * 10.0, 6)) / 10.0


class Overruns:
    """Fragment runs slower than their padding (predicted_ms x dilation), the worst of each fragment."""

    def __init__(self, dilate: float):
        self.dilate = dilate
        self.worst: dict[tuple[str, str], tuple[float, float]] = {}  # (device, fragment) -> (measured, predicted ms)

    def add(self, device: str, fragment: str, predicted_ms: float, measured_ms: float) -> None:
        key = (device, fragment)
        if key not in self.worst or measured_ms > self.worst[key][0]:
            self.worst[key] = (measured_ms, predicted_ms)

    def clear(self) -> None:
        self.worst.clear()

    def suggestion(self) -> float | None:
        """The --dilate that would leave room for the worst overrun seen (None: no overrun of a fragment
        predicted to take any time, which no dilation can pad)."""
        ratios = [m / p for m, p in self.worst.values() if p > 0]
        return suggest_dilate(max(ratios)) if ratios else None

    def as_json(self) -> dict:
        """`edgec run --json`'s `emulation` object: host milliseconds, not divided by the dilation."""
        return {"dilate": self.dilate,
                "overruns": [{"fragment": f, "device": d, "measured_ms": round(m, 4),
                              "padded_ms": round(p * self.dilate, 4)}
                             for (d, f), (m, p) in sorted(self.worst.items())]}

    def warnings(self) -> list[str]:
        """One line per fragment that overran (logged as `edgec: warning: ...` by the CLI)."""
        k = self.suggestion()
        lines = []
        for (d, f), (m, p) in sorted(self.worst.items()):
            advice = f"--dilate {k:g} would leave room" if p > 0 else "no --dilate pads a fragment predicted at 0 ms"
            lines.append(f"emulation: fragment {f} on device {d} ran {m:.3f} ms, more than its predicted {p:.3f} ms "
                         f"x {self.dilate:g}; {advice}")
        return lines


def undilated_times(times: Mapping[str, tuple[list, list]], dilate: float) -> dict[str, tuple[list, list]]:
    """A request's worker timings {device: (frag_ms, clocks)} on the emulated clock: everything / dilate."""
    return {d: ([ms / dilate for ms in frag_ms], [c / dilate for c in clocks])
            for d, (frag_ms, clocks) in times.items()}


def undilated_starts(starts: Mapping[str, list], dilate: float) -> dict[str, list]:
    """A request's fragment run starts {device: [clock]} on the emulated clock, as undilated_times' clocks."""
    return {d: [c / dilate for c in clocks] for d, clocks in starts.items()}


def undilated_offsets(offsets: Mapping[str, ClockOffset], dilate: float) -> dict[str, ClockOffset]:
    """Clock offsets for undilated_times' clocks (clock - offset, divided by the dilation, is what matters)."""
    return {d: ClockOffset(o.offset_s / dilate, o.bound_s / dilate) for d, o in offsets.items()}


class Emulating:
    """WorkerPool's side of --emulate (pool.py): the shared channel's grants and the workers' overruns."""

    def _on_channel(self, w: WorkerLink, msg: dict, payload) -> None:
        if self.channel is None:
            return self.drops.drop(f"'channel' from {w.name}, but the run emulates no shared medium")
        wait_s = self.channel.reserve(time.monotonic(), msg["ms"] / 1000.0, msg["since_ms"] / 1000.0)
        self._send(w, {"t": "grant", "seq": msg["seq"], "wait_ms": wait_s * 1000.0})

    def _on_overrun(self, w: WorkerLink, msg: dict, payload) -> None:
        if self.overruns is None:
            return self.drops.drop(f"'overrun' from {w.name}, but the run is not emulated")
        predicted = {f.id: f.predicted_ms for f in self.manifest.device_fragments(w.name)}
        for fid, ms in zip(msg["fragments"], msg["measured_ms"]):
            if fid not in predicted:
                self.drops.drop(f"'overrun' from {w.name} of a fragment not its own", fid[:80])
            else:
                self.overruns.add(w.name, fid, predicted[fid], float(ms))
