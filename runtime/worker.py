"""One device's worker process: `python -m edgec.runtime.worker --manifest M --device NAME --control ADDR`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

import numpy as np
import zmq

from .emulate import DelayedLinks, pad_run
from .errors import EdgecRuntimeError, InputError, RunError, one_line
from .executor import Executor
from .manifest import HOST, Concat, Free, Manifest, Recv, Run, Send, Slice, load_manifest, region_ranges
from .transport import POLL_MS, Inbox, bind_local, pack, send_tensor, unpack

__all__ = ["Worker", "Stop", "main"]

logger = logging.getLogger(__name__)


class Stop(Exception):
    """The coordinator said stop, or it went away."""


class Worker:
    """Executes one device's steps once per request id, as the coordinator asks.

    Control protocol (msgpack over DEALER -> coordinator's ROUTER, identity = device name):
      worker -> {"t": "hello", "device", "data": addr, "pid"}; <- {"t": "peers", "addrs": {name: addr}};
      worker -> {"t": "ready"}; then per request <- {"t": "run", "req": n} -> {"t": "done", "req", "run_ms"};
      any failure -> {"t": "error", "kind": "input" | "run", "req", "message"}; <- {"t": "stop"} ends it.
    """

    def __init__(self, manifest: Manifest, device: str, ctx: zmq.Context, control: zmq.Socket,
                 threads: int = 0, emulate: bool = False):
        if device not in manifest.device_names:
            raise InputError(f"{manifest.path}: unknown device {device!r}")
        self.manifest, self.device, self.ctx, self.control = manifest, device, ctx, control
        self.steps = manifest.steps.get(device, ())
        self.executor = Executor(manifest, device, threads)
        self.data = ctx.socket(zmq.PULL)
        self.address = bind_local(self.data)
        self.inbox = Inbox(self.data, control)
        self.peers: dict[str, zmq.Socket] = {}
        self.emulate = emulate
        self.links = DelayedLinks(manifest, device) if emulate else None
        self.parent = os.getppid()
        self.req = -1

    # -- control channel ---------------------------------------------------------------------------
    def tell(self, **msg) -> None:
        self.control.send(pack(msg))

    def on_idle(self) -> None:
        # The coordinator normally stops us; if it died (SIGKILL) we are re-parented: leave, no orphans.
        if os.getppid() != self.parent:
            raise Stop()

    def next_control(self) -> dict:
        while not self.control.poll(POLL_MS):
            self.on_idle()
        msg = unpack(self.control.recv())
        if msg.get("t") == "stop":
            raise Stop()
        return msg

    def on_control(self) -> None:
        # A control message during a recv wait can only be "stop" (requests are sequential).
        msg = self.next_control()
        raise RunError(f"device {self.device}: unexpected control message {msg.get('t')!r} during request {self.req}")

    # -- life cycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self.tell(t="hello", device=self.device, data=self.address, pid=os.getpid())
        self.executor.load()
        msg = self.next_control()
        if msg.get("t") != "peers":
            raise RunError(f"device {self.device}: expected the peer address map, got {msg.get('t')!r}")
        for step in self.steps:
            if isinstance(step, Send) and step.to not in self.peers:
                sock = self.ctx.socket(zmq.PUSH)
                sock.connect(msg["addrs"][step.to])
                self.peers[step.to] = sock
        self.tell(t="ready")

    def serve(self) -> None:
        while True:
            msg = self.next_control()
            if msg.get("t") != "run":
                raise RunError(f"device {self.device}: unexpected control message {msg.get('t')!r}")
            self.req = msg["req"]
            run_s = self.execute(self.req)
            self.tell(t="done", req=self.req, run_ms=run_s * 1000.0)

    def close(self) -> None:
        if self.links is not None:
            self.links.close()
        for sock in [self.data, *self.peers.values()]:
            sock.close(linger=200)

    # -- steps -------------------------------------------------------------------------------------
    def execute(self, req: int) -> float:
        """Run this device's steps for one request; returns the total (emulated) fragment run time."""
        store: dict[str, np.ndarray] = {}
        run_s = 0.0
        for step in self.steps:
            if isinstance(step, Run):
                elapsed = self.executor.run(step.fragment, store)
                if self.emulate:
                    elapsed = pad_run(self.executor.fragments[step.fragment], elapsed)
                run_s += elapsed
            elif isinstance(step, Recv):
                store[step.tensor] = self.inbox.wait((req, step.src, step.tensor), self.on_control, self.on_idle)
            elif isinstance(step, Send):
                self.send(req, step, store[step.tensor])
            elif isinstance(step, Slice):
                store[step.as_name] = self.cut(store[step.tensor], step.axis, step.start, step.stop, step.tensor)
            elif isinstance(step, Concat):
                store[step.as_name] = self.concat(step, store)
            elif isinstance(step, Free):
                for name in step.tensors:
                    del store[name]
        if self.links is not None:
            self.links.raise_if_failed()
        return run_s

    def send(self, req: int, step: Send, array: np.ndarray) -> None:
        for r in region_ranges(step.region):  # a box: one view per axis, still no copy
            array = self.cut(array, r.axis, r.start, r.stop, step.tensor)
        sock = self.peers[step.to]
        if self.links is None or step.to == HOST:
            send_tensor(sock, req, self.device, step.name, array)
        else:
            self.links.submit(step.to, array.nbytes, lambda: send_tensor(sock, req, self.device, step.name, array))

    def cut(self, array: np.ndarray, axis: int, start: int, stop: int, name: str) -> np.ndarray:
        """array[start:stop] along axis, as a view (send copies only if the view is not contiguous)."""
        if not -array.ndim <= axis < array.ndim or stop > array.shape[axis]:
            raise RunError(f"device {self.device}: slice [{start}:{stop}] along axis {axis} is outside "
                           f"tensor {name!r} of shape {array.shape}")
        index = [slice(None)] * array.ndim
        index[axis] = slice(start, stop)
        return array[tuple(index)]

    def concat(self, step: Concat, store: dict[str, np.ndarray]) -> np.ndarray:
        try:
            return np.concatenate([store[p] for p in step.parts], axis=step.axis)
        except ValueError as exc:  # numpy's AxisError is a ValueError too
            raise RunError(f"device {self.device}: concat of {list(step.parts)} into {step.as_name!r} failed: {exc}") from None


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m edgec.runtime.worker", description=__doc__)
    p.add_argument("--manifest", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--control", required=True, help="the coordinator's control address (zmq ROUTER)")
    p.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0 = its default)")
    p.add_argument("--emulate", action="store_true")
    return p.parse_args(argv)


def _report(control: zmq.Socket, device: str, exc: BaseException, req: int) -> None:
    kind = "input" if isinstance(exc, InputError) else "run"
    message = str(exc) if isinstance(exc, EdgecRuntimeError) else f"device {device}: {type(exc).__name__}: {one_line(exc)}"
    control.send(pack({"t": "error", "kind": kind, "req": req, "message": message}))


def _wait_for_stop(control: zmq.Socket, parent: int, limit_s: float = 30.0) -> None:
    """After reporting an error, stay until the coordinator says stop (so the report is delivered)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and os.getppid() == parent:
        if control.poll(POLL_MS) and unpack(control.recv()).get("t") == "stop":
            return


def _die_with_parent() -> None:
    """Linux: get SIGTERM when the coordinator dies, even mid-run (the idle loops also check getppid)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the getppid checks remain
        pass


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    # Ctrl-C reaches the whole process group; the coordinator decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    logging.basicConfig(level=logging.WARNING, format=f"worker {args.device}: %(levelname)s %(message)s")
    ctx = zmq.Context()
    control = ctx.socket(zmq.DEALER)
    control.setsockopt(zmq.IDENTITY, args.device.encode())
    control.connect(args.control)
    parent, worker, code = os.getppid(), None, 0
    try:
        worker = Worker(load_manifest(args.manifest, check_files=False), args.device, ctx, control,
                        threads=args.threads, emulate=args.emulate)
        worker.start()
        worker.serve()
    except Stop:
        pass
    except Exception as exc:  # report everything: the coordinator must never wait on a silent death
        if not isinstance(exc, EdgecRuntimeError):
            logger.exception("unexpected failure")
        _report(control, args.device, exc, worker.req if worker else -1)
        _wait_for_stop(control, parent)
        code = 1
    finally:
        if worker is not None:
            worker.close()
        control.close(linger=500)
        ctx.term()
    return code


if __name__ == "__main__":
    sys.exit(main())
