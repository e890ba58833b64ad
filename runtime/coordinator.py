"""Embedded coordinator: one local worker process per device; feeds inputs, collects outputs, times requests."""

from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import zmq

from .errors import InputError, RunError, one_line
from .manifest import HOST, Manifest
from .schedule import host_collects, host_feeds
from .transport import POLL_MS, bind_local, decode_tensor, pack, send_tensor, unpack

__all__ = ["RunResult", "LocalCluster", "run_manifest", "default_threads", "available_cores"]

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    latencies_ms: list[float]
    device_run_ms: dict[str, list[float]] = field(default_factory=dict)  # per device, one entry per request
    threads: int = 0  # onnxruntime intra-op threads per worker (0 = onnxruntime's default)

    @property
    def latency_ms(self) -> float:
        return statistics.median(self.latencies_ms)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads(manifest: Manifest) -> int:
    """Intra-op threads per worker when every device runs on this machine: the cores shared among the
    devices that run fragments; a single such device gets onnxruntime's default (0), like plain onnxruntime."""
    busy = sum(1 for d in manifest.device_names if manifest.device_fragments(d))
    return 0 if busy <= 1 else max(1, available_cores() // busy)


class LocalCluster:
    """Worker processes for every device of a manifest, on this machine; use as a context manager.

    Requests are sequential (`infer`). Workers die with the thread that started them (Linux
    PR_SET_PDEATHSIG), so start and use a cluster from one long-lived thread.
    """

    def __init__(self, manifest: Manifest, *, threads: int | None = None, emulate: bool = False, timeout: float = 60.0):
        self.manifest = manifest
        self.threads = default_threads(manifest) if threads is None else threads
        self.emulate = emulate
        self.timeout = timeout
        self.names = manifest.device_names
        self.feeds = host_feeds(manifest)
        self.collects = host_collects(manifest)
        self.specs = {o.name: o for o in manifest.outputs}
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, object] = {}
        self.ctx: zmq.Context | None = None
        self.push: dict[str, zmq.Socket] = {}
        self.req = -1
        self.addresses: dict[str, str] = {}
        self.ready: set[str] = set()
        self.outputs: dict[str, np.ndarray] = {}
        self.done: dict[str, float] = {}
        self.t_outputs: float | None = None

    def __enter__(self) -> "LocalCluster":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- start-up ----------------------------------------------------------------------------------
    def start(self) -> None:
        remote = [d.name for d in self.manifest.devices if d.address]
        if remote:
            logger.warning("device address(es) ignored for %s: the embedded coordinator runs every device locally", remote)
        control_addr, data_addr = self._bind()
        for name in self.names:
            self._spawn(name, control_addr)
        deadline = time.monotonic() + self.timeout
        self._pump(deadline, lambda: len(self.addresses) == len(self.names), "during start-up")
        addrs = {**self.addresses, HOST: data_addr}
        for name in self.names:
            self._tell(name, {"t": "peers", "addrs": addrs})
        self._pump(deadline, lambda: len(self.ready) == len(self.names), "while loading fragments")
        for name, _ in self.feeds:
            if name not in self.push:
                self.push[name] = self.ctx.socket(zmq.PUSH)
                self.push[name].connect(self.addresses[name])

    def _bind(self) -> tuple[str, str]:
        """The control ROUTER (workers connect with their device name as identity) and the output PULL."""
        self.ctx = zmq.Context()
        self.control = self.ctx.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.ROUTER_MANDATORY, 1)  # fail loudly instead of dropping messages
        self.data = self.ctx.socket(zmq.PULL)
        self.poller = zmq.Poller()
        self.poller.register(self.control, zmq.POLLIN)
        self.poller.register(self.data, zmq.POLLIN)
        return bind_local(self.control), bind_local(self.data)

    def _spawn(self, name: str, control_addr: str) -> None:
        cmd = [sys.executable, "-m", "edgec.runtime.worker", "--manifest", str(self.manifest.path), "--device", name,
               "--control", control_addr, "--threads", str(self.threads)] + (["--emulate"] if self.emulate else [])
        log = self.logs[name] = tempfile.TemporaryFile()
        self.procs[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        logger.debug("started worker %s (pid %d)", name, self.procs[name].pid)

    # -- requests ----------------------------------------------------------------------------------
    def infer(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, dict[str, float]]:
        """One request: (outputs, latency in ms until the last output arrived, fragment run ms per device)."""
        missing = sorted({name for _, name in self.feeds} - set(inputs))
        if missing:
            raise InputError(f"{self.manifest.path}: no value for model input(s) {missing}")
        self.req += 1
        self.outputs, self.done, self.t_outputs = {}, {}, None
        start = time.perf_counter()
        run = pack({"t": "run", "req": self.req})
        for name in self.names:
            self._tell(name, run, packed=True)
        for name, tensor in self.feeds:
            send_tensor(self.push[name], self.req, HOST, tensor, inputs[tensor])
        self._pump(time.monotonic() + self.timeout,
                   lambda: len(self.outputs) == len(self.collects) and len(self.done) == len(self.names),
                   f"in request {self.req}")
        latency = ((self.t_outputs or time.perf_counter()) - start) * 1000.0
        return dict(self.outputs), latency, dict(self.done)

    def _tell(self, name: str, msg, packed: bool = False) -> None:
        try:
            self.control.send_multipart([name.encode(), msg if packed else pack(msg)])
        except zmq.ZMQError as exc:
            raise RunError(f"cannot reach worker {name}: {exc}") from None

    def _pump(self, deadline: float, finished: Callable[[], bool], what: str) -> None:
        """Handle control and data messages until `finished()`; fail on a worker error, death or timeout."""
        while not finished():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RunError(f"timed out after {self.timeout:g} s {what} (no answer from: {', '.join(self._waiting())})")
            events = dict(self.poller.poll(min(remaining * 1000.0, POLL_MS)))
            if self.control in events:
                self._drain(self.control, self._on_control)
            if self.data in events:
                self._drain(self.data, self._on_output)
            self._check_alive(what)

    def _waiting(self) -> list[str]:
        if len(self.addresses) < len(self.names):
            return [n for n in self.names if n not in self.addresses]
        if len(self.ready) < len(self.names):
            return [n for n in self.names if n not in self.ready]
        late = [f"output {o}" for o in self.collects if o not in self.outputs]
        return late + [n for n in self.names if n not in self.done]

    @staticmethod
    def _drain(sock: zmq.Socket, handle: Callable[[list], None]) -> None:
        while True:
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            handle(frames)

    def _on_control(self, frames: list) -> None:
        name, msg = frames[0].bytes.decode(), unpack(frames[1].buffer)
        kind = msg.get("t")
        if kind == "hello":
            self.addresses[name] = msg["data"]
        elif kind == "ready":
            self.ready.add(name)
        elif kind == "done" and msg.get("req") == self.req:
            self.done[name] = float(msg["run_ms"])
        elif kind == "error":
            cls = InputError if msg.get("kind") == "input" else RunError
            raise cls(msg.get("message") or f"worker {name} failed")

    def _on_output(self, frames: list) -> None:
        req, src, name, array = decode_tensor(frames)
        if req != self.req:
            logger.debug("dropping %s from %s for old request %d", name, src, req)
            return
        if self.collects.get(name) != src:
            raise RunError(f"unexpected output {name!r} from {src}")
        spec = self.specs[name]
        if array.shape != spec.shape or array.dtype.name != spec.dtype:
            raise RunError(f"output {name!r} from {src} has shape {array.shape} {array.dtype.name}, "
                           f"the manifest says {spec.shape} {spec.dtype}")
        self.outputs[name] = array
        if len(self.outputs) == len(self.collects):
            self.t_outputs = time.perf_counter()

    def _check_alive(self, what: str) -> None:
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                raise RunError(f"worker {name} exited with code {code} {what}{self._log_tail(name)}")

    def _log_tail(self, name: str) -> str:
        log = self.logs.get(name)
        try:
            log.seek(0)
            lines = [ln for ln in log.read()[-4000:].decode(errors="replace").splitlines() if ln.strip()]
        except (OSError, AttributeError, ValueError):
            return ""
        return f": {one_line(lines[-1], 300)}" if lines else ""

    # -- shutdown ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every worker (politely, then terminate, then kill) and release sockets; idempotent."""
        stop = pack({"t": "stop"})
        for name, proc in self.procs.items():
            if proc.poll() is None:  # unknown identities just raise (ROUTER_MANDATORY); ignored
                try:
                    self.control.send_multipart([name.encode(), stop], flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
        deadline = time.monotonic() + 1.0  # idle workers answer in milliseconds; busy ones get terminated
        for proc in self.procs.values():
            _reap(proc, deadline)
        self.procs.clear()
        for log in self.logs.values():
            log.close()
        self.logs.clear()
        if self.ctx is not None:
            self.ctx.destroy(linger=0)
            self.ctx = None


def _reap(proc: subprocess.Popen, deadline: float) -> None:
    try:
        proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        return
    except subprocess.TimeoutExpired:
        proc.terminate()
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_manifest(manifest: Manifest, inputs: Mapping[str, np.ndarray], *, repeat: int = 1, threads: int | None = None,
                 emulate: bool = False, timeout: float = 60.0, warmup: bool = True,
                 progress: Callable[[str], None] | None = None) -> RunResult:
    """Start the workers, run one warm-up request and then `repeat` timed requests, stop the workers."""
    say = progress or (lambda _msg: None)
    say(f"starting {len(manifest.devices)} worker(s)")
    with LocalCluster(manifest, threads=threads, emulate=emulate, timeout=timeout) as cluster:
        if warmup:
            say("warm-up request")
            cluster.infer(inputs)
        result = RunResult(outputs={}, latencies_ms=[], device_run_ms={n: [] for n in manifest.device_names},
                           threads=cluster.threads)
        for i in range(repeat):
            result.outputs, latency, run_ms = cluster.infer(inputs)
            result.latencies_ms.append(latency)
            for name, ms in run_ms.items():
                result.device_run_ms[name].append(ms)
            say(f"request {i + 1}/{repeat}: {latency:.2f} ms")
    return result
