"""Reaching the workers: a local worker process started for each device without an address, a CURVE-secured
connection to every worker watched by a socket monitor, and the handshake (hello -> welcome, open -> opened,
peers -> ready) that brings each to the run's start. A part of WorkerPool (pool.py)."""

from __future__ import annotations

import logging
import os
import re
import select
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import zmq
from zmq.utils.monitor import parse_monitor_message

from ..errors import InputError, RunError, one_line
from ..machine import edgec_version
from ..manifest.load import manifest_json
from ..manifest.schedule import recv_keys, send_targets
from ..manifest.types import HOST
from ..wire.keys import COORDINATOR, Keyring, ephemeral_keyring
from ..wire.net import Endpoint, outward_host, parse_endpoint
from ..device import zygote
from ..providers import missing_provider, refusal
from ..wire.protocol import PROTOCOL_VERSION, welcome_providers
from ..wire.transport import POLL_MS, BadMessage
from .liveness import HEARTBEAT_MISSES
from .workers import WorkerLink, log_tail

__all__ = ["Connecting", "load_keys"]

logger = logging.getLogger(__name__)

_HANDSHAKE_FAILED = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                     zmq.EVENT_HANDSHAKE_FAILED_AUTH}
_LISTENING = re.compile(r"edgec worker: listening on (tcp://\S+)")


class Connecting:
    """WorkerPool's start-up: start() and the messages of the handshake."""

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
            w.hello_sent = True
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

    def _spawn(self, w: WorkerLink) -> None:
        cmd = ["--listen", "tcp://127.0.0.1:0", "--threads", str(self.device_threads.get(w.name, self.threads)),
               "--once", "--exit-with-parent"]
        in_memory = self.keys is not None and self.keys.folder is None
        if in_memory:  # the worker reads its key pair on stdin: no key file a killed run could leave behind
            cmd += ["--keys-stdin"]
        elif self.keys is not None:
            cmd += ["--keys", str(self.keys.folder), "--name", self.keys.serves_as(w.name)]
        data_host = self._local_data_host(w.name)
        if data_host is not None:
            cmd += ["--data-host", data_host]
        w.log = tempfile.TemporaryFile()
        keys = self.keys.member_json(self.keys.serves_as(w.name)) if in_memory else None
        if zygote.available():  # forked from a process that has imported the worker's modules (zygote.py)
            try:
                w.proc = zygote.spawn(cmd, keys=keys, stderr=w.log, timeout=self.timeout)
            except OSError as exc:
                raise RunError(f"cannot start the local worker for {w.name}: {one_line(exc)}") from None
        else:
            w.proc = self._popen(cmd, keys, w.log)
        logger.debug("started a local worker for %s (pid %d)", w.name, w.proc.pid)

    @staticmethod
    def _popen(cmd: list[str], keys: bytes | None, log) -> subprocess.Popen:
        """A local worker as a process of its own, where no zygote can fork one."""
        # A session of its own: Ctrl-C in a terminal (SIGINT to the foreground group) reaches the coordinator
        # alone, which then ends the run on its workers (edgec serve answers what it accepted first); the
        # worker still dies with its parent (--parent).
        argv = [sys.executable, "-m", "edgec.runtime.device.worker", *cmd, "--parent", str(os.getpid())]
        stdin = subprocess.DEVNULL if keys is None else subprocess.PIPE
        proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        if keys is not None:
            try:  # one line, far below a pipe's buffer: never blocks
                proc.stdin.write(keys)
                proc.stdin.close()
            except OSError:  # the worker already exited: _await_listening reports why
                pass
        return proc

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

    def _await_listening(self, w: WorkerLink, deadline: float) -> Endpoint:
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
                tail = log_tail(w.log)
                cls = InputError if code == 2 else RunError
                raise cls(f"the local worker for {w.name} exited with code {code}{': ' + tail if tail else ''}")

    def _connect(self, w: WorkerLink) -> None:
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

    def _server_key(self, w: WorkerLink) -> bytes:
        """A remote worker serves with its device's key; a local one with the key it was started with."""
        return self.keys.key_of(w.name if not w.local else self.keys.serves_as(w.name))

    def _send_first(self, w: WorkerLink, msg: dict, deadline: float) -> None:
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

    def _on_monitor(self, w: WorkerLink) -> None:
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

    def _on_welcome(self, w: WorkerLink, msg: dict, payload) -> None:
        if w.phase != "connecting":
            return self.drops.drop(f"duplicate welcome from {w.name}")
        if msg["protocol"] != PROTOCOL_VERSION:
            raise InputError(f"{w.where}: the worker speaks protocol {msg['protocol']}, this coordinator "
                             f"{PROTOCOL_VERSION}: install the same edgec version on both")
        if self.keys is not None and (msg["key"] or "").encode() != w.key:
            raise InputError(f"{w.where}: the worker's key is not {w.name}'s")
        try:
            available = welcome_providers(msg)
        except BadMessage as exc:
            raise InputError(f"{w.where}: the worker's welcome is malformed ({exc})") from None
        missing = missing_provider(self.manifest.device(w.name).providers, available)
        if missing is not None:
            raise InputError(refusal(w.where, missing, available))
        w.phase = "welcomed"
        logger.debug("%s: edgec %s, pid %d, %d thread(s), %d core(s), providers %s", w.where,
                     one_line(msg["edgec"], 40), msg["pid"], msg["threads"], msg["cores"], ", ".join(available))

    def _on_refused(self, w: WorkerLink, msg: dict, payload) -> None:
        raise InputError(f"{w.where}: refused: {one_line(msg['reason'], 300)}")

    def _on_loaded(self, w: WorkerLink, msg: dict, payload) -> None:
        if w.phase == "opened":
            w.phase = "loaded"

    def _on_ready(self, w: WorkerLink, msg: dict, payload) -> None:
        if w.phase == "loaded":
            w.phase = "ready"


def load_keys(folder: str | os.PathLike | None) -> Keyring | None:
    """The coordinator's keys (DIR/private/coordinator.key_secret and DIR/public), or None."""
    return None if folder is None else Keyring.load(Path(folder), COORDINATOR)
