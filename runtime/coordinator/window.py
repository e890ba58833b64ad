"""The request window: requests issued (inputs first, then `run` to every worker) while at most `inflight` are
open, their outputs and `done`s collected, and results yielded in request order. A part of WorkerPool
(pool.py)."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Iterable, Iterator, Mapping

import numpy as np
import zmq

from ..errors import InputError, RunError
from ..manifest.types import HOST
from ..wire.transport import BadMessage, decode_tensor, pack, send_tensor
from .emulate import undilated_offsets, undilated_starts, undilated_times
from .workers import WorkerLink

__all__ = ["Window", "OpenRequest", "IDLE", "steady_throughput"]

IDLE = object()  # what a request source yields when it has no request at hand (WorkerPool.stream)


class OpenRequest:
    """A request in flight: when it was sent, its outputs and each worker's `done` as they arrive."""

    __slots__ = ("req", "t_sent", "t_clock", "outputs", "done", "t_outputs", "times", "starts")

    def __init__(self, req: int):
        self.req, self.t_sent = req, time.perf_counter()
        self.t_clock = time.monotonic()  # the clock the workers' offsets are estimated against (--trace)
        self.outputs: dict[str, np.ndarray] = {}
        self.done: dict[str, float] = {}
        self.t_outputs: float | None = None
        self.times: dict[str, tuple[list, list]] = {}  # per device: (frag_ms, clocks) of its `done`
        self.starts: dict[str, list] = {}  # per device: run_clocks of its `done` (--trace)


class Window:
    """WorkerPool's requests: stream(), infer() and the messages that complete a request."""

    def stream(self, requests: Iterable[Mapping[str, np.ndarray]], inflight: int | None = None
               ) -> Iterator[tuple[dict[str, np.ndarray], float, dict[str, float]]]:
        """(outputs, latency ms, fragment run ms per device) for each request, in request order, keeping up
        to `inflight` (default: the cluster's) requests in flight.

        A long-lived source (the serving session's queue) yields IDLE when it has no request at hand: the
        pool then waits on its workers (heartbeats, outputs) until `wake_fd` is readable, which the source's
        producer writes a byte to when it hands over a request, or a poll interval passes."""
        window = min(self.inflight, inflight or self.inflight)
        pending: deque[OpenRequest] = deque()
        source = iter(requests)
        exhausted = False
        deadlines: dict[int, float] = {}  # per request at the head: when it times out
        while pending or not exhausted:
            idle = False
            while not exhausted and not idle and len(pending) < window:
                inputs = next(source, None)
                if inputs is None:
                    exhausted = True
                elif inputs is IDLE:
                    idle = True
                else:
                    pending.append(self._issue(inputs))
            if not pending:
                if idle:  # nothing in flight, nothing at hand: wait for either
                    self.woken = False
                    self._pump(math.inf, lambda: self.woken, "waiting for requests")
                continue
            head = pending[0]
            deadline = deadlines.setdefault(head.req, time.monotonic() + self.timeout)
            if idle and len(pending) < window:  # a request handed over meanwhile goes in at once
                self.woken = False
                self._pump(deadline, lambda: self._complete(head) or self.woken, f"in request {head.req}")
                if not self._complete(head):
                    continue
            else:
                self._pump(deadline, lambda: self._complete(head), f"in request {head.req}")
            pending.popleft()
            del self.open[head.req], deadlines[head.req]
            latency = ((head.t_outputs or time.perf_counter()) - head.t_sent) * 1000.0
            if self.samples is not None:  # on the emulated clock (dilation 1 outside emulation)
                times, offsets = undilated_times(head.times, self.dilate), undilated_offsets(self.offsets, self.dilate)
                self.last_timed = self.samples.add(times, offsets)
                if self.trace is not None:
                    starts = undilated_starts(head.starts, self.dilate)
                    self.trace.add(self.manifest, times, starts, offsets, head.t_clock / self.dilate,
                                   latency / self.dilate)
            yield dict(head.outputs), latency, dict(head.done)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, dict[str, float]]:
        """One request alone: (outputs, latency in ms until the last output arrived, fragment run ms per device)."""
        return next(iter(self.stream([inputs], inflight=1)))

    def _complete(self, r: OpenRequest) -> bool:
        return len(r.outputs) == len(self.collects) and len(r.done) == len(self.workers)

    def _issue(self, inputs: Mapping[str, np.ndarray]) -> OpenRequest:
        feeds = self._host_feeds(inputs)
        missing = sorted({name for _, name in feeds} - set(inputs))
        if missing:
            raise InputError(f"{self.manifest.path}: no value for model input(s) {missing}")
        r = self.open[self.next_req] = OpenRequest(self.next_req)
        self.next_req += 1
        # The inputs go first: a worker then usually finds them already there with its `run` and starts at
        # once, instead of waking for `run` and sleeping again until the inputs are decrypted (a wake-up less).
        for name, tensor in feeds:
            w = self.workers[name]
            try:
                send_tensor(w.sock, r.req, HOST, tensor, np.asarray(inputs[tensor]))
            except zmq.Again:
                raise RunError(f"{w.where}: accepted nothing for {self.timeout:g} s") from None
        extra = self._run_fields(r.req, inputs)
        run = pack({"t": "run", "req": r.req, "slow": 1.0, **extra})
        for w in self.workers.values():
            slow = self.slowdown.get(w.name, 1.0)
            self._send_packed(w, run if slow == 1.0 else pack({"t": "run", "req": r.req, "slow": slow, **extra}))
        return r

    def _host_feeds(self, inputs: Mapping[str, np.ndarray]) -> list[tuple[str, str]]:
        """(device, input) of the model inputs the coordinator sends for this request: every host feed (a
        generative pool's step whose token comes from a device leaves that one out)."""
        return self.feeds

    def _run_fields(self, req: int, inputs: Mapping[str, np.ndarray]) -> dict:
        """What a request's `run` carries besides req and slow (a generative pool adds the sequence)."""
        return {}

    def _output_shape(self, name: str, req: int) -> tuple[int, ...]:
        """The shape an output of request `req` must have (a generative pool's change from step to step)."""
        return self.specs[name].shape

    def _send_packed(self, w: WorkerLink, frame: bytes) -> None:
        try:
            w.sock.send(frame)
        except zmq.Again:
            raise RunError(f"{w.where}: accepted nothing for {self.timeout:g} s") from None

    def _on_done(self, w: WorkerLink, msg: dict, payload) -> None:
        r = self.open.get(msg["req"])
        if r is None or w.name in r.done:
            return self.drops.drop(f"'done' from {w.name} for request {msg['req']}, which is not open")
        if self.samples is not None:
            self.samples.check(w.name, msg["frag_ms"], msg["clocks"])
            r.times[w.name] = (msg["frag_ms"], msg["clocks"])
            r.starts[w.name] = msg["run_clocks"]  # one per frag_ms entry (protocol.parse)
        r.done[w.name] = float(msg["run_ms"])

    def _on_tensor(self, w: WorkerLink, msg: dict, payload) -> None:
        try:
            t = decode_tensor(msg, payload, self.max_output_bytes)
        except BadMessage as exc:
            return self.drops.drop(f"bad output from {w.name}", exc)
        r = self.open.get(t.req)
        if r is None or t.name in r.outputs:
            return self.drops.drop(f"output {t.name[:80]!r} from {w.name} for request {t.req}, which is not open")
        if self.collects.get(t.name) != w.name or t.src != w.name:
            raise RunError(f"unexpected output {t.name!r} from {w.name}")
        spec, shape = self.specs[t.name], self._output_shape(t.name, t.req)
        if t.array.shape != shape or msg["dtype"] != spec.dtype:  # decode_tensor checked the name
            raise RunError(f"output {t.name!r} from {w.name} has shape {t.array.shape} {t.array.dtype.name}, "
                           f"the manifest says {shape} {spec.dtype}")
        r.outputs[t.name] = t.array
        if len(r.outputs) == len(self.collects):
            r.t_outputs = time.perf_counter()


def steady_throughput(start: float, done_at: list[float]) -> float:
    """Requests per second in steady state: the outputs after the first over the time from the first output
    to the last. The first request's latency (the pipeline filling up) is not a rate and would weigh on a
    short run: 20 requests through a two-stage MobileNetV2 read 9% low by requests / wall time. One request:
    1 / its latency."""
    if len(done_at) >= 2 and done_at[-1] > done_at[0]:
        return (len(done_at) - 1) / (done_at[-1] - done_at[0])
    return len(done_at) / max((done_at[-1] if done_at else time.perf_counter()) - start, 1e-9)
