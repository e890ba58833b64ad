"""The pool's workers: where each working device's worker is (an address, or a local process), how many threads
a local one runs, and the coordinator's state of its connection to each (WorkerLink); a local worker's log and
its reaping."""

from __future__ import annotations

import subprocess
import time
from typing import Iterable, Iterator, Mapping

import zmq

from ..device.zygote import Child
from ..errors import InputError, one_line
from ..machine import available_cores
from ..manifest.schedule import working_devices
from ..manifest.types import Manifest
from ..wire.net import Endpoint, parse_endpoint
from .accuracy import ClockOffset

__all__ = ["WorkerLink", "default_threads", "resolve_endpoints", "log_tail", "reap"]


class WorkerLink:
    """The coordinator's connection to one device's worker."""

    def __init__(self, name: str, endpoint: Endpoint | None):
        self.name, self.endpoint = name, endpoint
        self.local = endpoint is None
        self.proc: subprocess.Popen | Child | None = None  # a local worker's process
        self.log = None
        self.sock: zmq.Socket | None = None
        self.monitor: zmq.Socket | None = None
        self.key: bytes | None = None  # the worker's public key (its CURVE server key)
        self.phase = "connecting"  # -> welcomed -> opened -> loaded -> ready -> ended
        self.handshake_ok = False
        self.hello_sent = False  # a worker told hello may have begun a session with this coordinator
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


def log_tail(log) -> str:
    try:
        log.seek(0)
        lines = [ln for ln in log.read()[-4000:].decode(errors="replace").splitlines() if ln.strip()]
    except (OSError, AttributeError, ValueError):
        return ""
    return one_line(lines[-1], 300) if lines else ""


def reap(proc: subprocess.Popen | Child, deadline: float) -> None:
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
