"""Liveness: zmq heartbeats on every worker connection, the coordinator's pings while idle, a local worker's
exit, and the deadlines of each wait; a working device lost mid-run raises DeviceLost. A part of WorkerPool
(pool.py)."""

from __future__ import annotations

import time

from ..errors import InputError, RunError, one_line
from .workers import WorkerLink, log_tail

__all__ = ["DeviceLost", "Liveness", "HEARTBEAT_MS", "HEARTBEAT_MISSES", "PING_S"]

PING_S = 1.0  # a worker ends a run whose coordinator stays silent for its --idle-timeout
# zmq's own keep-alive on every worker connection (ZMTP PING/PONG, answered by the worker's zmq I/O thread even
# while onnxruntime computes): a connection that receives nothing at all for HEARTBEAT_MISSES intervals is
# dropped, and the device is lost. --heartbeat-ms sets the interval.
HEARTBEAT_MS, HEARTBEAT_MISSES = 1000, 5


class DeviceLost(RunError):
    """A working device stopped answering mid-run: its worker process exited, its connection dropped, or it
    left HEARTBEAT_MISSES heartbeats unanswered; or its worker, having answered, died as the run started (killed
    out of memory loading its fragments, say). FailoverPool switches to the fallback plan without it."""

    def __init__(self, device: str, message: str):
        super().__init__(message)
        self.device = device


class Liveness:
    """WorkerPool's watch over its workers: deadlines, exits, errors and pings."""

    def _timed_out(self, what: str):
        """An unreachable worker is bad input (exit 2, naming device and address); a worker that stops
        answering later is a run failure (exit 3, naming what is still missing)."""
        waiting = [w for w in self.workers.values() if w.phase == "connecting"]
        if waiting:
            w = waiting[0]
            hint = "its local worker did not answer" if w.local else "is `edgec worker` running there, and reachable?"
            raise InputError(f"device {w.name}: no worker answered at {w.endpoint} within {self.timeout:g} s ({hint})")
        if self.open:
            oldest = min(self.open.values(), key=lambda r: r.req)
            late = [f"output {o} of request {oldest.req}" for o in self.collects if o not in oldest.outputs]
            late += [n for n in self.workers if n not in oldest.done]
        else:
            late = [w.name for w in self.workers.values() if w.phase != "ready"]
        raise RunError(f"timed out after {self.timeout:g} s {what} (no answer from: {', '.join(late) or '?'})")

    def _on_error(self, w: WorkerLink, msg: dict, payload) -> None:
        message = one_line(msg["message"], 600) or f"{w.where} failed"
        if msg["kind"] == "stopped" and w.phase == "ready":  # going away mid-run (SIGTERM): lost, as if it died
            self._lost(w, message)
        raise (InputError if msg["kind"] == "input" else RunError)(message)

    def _check_alive(self, what: str) -> None:
        for w in self.workers.values():
            code = None if w.proc is None else w.proc.poll()
            if code is not None and w.phase != "ended":
                tail = log_tail(w.log)
                message = f"the local worker for {w.name} exited with code {code} {what}{': ' + tail if tail else ''}"
                if w.phase != "connecting":  # it had answered: dying now (out of memory, say) loses the device
                    self._lost(w, message)
                raise RunError(message)

    def _lost(self, w: WorkerLink, message: str):
        """A working device is gone mid-run: it will not answer, so close() waits for nothing from it."""
        w.phase = "ended"
        raise DeviceLost(w.name, message)

    def _ping(self) -> None:
        now = time.monotonic()
        if now - self.last_ping >= PING_S:
            self.last_ping = now
            for w in self.workers.values():
                if w.phase not in ("connecting", "ended"):
                    self._send(w, {"t": "ping"})
