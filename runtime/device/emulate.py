"""--emulate [--dilate K] on a device: fragment runs padded to their predicted time, messages delayed on the
device's emulated links. The coordinator's side (the shared channel, overruns, undilation) is in
coordinator/emulate.py.

--emulate runs a plan on this machine as if on its devices and network, under the planner's model.

Time stretches by K (K >= 1): each fragment run is padded to K x its predicted_ms, and each device-to-device
message takes K x (bytes / bandwidth + latency) of its link; the coordinator divides every time it reports
by K, so a host slower than the emulated devices still reproduces their timeline exactly, given room.

The network is the planner's (runtime/manifest/replay.py, which the compiler's simulate uses, cost/tiles.py predict_stage):
- a device's consecutive `send` steps form a burst; its messages leave one after another, in step order,
  on the sender's uplink (switched medium) or on the one channel every device shares (shared medium, first
  come first served: the coordinator's Channel arbitrates, and a burst holds the channel to its end);
- the sender's step list resumes when its burst has ended (the planner's sender computes only once its own
  sends are done);
- sends to and from the host are free, as in the planner.
What the planner counts as free (slices, concatenations, sends to and from the host, encoding and decoding
tensors) still takes real time here: a worker counts each run's padding and each burst's start from the moment
the device was ready by the planner's timeline (steps.Steps.ready), which absorbs it. A fragment run (with
the free steps before it) slower than its padding makes the emulation inexact: workers report such overruns,
and the coordinator's Overruns names them and the K that would leave room.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from ..errors import RunError
from ..manifest.types import Fragment, Manifest

__all__ = ["pad_run", "DelayedLinks"]

logger = logging.getLogger(__name__)


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
