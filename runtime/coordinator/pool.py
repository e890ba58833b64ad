"""The coordinator: reaches a worker for every device that has steps (at its address, or a worker process
it starts on this machine), hands out the fragments, streams requests through the stages, and collects
the outputs in request order. The protocol is in protocol.py.

A device lost mid-run (its worker exits, its connection drops, or it leaves HEARTBEAT_MISSES heartbeats
unanswered) raises DeviceLost; FailoverCluster (which the serving session, edgec.Cluster, uses) then finishes the run on the build's
fallback plan without that device (`edgec compile --fallbacks`), re-running the requests not completed."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

from .adapt import Adapter, Option
from .accuracy import SYNC_ROUNDS, ClockOffset, Samples, estimate_offset
from ..wire.compress import parse_mode
from .emulate import Channel, Overruns, undilated_offsets, undilated_starts, undilated_times
from ..errors import InputError, RunError, one_line
from ..wire.keys import COORDINATOR, Keyring, ephemeral_keyring
from ..machine import MAX_THREADS_HERE, available_cores, edgec_version
from ..manifest.types import HOST, Fragment, Manifest
from ..manifest.load import check_fragment_files, load_fallback, manifest_json
from ..wire.net import Endpoint, outward_host, parse_endpoint
from ..wire.protocol import BLOB_CHUNK, BLOB_WINDOW, MAX_TIMED_STEPS, PROTOCOL_VERSION, DropLog, parse
from ..manifest.schedule import host_collects, host_feeds, pipeline_depth, recv_keys, send_targets, working_devices
from ..manifest.signatures import check_signatures
from .trace import Trace
from ..wire.transport import POLL_MS, BadMessage, decode_tensor, pack, recv_message, send_frames, send_tensor

__all__ = ["RunResult", "WorkerPool", "LocalCluster", "FailoverCluster", "DeviceLost", "IDLE", "steady_throughput",
           "default_threads", "resolve_endpoints", "HEARTBEAT_MS", "HEARTBEAT_MISSES"]

logger = logging.getLogger(__name__)

PING_S = 1.0  # a worker ends a run whose coordinator stays silent for its --idle-timeout
# zmq's own keep-alive on every worker connection (ZMTP PING/PONG, answered by the worker's zmq I/O thread even
# while onnxruntime computes): a connection that receives nothing at all for HEARTBEAT_MISSES intervals is
# dropped, and the device is lost. --heartbeat-ms sets the interval.
HEARTBEAT_MS, HEARTBEAT_MISSES = 1000, 5
_HANDSHAKE_FAILED = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                     zmq.EVENT_HANDSHAKE_FAILED_AUTH}
_FROM_WORKER = frozenset({"welcome", "refused", "opened", "ack", "loaded", "ready", "synced", "done", "tensor", "error",
                          "bye", "channel", "overrun"})
IDLE = object()  # what a request source yields when it has no request at hand (WorkerPool.stream)
_LISTENING = re.compile(r"edgec worker: listening on (tcp://\S+)")


class DeviceLost(RunError):
    """A working device stopped answering mid-run: its worker process exited, its connection dropped, or it
    left HEARTBEAT_MISSES heartbeats unanswered; or its worker, having answered, died as the run started (killed
    out of memory loading its fragments, say). FailoverCluster switches to the fallback plan without it."""

    def __init__(self, device: str, message: str):
        super().__init__(message)
        self.device = device


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    latencies_ms: list[float]
    device_run_ms: dict[str, list[float]] = field(default_factory=dict)  # per device, one entry per request
    threads: int = 0  # onnxruntime intra-op threads per local worker (0 = onnxruntime's default)
    inflight: int = 1
    throughput_ips: float = 0.0  # steady-state: outputs after the first / (last output - first output); see api.run_manifest
    devices: dict[str, dict] = field(default_factory=dict)  # per worker: address, bytes counted, memory
    compress: str = "none"  # the --compress mode of device-to-device tensors
    completed: int = 0  # timed requests whose outputs came back (the warm-up is not counted)
    warmup: int = 1  # untimed requests run one at a time before the timed ones
    lost: int = 0  # timed requests asked for and not completed
    failovers: list[dict] = field(default_factory=list)  # [{device, at_request, plan}] (FailoverCluster)
    accuracy: dict | None = None  # run_manifest(timings=True): the --report object (accuracy.py)
    trace: dict | None = None  # run_manifest(trace=True): the --trace object (trace.py)
    emulation: dict | None = None  # run_manifest(emulate=True): {dilate, overruns} (emulate.Overruns.as_json)
    adaptations: list[dict] = field(default_factory=list)  # run_manifest(adapt=...): adapt.Adapter.as_json

    @property
    def latency_ms(self) -> float:
        return statistics.median(self.latencies_ms)


def default_threads(manifest: Manifest, local: Iterable[str] | None = None) -> int:
    """Intra-op threads per local worker: this machine's cores shared among the devices that run fragments
    here; a single such device gets onnxruntime's default (0), like plain onnxruntime."""
    here = set(manifest.device_names if local is None else local)
    busy = sum(1 for d in manifest.device_names if d in here and manifest.device_fragments(d))
    return 0 if busy <= 1 else max(1, available_cores() // busy)


def resolve_endpoints(manifest: Manifest, overrides: Mapping[str, str] | None = None) -> dict[str, Endpoint | None]:
    """Each working device's worker address (--addresses over the manifest's), None for a local one."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(manifest.device_names))
    if unknown:
        raise InputError(f"--addresses: no device {unknown[0]!r} in {manifest.path} (devices: "
                         f"{', '.join(manifest.device_names)})")
    found: dict[str, Endpoint | None] = {}
    addresses = {d.name: d.address for d in manifest.devices}
    for name in working_devices(manifest):
        if name in overrides:
            found[name] = parse_endpoint(overrides[name], f"--addresses {name}")
        elif addresses.get(name):
            found[name] = parse_endpoint(addresses[name], f"{manifest.path}: device {name}: address")
        else:
            found[name] = None
    return found


class _Request:
    __slots__ = ("req", "t_sent", "t_clock", "outputs", "done", "t_outputs", "times", "starts")

    def __init__(self, req: int):
        self.req, self.t_sent = req, time.perf_counter()
        self.t_clock = time.monotonic()  # the clock the workers' offsets are estimated against (--trace)
        self.outputs: dict[str, np.ndarray] = {}
        self.done: dict[str, float] = {}
        self.t_outputs: float | None = None
        self.times: dict[str, tuple[list, list]] = {}  # per device: (frag_ms, clocks) of its `done`
        self.starts: dict[str, list] = {}  # per device: run_clocks of its `done` (--trace)


class _Worker:
    """The coordinator's connection to one device's worker."""

    def __init__(self, name: str, endpoint: Endpoint | None):
        self.name, self.endpoint = name, endpoint
        self.local = endpoint is None
        self.proc: subprocess.Popen | None = None
        self.log = None
        self.sock: zmq.Socket | None = None
        self.monitor: zmq.Socket | None = None
        self.key: bytes | None = None  # the worker's public key (its CURVE server key)
        self.phase = "connecting"  # -> welcomed -> opened -> loaded -> ready -> ended
        self.handshake_ok = False
        self.data_addr: str | None = None
        self.blobs: Iterator | None = None
        self.unacked = 0
        self.fragment_bytes_sent = 0
        self.stats: dict = {}
        self.sync: tuple[int, float] | None = None  # the `sync` awaiting its answer: (seq, coordinator clock)
        self.offset: ClockOffset | None = None  # the best estimate of the worker's clock offset so far

    @property
    def where(self) -> str:
        return f"device {self.name} ({'local worker' if self.local else 'worker'} at {self.endpoint})"


class WorkerPool:
    """The workers of a manifest's working devices; use as a context manager.

    `stream(inputs)` keeps up to `inflight` requests in flight and yields results in request order; `infer`
    runs one request alone. Local workers die with the thread that started them (Linux PR_SET_PDEATHSIG),
    so start and use a cluster from one long-lived thread.
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
        self.samples = _samples(manifest) if timings or trace is not None else None
        self.trace = trace
        self.ephemeral = False  # whether `keys` were made in memory for this run alone (start, close)
        self.heartbeat_ms = heartbeat_ms
        self.compress = parse_mode(compress)  # how the workers send tensors to each other (compress.py)
        endpoints = resolve_endpoints(manifest, addresses)
        self.workers = {name: _Worker(name, ep) for name, ep in endpoints.items()}
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
        self.by_socket: dict[zmq.Socket, tuple[_Worker, bool]] = {}
        self.session = uuid.uuid4().bytes
        self.next_req = 0
        self.open: dict[int, _Request] = {}
        # Emulated drift (emulate.py): {device: factor} its fragment runs are padded by, for the requests issued
        # from now on (FailoverCluster sets it per request).
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
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- start-up ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.ctx = zmq.Context()
        deadline = time.monotonic() + self.timeout
        if self.keys is None and self.workers and all(w.local for w in self.workers.values()):
            # Every worker is ours: keys made for this run make their sockets CURVE too, so another process on
            # this machine cannot feed them tensors. (A keyless remote worker takes no CURVE: then loopback only.)
            self.keys = ephemeral_keyring(self.workers)
            self.ephemeral = True
        for w in self.workers.values():
            if w.local:
                self._spawn(w)
        for w in self.workers.values():
            if w.local:
                w.endpoint = self._await_listening(w, deadline)
            self._connect(w)
        for w in self.workers.values():
            self._send_first(w, {"t": "hello", "protocol": PROTOCOL_VERSION, "edgec": edgec_version()}, deadline)
        self._pump(deadline, lambda: self._all("welcomed"), "connecting")
        raw, path = manifest_json(self.manifest), str(self.manifest.path)
        for w in self.workers.values():
            self._send(w, {"t": "open", "device": w.name, "manifest": raw, "path": path, "inflight": self.inflight,
                           "emulate": self.emulate, "compress": self.compress, "dilate": self.dilate})
        self._pump(deadline, lambda: self._all("loaded"), "loading fragments")
        peers = {w.name: {"addr": w.data_addr, "key": None if w.key is None else w.key.decode()}
                 for w in self.workers.values()}
        for w in self.workers.values():
            self._send(w, {"t": "peers", "peers": peers})
        self._pump(deadline, lambda: self._all("ready"), "connecting the devices")

    def _all(self, phase: str) -> bool:
        order = ["connecting", "welcomed", "opened", "loaded", "ready"]
        return all(order.index(w.phase) >= order.index(phase) for w in self.workers.values())

    def _spawn(self, w: _Worker) -> None:
        cmd = [sys.executable, "-m", "edgec.runtime.device.worker", "--listen", "tcp://127.0.0.1:0", "--threads",
               str(self.device_threads.get(w.name, self.threads)), "--once", "--exit-with-parent",
               "--parent", str(os.getpid())]
        in_memory = self.keys is not None and self.keys.folder is None
        if in_memory:  # the worker reads its key pair on stdin: no key file a killed run could leave behind
            cmd += ["--keys-stdin"]
        elif self.keys is not None:
            cmd += ["--keys", str(self.keys.folder), "--name", self.keys.serves_as(w.name)]
        data_host = self._local_data_host(w.name)
        if data_host is not None:
            cmd += ["--data-host", data_host]
        w.log = tempfile.TemporaryFile()
        # A session of its own: Ctrl-C in a terminal (SIGINT to the foreground group) reaches the coordinator
        # alone, which then ends the run on its workers (edgec serve answers what it accepted first); the
        # worker still dies with its parent (--parent).
        w.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if in_memory else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=w.log, start_new_session=True)
        if in_memory:
            try:  # one line, far below a pipe's buffer: never blocks
                w.proc.stdin.write(self.keys.member_json(self.keys.serves_as(w.name)))
                w.proc.stdin.close()
            except OSError:  # the worker already exited: _await_listening reports why
                pass
        logger.debug("started a local worker for %s (pid %d)", w.name, w.proc.pid)

    def _local_data_host(self, name: str) -> str | None:
        """Where a local worker binds its data socket: loopback, unless a remote device exchanges tensors
        with it, which must reach it at this machine's address on the route to that device."""
        m = self.manifest
        partners = send_targets(m, name) | {src for src, _ in recv_keys(m, name) if src != HOST}
        partners |= {d for d in m.device_names if name in send_targets(m, d)}
        for p in sorted(partners):
            ep = self.workers[p].endpoint if p in self.workers else None
            if ep is not None and not ep.loopback:
                return outward_host(ep)
        return None

    def _await_listening(self, w: _Worker, deadline: float) -> Endpoint:
        """The address a local worker bound, from the one line it prints on stdout."""
        out = w.proc.stdout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RunError(f"timed out after {self.timeout:g} s starting the local worker for {w.name}")
            ready, _, _ = select.select([out], [], [], min(remaining, POLL_MS / 1000.0))
            if ready:
                line = out.readline().decode(errors="replace")
                m = _LISTENING.search(line)
                if m:
                    return parse_endpoint(m.group(1), f"local worker {w.name}")
                if line:
                    continue
            code = w.proc.poll()
            if code is not None:
                tail = _tail(w.log)
                cls = InputError if code == 2 else RunError
                raise cls(f"the local worker for {w.name} exited with code {code}{': ' + tail if tail else ''}")

    def _connect(self, w: _Worker) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, self.session)  # the same id on a reconnection: the session survives it
        sock.setsockopt(zmq.HEARTBEAT_IVL, self.heartbeat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.heartbeat_ms * HEARTBEAT_MISSES)
        sock.setsockopt(zmq.SNDTIMEO, int(self.timeout * 1000))
        if self.keys is not None:
            w.key = self._server_key(w)
            self.keys.connect_to(sock, w.key)
        monitor_addr = f"inproc://monitor-{uuid.uuid4().hex}"
        sock.monitor(monitor_addr, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        w.monitor = self.ctx.socket(zmq.PAIR)
        w.monitor.connect(monitor_addr)
        sock.connect(str(w.endpoint))
        w.sock = sock
        for s, is_monitor in ((sock, False), (w.monitor, True)):
            self.poller.register(s, zmq.POLLIN)
            self.by_socket[s] = (w, is_monitor)

    def _server_key(self, w: _Worker) -> bytes:
        """A remote worker serves with its device's key; a local one with the key it was started with."""
        return self.keys.key_of(w.name if not w.local else self.keys.serves_as(w.name))

    # -- messages ----------------------------------------------------------------------------------------
    def _send(self, w: _Worker, msg: dict, payload=None) -> None:
        frames = [pack(msg)] if payload is None else [pack(msg), payload]
        try:
            send_frames(w.sock, frames)
        except zmq.Again:
            raise RunError(f"{w.where}: accepted nothing for {self.timeout:g} s") from None

    def _send_first(self, w: _Worker, msg: dict, deadline: float) -> None:
        """The first message to a worker, once its socket can take it, watching the connection's monitor
        meanwhile: a handshake that fails before the message is queued (a keyless coordinator at a CURVE
        worker) removes the socket's only pipe, and a blocking send would then wait out --timeout and report
        "accepted nothing" (exit 3) where the monitor says what is wrong (exit 2)."""
        poller = zmq.Poller()
        poller.register(w.sock, zmq.POLLOUT)
        poller.register(w.monitor, zmq.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._timed_out("connecting")
            ready = dict(poller.poll(min(remaining * 1000.0, POLL_MS)))
            if w.monitor in ready:
                self._on_monitor(w)
            if w.sock in ready:
                return self._send(w, msg)

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

    def _drain(self, w: _Worker) -> None:
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

    def _on_monitor(self, w: _Worker) -> None:
        while True:
            try:
                event = parse_monitor_message(w.monitor.recv_multipart(flags=zmq.NOBLOCK))["event"]
            except zmq.Again:
                return
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                w.handshake_ok = True
            elif event in _HANDSHAKE_FAILED:
                raise InputError(f"{w.where}: the secure handshake failed: "
                                 + ("the worker requires keys; pass --keys DIR" if self.keys is None else
                                    "the keys do not match (the worker does not hold this cluster's keys, or "
                                    f"{self.keys.where}/{w.name}.key is not that worker's key)"))
            elif event == zmq.EVENT_DISCONNECTED and w.phase == "ready":
                self._lost(w, f"{w.where}: lost the connection to the worker (it closed, or answered no "
                              f"heartbeat for {self.heartbeat_ms * HEARTBEAT_MISSES / 1000:g} s)")
            elif event == zmq.EVENT_DISCONNECTED and w.phase not in ("connecting", "ended"):
                # Past its welcome, a worker whose connection drops is gone (killed, out of memory as it loads
                # its fragments, powered off): as lost as one that dies mid-run.
                self._lost(w, f"{w.where}: lost the connection to the worker while the run started")

    def _on_welcome(self, w: _Worker, msg: dict, payload) -> None:
        if w.phase != "connecting":
            return self.drops.drop(f"duplicate welcome from {w.name}")
        if msg["protocol"] != PROTOCOL_VERSION:
            raise InputError(f"{w.where}: the worker speaks protocol {msg['protocol']}, this coordinator "
                             f"{PROTOCOL_VERSION}: install the same edgec version on both")
        if self.keys is not None and (msg["key"] or "").encode() != w.key:
            raise InputError(f"{w.where}: the worker's key is not {w.name}'s")
        w.phase = "welcomed"
        logger.debug("%s: edgec %s, pid %d, %d thread(s), %d core(s)", w.where, one_line(msg["edgec"], 40),
                     msg["pid"], msg["threads"], msg["cores"])

    def _on_refused(self, w: _Worker, msg: dict, payload) -> None:
        raise InputError(f"{w.where}: refused: {one_line(msg['reason'], 300)}")

    def _on_error(self, w: _Worker, msg: dict, payload) -> None:
        message = one_line(msg["message"], 600) or f"{w.where} failed"
        if msg["kind"] == "stopped" and w.phase == "ready":  # going away mid-run (SIGTERM): lost, as if it died
            self._lost(w, message)
        raise (InputError if msg["kind"] == "input" else RunError)(message)

    def _on_opened(self, w: _Worker, msg: dict, payload) -> None:
        if w.phase != "welcomed":
            return self.drops.drop(f"unexpected 'opened' from {w.name}")
        port = msg["data_port"]
        if port is not None:
            host = w.endpoint.host
            if w.local and self._local_data_host(w.name):
                host = self._local_data_host(w.name)
            w.data_addr = str(Endpoint(host, port))
        frags = {f.sha256.lower(): f for f in self.manifest.device_fragments(w.name)}
        need = [frags[s] for s in msg["need"] if isinstance(s, str) and s in frags]
        if len(need) != len(msg["need"]):
            raise RunError(f"{w.where}: asked for fragments that are not its own")
        w.phase = "opened"
        w.blobs = self._blobs(w, need)
        self._feed(w)

    def _blobs(self, w: _Worker, frags: list[Fragment]) -> Iterator[tuple[dict, bytes]]:
        for frag in frags:
            path = self.manifest.fragment_path(frag)
            where = f"{self.manifest.path}: fragment {frag.id} ({frag.file})"
            h, offset = hashlib.sha256(), 0
            try:
                size = path.stat().st_size
                with open(path, "rb") as fh:
                    while True:
                        data = fh.read(BLOB_CHUNK)
                        h.update(data)
                        yield {"t": "blob", "sha256": frag.sha256.lower(), "offset": offset, "size": size}, data
                        offset += len(data)
                        if offset >= size or not data:
                            break
            except OSError as exc:
                raise InputError(f"{where}: cannot read it ({exc.strerror or exc})") from None
            if offset != size or h.hexdigest() != frag.sha256.lower():
                raise InputError(f"{where}: the file changed while it was being sent")

    def _feed(self, w: _Worker) -> None:
        while w.blobs is not None and w.unacked < BLOB_WINDOW:
            item = next(w.blobs, None)
            if item is None:
                w.blobs = None
                return
            header, data = item
            self._send(w, header, data)
            w.unacked += 1
            w.fragment_bytes_sent += len(data)

    def _on_ack(self, w: _Worker, msg: dict, payload) -> None:
        w.unacked = max(0, w.unacked - 1)
        self._feed(w)

    def _on_loaded(self, w: _Worker, msg: dict, payload) -> None:
        if w.phase == "opened":
            w.phase = "loaded"

    def _on_ready(self, w: _Worker, msg: dict, payload) -> None:
        if w.phase == "loaded":
            w.phase = "ready"

    def _on_bye(self, w: _Worker, msg: dict, payload) -> None:
        w.stats = {k: v for k, v in msg["stats"].items() if isinstance(k, str) and isinstance(v, (int, float))}
        w.phase = "ended"

    def _on_done(self, w: _Worker, msg: dict, payload) -> None:
        r = self.open.get(msg["req"])
        if r is None or w.name in r.done:
            return self.drops.drop(f"'done' from {w.name} for request {msg['req']}, which is not open")
        if self.samples is not None:
            self.samples.check(w.name, msg["frag_ms"], msg["clocks"])
            r.times[w.name] = (msg["frag_ms"], msg["clocks"])
            r.starts[w.name] = msg["run_clocks"]  # one per frag_ms entry (protocol.parse)
        r.done[w.name] = float(msg["run_ms"])

    # -- emulation -------------------------------------------------------------------------------------------
    def _on_channel(self, w: _Worker, msg: dict, payload) -> None:
        if self.channel is None:
            return self.drops.drop(f"'channel' from {w.name}, but the run emulates no shared medium")
        wait_s = self.channel.reserve(time.monotonic(), msg["ms"] / 1000.0, msg["since_ms"] / 1000.0)
        self._send(w, {"t": "grant", "seq": msg["seq"], "wait_ms": wait_s * 1000.0})

    def _on_overrun(self, w: _Worker, msg: dict, payload) -> None:
        if self.overruns is None:
            return self.drops.drop(f"'overrun' from {w.name}, but the run is not emulated")
        predicted = {f.id: f.predicted_ms for f in self.manifest.device_fragments(w.name)}
        for fid, ms in zip(msg["fragments"], msg["measured_ms"]):
            if fid not in predicted:
                self.drops.drop(f"'overrun' from {w.name} of a fragment not its own", fid[:80])
            else:
                self.overruns.add(w.name, fid, predicted[fid], float(ms))

    # -- clocks (for the timings of --report) ------------------------------------------------------------
    def sync_clocks(self) -> None:
        """Estimate every worker's clock offset (accuracy.py: Cristian's method, the fastest of SYNC_ROUNDS
        round trips); the first `sync` also switches the workers' per-request timings on."""
        deadline = time.monotonic() + self.timeout
        for seq in range(SYNC_ROUNDS):
            for w in self.workers.values():
                w.sync = (seq, time.monotonic())
                self._send(w, {"t": "sync", "seq": seq})
            self._pump(deadline, lambda: all(w.sync is None for w in self.workers.values()), "reading the clocks")
        for w in self.workers.values():
            logger.debug("%s: clock offset %+.3f ms (+- %.3f ms)", w.where, w.offset.offset_s * 1000.0,
                         w.offset.bound_s * 1000.0)

    def _on_synced(self, w: _Worker, msg: dict, payload) -> None:
        received = time.monotonic()
        if w.sync is None or msg["seq"] != w.sync[0]:
            return self.drops.drop(f"'synced' from {w.name} that answers no sync")
        estimate = estimate_offset(w.sync[1], msg["clock"], received)
        if w.offset is None or estimate.bound_s < w.offset.bound_s:
            w.offset = estimate
        w.sync = None

    @property
    def offsets(self) -> dict[str, ClockOffset]:
        return {w.name: w.offset for w in self.workers.values() if w.offset is not None}

    def _on_tensor(self, w: _Worker, msg: dict, payload) -> None:
        try:
            t = decode_tensor(msg, payload, self.max_output_bytes)
        except BadMessage as exc:
            return self.drops.drop(f"bad output from {w.name}", exc)
        r = self.open.get(t.req)
        if r is None or t.name in r.outputs:
            return self.drops.drop(f"output {t.name[:80]!r} from {w.name} for request {t.req}, which is not open")
        if self.collects.get(t.name) != w.name or t.src != w.name:
            raise RunError(f"unexpected output {t.name!r} from {w.name}")
        spec = self.specs[t.name]
        if t.array.shape != spec.shape or msg["dtype"] != spec.dtype:  # decode_tensor checked the name
            raise RunError(f"output {t.name!r} from {w.name} has shape {t.array.shape} {t.array.dtype.name}, "
                           f"the manifest says {spec.shape} {spec.dtype}")
        r.outputs[t.name] = t.array
        if len(r.outputs) == len(self.collects):
            r.t_outputs = time.perf_counter()

    def _check_alive(self, what: str) -> None:
        for w in self.workers.values():
            code = None if w.proc is None else w.proc.poll()
            if code is not None and w.phase != "ended":
                tail = _tail(w.log)
                message = f"the local worker for {w.name} exited with code {code} {what}{': ' + tail if tail else ''}"
                if w.phase != "connecting":  # it had answered: dying now (out of memory, say) loses the device
                    self._lost(w, message)
                raise RunError(message)

    def _lost(self, w: _Worker, message: str):
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

    # -- requests ----------------------------------------------------------------------------------------
    def stream(self, requests: Iterable[Mapping[str, np.ndarray]], inflight: int | None = None
               ) -> Iterator[tuple[dict[str, np.ndarray], float, dict[str, float]]]:
        """(outputs, latency ms, fragment run ms per device) for each request, in request order, keeping up
        to `inflight` (default: the cluster's) requests in flight.

        A long-lived source (the serving session's queue) yields IDLE when it has no request at hand: the
        pool then waits on its workers (heartbeats, outputs) until `wake_fd` is readable, which the source's
        producer writes a byte to when it hands over a request, or a poll interval passes."""
        window = min(self.inflight, inflight or self.inflight)
        pending: deque[_Request] = deque()
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

    def _complete(self, r: _Request) -> bool:
        return len(r.outputs) == len(self.collects) and len(r.done) == len(self.workers)

    def _issue(self, inputs: Mapping[str, np.ndarray]) -> _Request:
        missing = sorted({name for _, name in self.feeds} - set(inputs))
        if missing:
            raise InputError(f"{self.manifest.path}: no value for model input(s) {missing}")
        r = self.open[self.next_req] = _Request(self.next_req)
        self.next_req += 1
        # The inputs go first: a worker then usually finds them already there with its `run` and starts at
        # once, instead of waking for `run` and sleeping again until the inputs are decrypted (a wake-up less).
        for name, tensor in self.feeds:
            w = self.workers[name]
            try:
                send_tensor(w.sock, r.req, HOST, tensor, np.asarray(inputs[tensor]))
            except zmq.Again:
                raise RunError(f"{w.where}: accepted nothing for {self.timeout:g} s") from None
        run = pack({"t": "run", "req": r.req, "slow": 1.0})
        for w in self.workers.values():
            slow = self.slowdown.get(w.name, 1.0)
            self._send_packed(w, run if slow == 1.0 else pack({"t": "run", "req": r.req, "slow": slow}))
        return r

    def _send_packed(self, w: _Worker, frame: bytes) -> None:
        try:
            w.sock.send(frame)
        except zmq.Again:
            raise RunError(f"{w.where}: accepted nothing for {self.timeout:g} s") from None

    # -- shutdown ----------------------------------------------------------------------------------------
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
        talking = [w for w in self.workers.values() if w.sock is not None and w.phase not in ("connecting", "ended")]
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
                _reap(w.proc, time.monotonic() + 1.0)
                if w.proc.stdout is not None:
                    w.proc.stdout.close()
            if w.log is not None:
                w.log.close()
        self.ctx.destroy(linger=0)
        self.ctx = None
        if self.ephemeral:
            self.keys, self.ephemeral = None, False

    def _drain_quietly(self, w: _Worker) -> None:
        """While closing: only the final counts matter; late outputs and errors are ignored."""
        while (frames := recv_message(w.sock)) is not None:
            try:
                msg, _ = parse(frames, _FROM_WORKER)
            except BadMessage:
                continue
            if msg["t"] in ("bye", "error"):
                if msg["t"] == "bye":
                    self._on_bye(w, msg, None)
                w.phase = "ended"


LocalCluster = WorkerPool  # the name before workers could be remote


class FailoverCluster:
    """A WorkerPool that survives the loss of a working device (DeviceLost, mid-run or as the run starts) when
    the manifest has a fallback plan without it (`edgec compile --fallbacks`): it ends the run on the other
    workers, starts the fallback's (a remote worker serves the new run, a local one is started afresh), and
    re-runs every request that had not completed, so that outputs still come in request order and none is lost.
    One failover per run (fallback plans have no fallbacks of their own), from whichever plan is in use: the
    main one or one
    --adapt switched to. Without a fallback the DeviceLost error stands.

    `completed` counts the requests whose outputs were yielded and `handed` those handed to a plan, re-runs
    not counted again (the caller may reset both, as run_manifest does after the warm-up); `failovers` lists
    the switches as [{device, at_request, plan}], at_request being `completed` at the time. The fallbacks are
    checked on construction, so a broken one is bad input before any worker starts. Use as a context
    manager, like WorkerPool.

    With an `adapter` (adapt.py: `edgec run --adapt`; the cluster must time requests, `timings`), every
    completed request's measured times go to it, and when it decides on another kept plan the cluster stops
    issuing requests, lets those in flight complete, and runs the next ones on that plan. With `slow`
    ({device: (request, factor)}, emulation only), the device's fragment runs of the requests handed from that
    index on are padded to factor x their emulated time: a device that slows down mid-run."""

    def __init__(self, manifest: Manifest, *, addresses: Mapping[str, str] | None = None,
                 inflight: int | None = None, adapter: Adapter | None = None,
                 slow: Mapping[str, tuple[int, float]] | None = None, **options):
        self.main = manifest
        self.addresses = dict(addresses or {})
        self.inflight_option = inflight
        self.options = options  # the other WorkerPool arguments, the same for every plan
        self.fallbacks = {fb.without: load_fallback(manifest, fb, check_files=False)
                          for fb in manifest.fallbacks if fb.manifest is not None}
        self.adapter = adapter
        self.slow = dict(slow or {})
        self.cluster: WorkerPool | None = None
        self.wake_fd: int | None = None
        self.completed = 0
        self.handed = 0
        self.failovers: list[dict] = []
        self.reports: dict[str, dict] = {}

    def __enter__(self) -> "FailoverCluster":
        cluster = WorkerPool(self.main, addresses=self.addresses, inflight=self.inflight_option, **self.options)
        try:
            self.cluster = self._started(cluster)
        except DeviceLost as lost:  # a worker died as the run started (WorkerPool.__enter__ closed the rest)
            self._keep_report(cluster, lost.device)
            self._switch(lost, 0)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self, manifest: Manifest, addresses: Mapping[str, str]) -> WorkerPool:
        return self._started(WorkerPool(manifest, addresses=addresses, inflight=self.inflight_option, **self.options))

    def _started(self, cluster: WorkerPool) -> WorkerPool:
        cluster = cluster.__enter__()
        if self.wake_fd is not None:
            cluster.watch(self.wake_fd)
        return cluster

    def watch(self, wake_fd: int) -> None:
        """WorkerPool.watch, on the plan in use and every plan switched to."""
        self.wake_fd = wake_fd
        if self.cluster is not None:
            self.cluster.watch(wake_fd)

    # what run_manifest reads of the cluster in use
    @property
    def workers(self) -> dict[str, _Worker]:
        return self.cluster.workers

    @property
    def threads(self) -> int:
        return self.cluster.threads

    @property
    def inflight(self) -> int:
        return self.cluster.inflight

    @property
    def compress(self) -> str:
        return self.cluster.compress

    @property
    def manifest(self) -> Manifest:
        """The plan in use: the main one, or the fallback after a switch."""
        return self.cluster.manifest

    @property
    def samples(self) -> Samples | None:
        return self.cluster.samples

    @property
    def offsets(self) -> dict[str, ClockOffset]:
        return self.cluster.offsets

    def stream(self, requests: Iterable[Mapping[str, np.ndarray]], inflight: int | None = None
               ) -> Iterator[tuple[dict[str, np.ndarray], float, dict[str, float]]]:
        """WorkerPool.stream, switching to the fallback plan when a device is lost and re-running, first and
        in order, the requests it had been given and had not completed."""
        source = ((None, item) for item in requests)  # (index handed at, inputs); None: not handed yet
        retry: list = []
        while True:
            issued: deque = deque()
            switch_to: list[Option] = []
            try:
                for result in self.cluster.stream(self._hand(chain(retry, source), issued, switch_to), inflight):
                    issued.popleft()
                    self.completed += 1
                    if self.adapter is not None:
                        self._observe(switch_to)
                    yield result
            except DeviceLost as lost:
                retry = list(issued)
                self._switch(lost, len(retry))
                continue
            if not switch_to:
                return
            retry = []
            self._adapt(switch_to[0])

    def _hand(self, source: Iterator, issued: deque, switch_to: list) -> Iterator:
        """The inputs of `source` for the plan in use, each noted in `issued` (to re-run after a failover)
        with its index; none once the adapter chose another plan (the rest stay in `source`). Under emulated
        drift (`slow`), the devices slowed from each request's index on are set on the cluster as it goes."""
        while not switch_to:
            entry = next(source, None)
            if entry is None:
                return
            index, inputs = entry
            if inputs is IDLE:  # nothing at hand now: not a request
                yield IDLE
                continue
            if index is None:
                index, self.handed = self.handed, self.handed + 1
            issued.append((index, inputs))
            if self.slow:
                self.cluster.slowdown = {d: f for d, (at, f) in self.slow.items() if index >= at}
            yield inputs

    def _observe(self, switch_to: list) -> None:
        """Give the adapter the request's measured times; note its pick, which ends handing to this plan."""
        timed = self.cluster.last_timed
        if timed is None:
            return
        self.adapter.observe(self.cluster.manifest, *timed)
        chosen = None if switch_to else self.adapter.decide(self.completed)
        if chosen is not None:
            switch_to.append(chosen)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, dict[str, float]]:
        return next(iter(self.stream([inputs], inflight=1)))

    def _switch(self, lost: DeviceLost, pending: int) -> None:
        # One failover per run. Whichever plan is in use (the main one, or one --adapt switched to), the
        # fallback without the lost device runs on devices that are all still there.
        first = not self.failovers
        fallback = self.fallbacks.get(lost.device) if first else None
        if fallback is None:
            raise DeviceLost(lost.device, f"{lost}{self._why_no_fallback(lost.device, first)}") from None
        logger.warning("%s: switching to the fallback plan %s (devices %s) after %d completed request(s); "
                       "re-running the %d not completed", lost, fallback.path, ", ".join(working_devices(fallback)),
                       self.completed, pending)
        self._replace(fallback, lost.device)
        self.failovers.append({"device": lost.device, "at_request": self.completed, "plan": str(fallback.path)})
        if self.adapter is not None:  # the fallback is none of the kept plans the adapter chooses among
            logger.warning("no more adaptation: the fallback plan runs to the end")
            self.adapter = None

    def _adapt(self, option: Option) -> None:
        """Switch to a kept plan: every request handed to the old one has completed."""
        decision = self.adapter.decisions[-1]
        logger.warning("adapting after %d completed request(s): %s; switching to %s (re-costed %.2f ms, the plan "
                       "in use %.2f ms)", self.completed, decision.reason, option.label,
                       decision.recosted_ms[option.label], decision.recosted_ms[decision.current])
        decision.switched_at = self.completed
        self._replace(option.manifest)

    def _replace(self, manifest: Manifest, lost: str | None = None) -> None:
        """End the run of the plan in use and start `manifest`'s. The old workers end their session before the
        new one's opens (a worker serves one at a time), so wait for their goodbye as long as a request may take."""
        old, self.cluster = self.cluster, None
        if old is not None:  # None: lost while the first plan started, already closed
            old.close(grace=old.timeout)
            self._keep_report(old, lost)
        check_fragment_files(manifest)
        check_signatures(manifest)
        addresses = {name: a for name, a in self.addresses.items() if name in manifest.device_names}
        self.cluster = self._open(manifest, addresses)

    def _why_no_fallback(self, device: str, first: bool) -> str:
        if not first:
            return (f" (the run had already switched to the fallback plan without {self.failovers[-1]['device']}, "
                    "which has no fallbacks of its own)")
        if not self.main.fallbacks:
            return " (the build has no fallback plans: compile with --fallbacks to finish on the devices left)"
        entry = self.main.fallback_for(device)
        return f" (no fallback plan without it: {entry.error})" if entry is not None else \
            f" (the build has no fallback plan without {device})"

    def _keep_report(self, cluster: WorkerPool, lost: str | None = None) -> None:
        """Each device's figures from the last run it took part in; a lost device is marked so."""
        report = cluster.device_report()
        if lost is not None:
            report[lost] = {**report.get(lost, {}), "lost": True}
        self.reports.update(report)

    def device_report(self) -> dict[str, dict]:
        return {**self.reports, **(self.cluster.device_report() if self.cluster is not None else {})}

    def close(self) -> None:
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            cluster.close()
            self._keep_report(cluster)


def _samples(manifest: Manifest) -> Samples:
    """The timings store of a manifest, refusing one whose devices' timings would not fit a `done` message."""
    samples = Samples(manifest)
    for device in working_devices(manifest):
        timed = len(samples.runs[device]) + len(samples.clocks[device])
        if timed > MAX_TIMED_STEPS:
            raise InputError(f"{manifest.path}: device {device} has {timed} fragment runs, sends and receives per "
                             f"request, too many to time (at most {MAX_TIMED_STEPS}); run without --report and "
                             "--trace")
    return samples


def _tail(log) -> str:
    try:
        log.seek(0)
        lines = [ln for ln in log.read()[-4000:].decode(errors="replace").splitlines() if ln.strip()]
    except (OSError, AttributeError, ValueError):
        return ""
    return one_line(lines[-1], 300) if lines else ""


def _reap(proc: subprocess.Popen, deadline: float) -> None:
    try:
        proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        return
    except subprocess.TimeoutExpired:
        proc.terminate()
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def steady_throughput(start: float, done_at: list[float]) -> float:
    """Requests per second in steady state: the outputs after the first over the time from the first output
    to the last. The first request's latency (the pipeline filling up) is not a rate and would weigh on a
    short run: 20 requests through a two-stage MobileNetV2 read 9% low by requests / wall time. One request:
    1 / its latency."""
    if len(done_at) >= 2 and done_at[-1] > done_at[0]:
        return (len(done_at) - 1) / (done_at[-1] - done_at[0])
    return len(done_at) / max((done_at[-1] if done_at else time.perf_counter()) - start, 1e-9)


def load_keys(folder: str | os.PathLike | None) -> Keyring | None:
    """The coordinator's keys (DIR/private/coordinator.key_secret and DIR/public), or None."""
    return None if folder is None else Keyring.load(Path(folder), COORDINATOR)
