"""--emulate: pad fragment runs to their predicted_ms and delay device-to-device sends by the network model."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from .errors import RunError
from .manifest import Fragment, Manifest

__all__ = ["pad_run", "DelayedLinks"]

logger = logging.getLogger(__name__)


def pad_run(frag: Fragment, elapsed_s: float) -> float:
    """Sleep until the run has taken the fragment's predicted time; returns the emulated run time (s)."""
    target = frag.predicted_ms / 1000.0
    if elapsed_s < target:
        time.sleep(target - elapsed_s)
        return target
    return elapsed_s


class DelayedLinks:
    """Sends from one device, each delivered after bytes / bandwidth + latency of its link.

    One lane (thread + FIFO) per destination on a switched medium, so transfers to different peers
    overlap while transfers on the same link queue behind each other; a single lane on a shared
    medium. The device's step list does not wait for its sends (sends never block in the runtime
    either). Sends to the host are outside the network model and are not delayed (not sent here).
    A lane owns the zmq sockets of its destinations: zmq sockets must stay on one thread.
    """

    def __init__(self, manifest: Manifest, device: str):
        self.network = manifest.network
        self.device = device
        self.lanes: dict[str, tuple[queue.Queue, threading.Thread]] = {}
        self.error: BaseException | None = None

    def submit(self, dst: str, nbytes: int, send: Callable[[], None]) -> None:
        self.raise_if_failed()
        delay = self.network.transfer_s(self.device, dst, nbytes)
        self._lane(dst).put((delay, send))

    def _lane(self, dst: str) -> queue.Queue:
        key = "*" if self.network.medium == "shared" else dst
        if key not in self.lanes:
            q: queue.Queue = queue.Queue()
            thread = threading.Thread(target=self._deliver, args=(q,), name=f"link-{key}", daemon=True)
            thread.start()
            self.lanes[key] = (q, thread)
        return self.lanes[key][0]

    def _deliver(self, q: queue.Queue) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            delay, send = item
            time.sleep(delay)
            try:
                send()
            except Exception as exc:  # surfaced to the step loop by raise_if_failed
                logger.exception("emulated send failed")
                self.error = exc

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise RunError(f"device {self.device}: emulated send failed: {self.error}")

    def close(self) -> None:
        for q, thread in self.lanes.values():
            q.put(None)
        for q, thread in self.lanes.values():
            thread.join(timeout=2.0)
