"""The worker pool: the workers of a manifest's working devices, reached or started, handed their fragments,
streaming requests through the stages and collecting the outputs in request order. The protocol is in
wire/protocol.py.

WorkerPool is one object whose jobs live in modules of their own, each a part of the class: connect.py
(starting and reaching workers, the handshake), shipping.py (fragment files), window.py (the request window),
liveness.py (heartbeats, exits, deadlines), clocks.py (clock sync for --report and --trace) and emulate.py
(--emulate's channel and overruns); here are the state they share, the message loop that dispatches each
worker message to its `_on_<type>` handler, and close. A device lost mid-run raises DeviceLost; failover.py's
FailoverPool then finishes the run on the build's fallback plan."""

from __future__ import annotations

import os
import time
import uuid
from typing import Callable, Mapping

import zmq
from zmq.utils.monitor import parse_monitor_message

from ..errors import RunError
from ..machine import MAX_THREADS_HERE
from ..manifest.schedule import host_collects, host_feeds, pipeline_depth
from ..manifest.types import Manifest
from ..wire.compress import parse_mode
from ..wire.keys import Keyring
from ..wire.protocol import DropLog, parse
from ..wire.transport import POLL_MS, BadMessage, pack, recv_message, send_frames
from .clocks import Clocks, timings_store
from .connect import Connecting
from .emulate import Channel, Emulating, Overruns
from .liveness import HEARTBEAT_MS, DeviceLost, Liveness
from .shipping import Shipping
from .trace import Trace
from .window import OpenRequest, Window
from .workers import WorkerLink, default_threads, reap, resolve_endpoints

__all__ = ["WorkerPool"]

_FROM_WORKER = frozenset({"welcome", "refused", "opened", "ack", "loaded", "ready", "synced", "done", "tensor", "error",
                          "bye", "channel", "overrun"})


class WorkerPool(Connecting, Shipping, Window, Liveness, Clocks, Emulating):
    """The workers of a manifest's working devices; use as a context manager.

    `stream(inputs)` keeps up to `inflight` requests in flight and yields results in request order; `infer`
    runs one request alone. Local workers die with the coordinator's process (forked by its zygote,
    device/zygote.py); where no zygote can run, with the thread that started them (Linux PR_SET_PDEATHSIG), so
    start and use a cluster from one long-lived thread.
    """

    def __init__(self, manifest: Manifest, *, threads: int | None = None, emulate: bool = False,
                 timeout: float = 60.0, addresses: Mapping[str, str] | None = None, keys: Keyring | None = None,
                 inflight: int | None = None, compress: str = "none", heartbeat_ms: int = HEARTBEAT_MS,
                 timings: bool = False, dilate: float = 1.0, overruns: Overruns | None = None,
                 trace: Trace | None = None):
        self.manifest, self.emulate, self.timeout, self.keys = manifest, emulate, timeout, keys
        # Emulation (emulate.py): times stretched by `dilate`; the shared medium's one channel is arbitrated
        # here; fragment runs slower than their padding are collected in `overruns`.
        self.dilate, self.overruns = float(dilate), overruns
        self.channel = Channel() if emulate and manifest.network.medium == "shared" else None
        # With timings: every worker's clock offset is estimated at start, every request timed (accuracy.py);
        # with a trace too, which also records each request's timeline from those timings (trace.py).
        self.samples = timings_store(manifest) if timings or trace is not None else None
        self.trace = trace
        self.ephemeral = False  # whether `keys` were made in memory for this run alone (start, close)
        self.heartbeat_ms = heartbeat_ms
        self.compress = parse_mode(compress)  # how the workers send tensors to each other (wire/compress.py)
        endpoints = resolve_endpoints(manifest, addresses)
        self.workers = {name: WorkerLink(name, ep) for name, ep in endpoints.items()}
        local = [n for n, w in self.workers.items() if w.local]
        self.threads = default_threads(manifest, local) if threads is None else threads
        # Without --threads, a device whose plan was priced at a thread count (cluster.yaml `threads`) runs its
        # local worker at that count, within what `edgec worker --threads` accepts.
        self.device_threads = {} if threads is not None else {
            d.name: min(d.threads, MAX_THREADS_HERE) for d in manifest.devices if d.threads is not None}
        self.inflight = pipeline_depth(manifest) if inflight is None else inflight
        self.feeds = host_feeds(manifest)
        self.collects = host_collects(manifest)
        self.specs = {o.name: o for o in manifest.outputs}
        # Bounds what decoding a (possibly compressed) output may allocate: nothing larger is expected.
        self.max_output_bytes = max((o.nbytes for o in manifest.outputs), default=0)
        self.ctx: zmq.Context | None = None
        self.poller = zmq.Poller()
        self.by_socket: dict[zmq.Socket, tuple[WorkerLink, bool]] = {}
        self.session = uuid.uuid4().bytes
        self.next_req = 0
        self.open: dict[int, OpenRequest] = {}
        # Emulated drift (emulate.py): {device: factor} its fragment runs are padded by, for the requests issued
        # from now on (FailoverPool sets it per request).
        self.slowdown: dict[str, float] = {}
        self.last_timed: tuple[dict, dict] | None = None  # the last completed request's measured times
        self.last_ping = 0.0
        self.drops = DropLog("coordinator")
        self.wake_fd: int | None = None  # watch(): a pipe whose byte ends stream()'s waits for requests
        self.woken = False

    def __enter__(self) -> "WorkerPool":
        try:
            self.start()
            if self.samples is not None:
                self.sync_clocks()
        except DeviceLost:
            # A fallback plan may run next on the devices still there: each must have ended this session (a
            # worker serves one at a time), which on a busy machine can take longer than close()'s default.
            self.close(grace=self.timeout)
            raise
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, w: WorkerLink, msg: dict, payload=None) -> None:
        frames = [pack(msg)] if payload is None else [pack(msg), payload]
        try:
            send_frames(w.sock, frames)
        except zmq.Again:
            raise RunError(f"{w.where}: accepted nothing for {self.timeout:g} s") from None

    def _pump(self, deadline: float, finished: Callable[[], bool], what: str) -> None:
        """Handle worker messages until `finished()`; fail on a worker error, death or the deadline."""
        while not finished():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._timed_out(what)
            for sock, _ in self.poller.poll(min(remaining * 1000.0, POLL_MS)):
                if sock == self.wake_fd:
                    self._on_wake()
                    continue
                w, is_monitor = self.by_socket[sock]
                if is_monitor:
                    self._on_monitor(w)
                else:
                    self._drain(w)
            self._check_alive(what)
            self._ping()

    def watch(self, wake_fd: int) -> None:
        """Wake stream()'s waits when `wake_fd` (a pipe's read end, owned by the caller) is readable."""
        self.wake_fd = wake_fd
        self.poller.register(wake_fd, zmq.POLLIN)

    def _on_wake(self) -> None:
        try:
            os.read(self.wake_fd, 4096)
        except BlockingIOError:
            pass
        self.woken = True

    def _drain(self, w: WorkerLink) -> None:
        for _ in range(256):
            frames = recv_message(w.sock)
            if frames is None:
                return
            try:
                msg, payload = parse(frames, _FROM_WORKER)
            except BadMessage as exc:
                self.drops.drop(f"bad message from {w.name}", exc)
                continue
            getattr(self, f"_on_{msg['t']}")(w, msg, payload)

    def _on_bye(self, w: WorkerLink, msg: dict, payload) -> None:
        w.stats = {k: v for k, v in msg["stats"].items() if isinstance(k, str) and isinstance(v, (int, float))}
        w.phase = "ended"

    def device_report(self) -> dict[str, dict]:
        return {w.name: {"address": None if w.local else str(w.endpoint), "local": w.local,
                         "fragment_bytes_sent": w.fragment_bytes_sent, **w.stats} for w in self.workers.values()}

    def close(self, grace: float = 2.0) -> None:
        """End the run on every worker (collecting their counts, waiting up to `grace` seconds for them), stop
        local workers; idempotent."""
        if self.ctx is None:
            return
        if self.wake_fd is not None:  # the caller's pipe: nothing to wait for any more
            self.poller.unregister(self.wake_fd)
            self.wake_fd = None
        talking = [w for w in self.workers.values() if w.sock is not None and w.phase != "ended"
                   and (w.phase != "connecting" or self._reached(w))]
        for w in talking:
            try:
                w.sock.send(pack({"t": "end"}), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                w.phase = "ended"
        deadline = time.monotonic() + grace  # an idle worker answers in milliseconds
        try:
            while any(w.phase != "ended" for w in talking) and time.monotonic() < deadline:
                for sock, _ in self.poller.poll(100):
                    w, is_monitor = self.by_socket[sock]
                    if not is_monitor:
                        self._drain_quietly(w)
        except zmq.ZMQError:
            pass
        for w in self.workers.values():
            if w.blobs is not None:
                w.blobs.close()
            if w.proc is not None:
                reap(w.proc, time.monotonic() + 1.0)
                if w.proc.stdout is not None:
                    w.proc.stdout.close()
            if w.log is not None:
                w.log.close()
        self.ctx.destroy(linger=0)
        self.ctx = None
        if self.ephemeral:
            self.keys, self.ephemeral = None, False

    def _reached(self, w: WorkerLink) -> bool:
        """Whether a worker still connecting when the run ends holds a session of this coordinator, or may:
        told hello over a connection whose handshake succeeded (its monitor's events read here), it began one
        when it read the hello, or will, and a worker serves one session at a time, so it must be told the
        run is over, or it stays busy for the next coordinator (a fallback plan's) until it misses our
        heartbeats.  A worker never reached (no handshake) cannot have read the hello: nothing to wait for."""
        if not w.hello_sent or w.monitor is None:
            return False
        while not w.handshake_ok:
            try:
                event = parse_monitor_message(w.monitor.recv_multipart(flags=zmq.NOBLOCK))["event"]
            except zmq.Again:
                break
            w.handshake_ok = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
        return w.handshake_ok

    def _drain_quietly(self, w: WorkerLink) -> None:
        """While closing: only the final counts matter; late outputs and errors are ignored, and a worker that
        refused the run (busy with another coordinator's) has no session of ours to end."""
        while (frames := recv_message(w.sock)) is not None:
            try:
                msg, _ = parse(frames, _FROM_WORKER)
            except BadMessage:
                continue
            if msg["t"] in ("bye", "error", "refused"):
                if msg["t"] == "bye":
                    self._on_bye(w, msg, None)
                w.phase = "ended"
