"""--emulate [--dilate K]: run a plan on this machine as if on its devices and network, under the planner's model.

Time stretches by K (K >= 1): each fragment run is padded to K x its predicted_ms, and each device-to-device
message takes K x (bytes / bandwidth + latency) of its link; the coordinator divides every time it reports
by K, so a host slower than the emulated devices still reproduces their timeline exactly, given room.

The network is the planner's (runtime/manifest/replay.py, which the compiler's simulate uses, tiles.py predict_stage):
- a device's consecutive `send` steps form a burst; its messages leave one after another, in step order,
  on the sender's uplink (switched medium) or on the one channel every device shares (shared medium, first
  come first served: the coordinator's Channel arbitrates, and a burst holds the channel to its end);
- the sender's step list resumes when its burst has ended (the planner's sender computes only once its own
  sends are done);
- sends to and from the host are free, as in the planner.
What the planner counts as free (slices, concatenations, sends to and from the host, encoding and decoding
tensors) still takes real time here: a worker counts each run's padding and each burst's start from the moment
the device was ready by the planner's timeline (session.Steps.ready), which absorbs it. A fragment run (with
the free steps before it) slower than its padding makes the emulation inexact: workers report such overruns,
and the coordinator's Overruns names them and the K that would leave room.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from typing import Callable, Mapping

from .accuracy import ClockOffset
from .errors import RunError
from .manifest.types import Fragment, Manifest
from .wire.protocol import MAX_DILATE

__all__ = ["MAX_DILATE", "ROOM", "pad_run", "DelayedLinks", "Channel", "Overruns", "suggest_dilate",
           "undilated_times", "undilated_starts", "undilated_offsets"]

logger = logging.getLogger(__name__)

ROOM = 1.2  # the suggested dilation leaves 20% above the worst overrun seen


def pad_run(frag: Fragment, elapsed_s: float, dilate: float = 1.0) -> float:
    """Sleep until the run has taken dilate x the fragment's predicted time; returns the emulated run time
    (s): the padded time, or the run's own when it overran its padding."""
    target = frag.predicted_ms * dilate / 1000.0
    if elapsed_s < target:
        time.sleep(target - elapsed_s)
        return target
    return elapsed_s


class DelayedLinks:
    """A device's emulated network interface: one lane (a thread and its FIFO) for everything the device
    sends, which delivers each message when its transfer ends.

    `submit` schedules a message right behind the previous one, or at `not_before` (when the device was
    ready to send, or the shared medium's granted start) if later, for dilate x (bytes / bandwidth + latency)
    of its link, and returns its start;
    `busy_until` is when the last one is delivered, which the device's step list waits for. A lane owns
    the zmq sockets of its destinations: zmq sockets must stay on one thread.
    """

    def __init__(self, manifest: Manifest, device: str, dilate: float = 1.0):
        self.network = manifest.network
        self.device = device
        self.dilate = dilate
        self.busy_until = 0.0  # time.monotonic() at which the last message submitted is delivered
        self.error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    @property
    def shared(self) -> bool:
        return self.network.medium == "shared"

    def duration_s(self, dst: str, nbytes: int) -> float:
        return self.network.transfer_s(self.device, dst, nbytes) * self.dilate

    def submit(self, dst: str, nbytes: int, send: Callable[[], None], not_before: float | None = None) -> float:
        """Schedule `send` to run when the message's transfer ends; returns when the transfer starts."""
        self.raise_if_failed()
        start = max(time.monotonic() if not_before is None else not_before, self.busy_until)
        self.busy_until = start + self.duration_s(dst, nbytes)
        if self._thread is None:
            self._thread = threading.Thread(target=self._deliver, name=f"uplink-{self.device}", daemon=True)
            self._thread.start()
        self._queue.put((self.busy_until, send))
        return start

    def _deliver(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            at, send = item
            wait = at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                send()
            except Exception as exc:  # surfaced to the step loop by raise_if_failed
                logger.exception("emulated send failed")
                self.error = exc

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise RunError(f"device {self.device}: emulated send failed: {self.error}")

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=2.0)
            self._thread = None


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
