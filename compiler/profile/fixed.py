"""The runtime's own costs on this machine (the profile's `runtime:`), measured through the runtime's code.

- message_ms, message_ms_per_mb: a tensor message between two CURVE sockets over TCP on this host, as the
  workers exchange them (transport.send_tensor, protocol.parse, transport.decode_tensor, ZeroMQ's CURVE
  under the runtime's Keyring): one side sends, the other decodes it and sends it back, and a hand-off is
  half the round trip. Timed for a 64-byte tensor (the fixed part) and a 1 MiB one (quick: 256 KiB); the
  per-MB figure is the difference per 10^6 bytes. Both ends run here, so the figure is both ends' work.
- request_ms: one request of a one-fragment manifest (a 64-float Relu) run by the runtime's coordinator
  with a local worker at 1 thread: the request's latency less the fragment's run, i.e. the model input in
  from the coordinator, the output out to it, and the request's control messages.

Each is timed like every other figure (timing.py): rounds of samples until the last `window` agree,
the fastest stable round's median.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import zmq

from edgec.runtime.keys import ephemeral_keyring
from edgec.runtime.manifest import file_sha256, load_manifest
from edgec.runtime.protocol import parse
from edgec.runtime.transport import decode_tensor, send_tensor

from .timing import Figure, Policy, combine, measure_stable, model, sig, vi

__all__ = ["measure_runtime_costs", "SMALL_BYTES"]

SMALL_BYTES = 64
_LARGE_BYTES = {False: 1 << 20, True: 1 << 18}
_ECHO = "echo"
_TIMEOUT_MS = 10_000  # a hand-off on this host that takes longer has failed


_MAX_SECONDS = 0.6  # per timing: three timings and a worker's start stay within about two seconds


def measure_runtime_costs(policy: Policy, quick: bool, say: Callable[[str], None]) -> tuple[dict, dict]:
    """({message_ms, message_ms_per_mb, request_ms}, {timing name: Figure}) on this machine."""
    policy = replace(policy, max_seconds=min(policy.max_seconds, _MAX_SECONDS))
    say("  runtime costs: message hand-off (CURVE, ZeroMQ, msgpack) and one request through the coordinator")
    large = _LARGE_BYTES[quick]
    figures = _message_figures(policy, large)
    figures["request"] = _request_figure(policy)
    small_ms = figures["message_small"].median_s * 1e3
    per_mb = max(0.0, (figures["message_large"].median_s * 1e3 - small_ms) / (large - SMALL_BYTES) * 1e6)
    costs = {"message_ms": sig(small_ms), "message_ms_per_mb": sig(per_mb),
             "request_ms": sig(figures["request"].median_s * 1e3)}
    return costs, figures


def _rounds(sample: Callable[[], float], policy: Policy) -> Figure:
    return combine([measure_stable(sample, policy, seconds=policy.round_seconds) for _ in range(policy.rounds)],
                   policy.max_spread)


class _Pair:
    """A DEALER (client) and a ROUTER (server, as a worker's data socket) joined by CURVE over loopback TCP,
    the router's side echoing every tensor back from a thread."""

    def __init__(self):
        self.keys = ephemeral_keyring([_ECHO])
        self.ctx = zmq.Context()
        self.auth = self.keys.authenticator(self.ctx)
        self.server = self.ctx.socket(zmq.ROUTER)
        self.keys.serve(self.server)
        port = self.server.bind_to_random_port("tcp://127.0.0.1")
        self.client = self.ctx.socket(zmq.DEALER)
        self.keys.connect_to(self.client, self.keys.public)
        for s in (self.server, self.client):
            s.linger = 0
            s.rcvtimeo = s.sndtimeo = _TIMEOUT_MS
        self.client.connect(f"tcp://127.0.0.1:{port}")
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._echo, name="profile-echo", daemon=True)
        self.thread.start()

    def _echo(self) -> None:
        poller = zmq.Poller()
        poller.register(self.server, zmq.POLLIN)
        try:
            while not self.stop.is_set():
                if not poller.poll(50):
                    continue
                peer, *frames = self.server.recv_multipart(copy=False)
                head, payload = parse(frames, {"tensor"})
                msg = decode_tensor(head, payload)
                send_tensor(self.server, msg.req, _ECHO, msg.name, msg.array, prefix=(peer.bytes,))
        except BaseException as exc:  # surfaced by round_trip
            self.error = exc

    def round_trip(self, array: np.ndarray) -> None:
        send_tensor(self.client, 0, "profile", "x", array)
        try:
            head, payload = parse(self.client.recv_multipart(copy=False), {"tensor"})
        except zmq.Again:
            raise RuntimeError(f"no echo within {_TIMEOUT_MS} ms: {self.error or 'the echo thread is stuck'}") from None
        if decode_tensor(head, payload).array.nbytes != array.nbytes:
            raise RuntimeError("the echo returned another tensor")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2.0)
        self.client.close()
        self.server.close()
        self.auth.stop()
        self.ctx.term()
        shutil.rmtree(self.keys.folder, ignore_errors=True)


def _sampler(run: Callable[[], float], policy: Policy, warmup: int) -> Callable[[], float]:
    """Seconds of one `run` (which returns its own seconds), averaged over enough runs to last
    policy.min_sample_s, after `warmup` runs."""
    for _ in range(warmup):
        run()
    one = max(run(), 1e-7)
    reps = max(1, min(1000, math.ceil(policy.min_sample_s / one)))
    return lambda: sum(run() for _ in range(reps)) / reps


def _message_figures(policy: Policy, large: int) -> dict[str, Figure]:
    pair = _Pair()
    try:
        out = {}
        for name, nbytes in (("message_small", SMALL_BYTES), ("message_large", large)):
            array = np.ones(nbytes // 4, dtype=np.float32)

            def hand_off(array=array) -> float:
                t = time.perf_counter()
                pair.round_trip(array)
                return (time.perf_counter() - t) / 2.0

            out[name] = _rounds(_sampler(hand_off, policy, warmup=max(policy.warmup, 5)), policy)
        return out
    finally:
        pair.close()


def _tiny_build(folder: Path) -> Path:
    """A one-device, one-fragment build (64-float Relu) in `folder`; returns its manifest.json."""
    from onnx import helper

    frag = folder / "f0.onnx"
    frag.write_bytes(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", (1, 64))], [vi("y", (1, 64))]))
    tensor = {"shape": [1, 64], "dtype": "float32"}
    doc = {
        "format": "edgec.manifest", "version": 1,
        "model": {"path": "f0.onnx", "sha256": file_sha256(frag)},
        "inputs": [{"name": "x", **tensor}], "outputs": [{"name": "y", **tensor, "device": "d"}],
        "devices": [{"name": "d", "profile": "this host", "memory_mb": 1024, "address": None, "threads": 1}],
        "network": {"bandwidth_mbps": None, "latency_ms": None, "medium": "switched", "links": []},
        "fragments": [{"id": "f0", "device": "d", "file": "f0.onnx", "sha256": file_sha256(frag), "inputs": ["x"],
                       "outputs": ["y"], "predicted_ms": 0.0}],
        "transfers": [],
        "steps": {"d": [{"op": "recv", "tensor": "x", "from": "@host"}, {"op": "run", "fragment": "f0"},
                        {"op": "send", "tensor": "y", "to": "@host"}]},
    }
    path = folder / "manifest.json"
    path.write_text(json.dumps(doc))
    return path


def _request_figure(policy: Policy) -> Figure:
    from edgec.runtime.coordinator import Cluster

    folder = Path(tempfile.mkdtemp(prefix="edgec-profile-request-"))
    try:
        manifest = load_manifest(_tiny_build(folder))
        feeds = {"x": np.ones((1, 64), dtype=np.float32)}
        with Cluster(manifest, threads=1, timeout=30.0) as cluster:

            def request() -> float:
                _, latency_ms, run_ms = cluster.infer(feeds)
                return max(0.0, latency_ms - sum(run_ms.values())) / 1e3

            return _rounds(_sampler(request, policy, warmup=max(policy.warmup, 5)), policy)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
