"""`edgec.Cluster`: a session over a build's workers that answers requests until closed.

One I/O thread owns the workers (their ZeroMQ sockets are not thread-safe, and local workers die with the
thread that started them): it streams the requests of a bounded queue through the coordinator's
FailoverPool, up to `inflight` in the devices at once, and resolves each request's Future as its
outputs arrive, in order. Any thread may `submit`; a full queue raises QueueFull at once rather than grow.

    >>> import edgec, numpy as np
    >>> x = np.zeros((1, 3, 32, 32), np.float32)
    >>> with edgec.Cluster("build/tinychain") as cluster:                        # doctest: +SKIP
    ...     outputs = cluster.infer({"input": x})                                # {"logits": array}
    ...     futures = [cluster.submit({"input": x}) for _ in range(8)]          # pipelined
    ...     results = [f.result() for f in futures]
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np

from ..coordinator.adapt import THRESHOLD, kept_plans
from ..wire.compress import parse_mode
from ..coordinator.liveness import HEARTBEAT_MS
from ..coordinator.window import IDLE
from ..coordinator.failover import FailoverPool
from ..coordinator.connect import load_keys
from ..errors import InputError, RunError
from ..coordinator.inputs import check_inputs, check_memory
from ..manifest.types import Manifest
from ..manifest.load import load_manifest
from ..device.session import MAX_INFLIGHT
from ..manifest.schedule import pipeline_depth

__all__ = ["Cluster", "QueueFull", "SessionClosed", "QUEUE_PER_SLOT", "MIN_QUEUE"]

logger = logging.getLogger(__name__)

# The queue behind the devices holds this many requests per request in flight, and at least MIN_QUEUE: enough to
# keep the pipeline fed across the clients' round trips (16 closed-loop clients on a 3-deep pipeline met 429s
# with 12), little enough that a queued request waits some requests' time, not minutes.
QUEUE_PER_SLOT, MIN_QUEUE = 4, 64
_JOIN_S = 0.2  # waits in slices: a signal handler's exception must reach the main thread


class QueueFull(RunError):
    """submit() on a full queue: the request was not accepted (retry later, or raise `queue`)."""


class SessionClosed(RunError):
    """The session is closed, closing, or lost a device with no fallback: it accepts no request."""


class Cluster:
    """A session serving a compiled build (its folder or manifest.json); use as a context manager.

    Starts the local workers (or reaches `addresses`, {device: "tcp://HOST:PORT"}, with the keys folder
    `keys`) and loads their fragments once; then `infer(inputs)` answers one request and `submit(inputs)`
    queues one and returns a concurrent.futures.Future of its outputs ({output name: array}, in the model's
    dtypes and shapes). Up to `inflight` requests (default: the plan's pipeline depth) are in the devices at
    once and up to `queue` (default QUEUE_PER_SLOT x inflight, at least MIN_QUEUE) wait behind them. A bad input raises
    InputError from submit/infer, for that request only. With `adapt`, the session switches between the
    plans the build kept as the measured figures drift (`edgec run --adapt`); a device lost mid-session is
    replaced by the build's fallback plan without it (`edgec compile --fallbacks`), re-running what it had
    not answered; with no fallback, the requests accepted fail with the error naming the device and `ready`
    turns False. `close()` answers every accepted request (or fails those queued, `drain=False`) and stops
    the workers the session started. Thread-safe.
    """

    def __init__(self, build: str | os.PathLike, *, addresses: Mapping[str, str] | None = None,
                 keys: str | os.PathLike | None = None, inflight: int | None = None, compress: str = "none",
                 adapt: bool = False, timeout: float = 60.0, threads: int | None = None, queue: int | None = None,
                 heartbeat_ms: int = HEARTBEAT_MS, adapt_threshold: float = THRESHOLD, adapt_for: str | None = None):
        path = Path(build)
        manifest = load_manifest(path / "manifest.json" if path.is_dir() else path)
        _check(inflight, timeout, threads, queue)
        check_memory(manifest)
        adapter = kept_plans(manifest, adapt_threshold, adapt_for) if adapt else None
        self._open(manifest, queue, dict(threads=threads, timeout=timeout, addresses=addresses, keys=load_keys(keys),
                                         inflight=inflight, compress=parse_mode(compress), heartbeat_ms=heartbeat_ms,
                                         timings=adapter is not None, adapter=adapter))

    @classmethod
    def open(cls, manifest: Manifest, *, queue: int | None = None, **pool_options) -> "Cluster":
        """A session on a loaded, checked manifest, with FailoverPool's options as they are (what
        `edgec run` uses: emulation, timings, traces, a given adapter)."""
        self = cls.__new__(cls)
        self._open(manifest, queue, pool_options)
        return self

    def _open(self, manifest: Manifest, queue_size: int | None, pool_options: dict) -> None:
        self.manifest = manifest
        inflight = pool_options.get("inflight") or pipeline_depth(manifest)
        self.queue_size = queue_size or max(MIN_QUEUE, QUEUE_PER_SLOT * inflight)
        self._queue: queue.Queue = queue.Queue(self.queue_size)  # (inputs, Future)
        self._calls: queue.Queue = queue.Queue()  # (fn, Future): run on the I/O thread between requests
        self._handed: deque[Future] = deque()  # handed to the devices, answered in this order
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # notified as the I/O thread takes a request off the queue
        self._accepting, self._closing, self._drain = True, False, True
        self._error: BaseException | None = None
        self._ready = False
        # Set by the I/O thread before it looks for a request and cleared once it has one: a submit wakes it only
        # then (a byte down the pipe and a turn of its loop per request were spent while its window was full).
        self._wanted = True
        self._listeners: list[Callable[[str, dict], None]] = []
        self.pool: FailoverPool | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        started = threading.Event()
        self._thread = threading.Thread(target=self._io, args=(pool_options, started), name="edgec-session",
                                        daemon=True)
        self._thread.start()
        while not started.wait(_JOIN_S):
            pass
        if self._error is not None:
            self._join()
            raise self._error

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(drain=exc_type is None)

    # -- the front: any thread ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Started, not closing, and no device lost without a fallback."""
        return self._ready and self._accepting and self._error is None

    @property
    def inflight(self) -> int:
        """Requests kept in the devices at once (the plan in use's window)."""
        pool = self.pool
        return pool.inflight if pool is not None and pool.cluster is not None else 0

    def status(self) -> dict:
        """What the session holds now: {ready, queued, in_flight}."""
        return {"ready": self.ready, "queued": self._queue.qsize(), "in_flight": len(self._handed)}

    def listen(self, listener: Callable[[str, dict], None]) -> None:
        """Call `listener(event, figures)` on the I/O thread: "done" {latency_ms, run_ms} per request answered,
        "failover" {device, plan}, "adaptation" {plan}; it must be quick and not raise."""
        self._listeners.append(listener)

    def submit(self, inputs: Mapping[str, np.ndarray], *, block: bool = False) -> Future:
        """Queue one request; a Future of its outputs. InputError for a bad input, QueueFull on a full queue
        (with `block`, wait for room instead), SessionClosed once closing or failed."""
        given = _arrays(inputs)
        check_inputs(self.manifest, given, {}, origin="inputs")
        future: Future = Future()
        with self._room:  # under the lock close() takes: nothing is queued once the session stops accepting
            while True:
                self._check_open()
                try:
                    self._queue.put_nowait((given, future))
                    break
                except queue.Full:
                    if not block:
                        raise QueueFull(f"the queue is full ({self.queue_size} request(s) waiting, "
                                        f"{len(self._handed)} in the devices): retry later") from None
                self._room.wait(_JOIN_S)
        if self._wanted:  # read after the put: an I/O thread that found the queue empty has set it before looking
            self._wake()
        return future

    def infer(self, inputs: Mapping[str, np.ndarray], timeout: float | None = None) -> dict[str, np.ndarray]:
        """One request's outputs, waiting for room in the queue and for the answer."""
        return self.submit(inputs, block=True).result(timeout)

    def call(self, fn: Callable[[FailoverPool], object]) -> Future:
        """Run fn(pool) on the I/O thread between requests (what `edgec run` reads and resets there)."""
        self._check_open()
        future: Future = Future()
        self._calls.put((fn, future))
        self._wake()
        return future

    def close(self, drain: bool = True) -> None:
        """Accept no more; answer every accepted request (with `drain=False`, those still queued fail with
        SessionClosed and only those in the devices are answered); stop the workers. Idempotent."""
        with self._room:
            self._accepting = False
            self._drain = self._drain and drain
            self._closing = True
            self._room.notify_all()  # a submit waiting for room learns that there will be none
        self._wake()
        self._join()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1

    def _check_open(self) -> None:
        if self._error is not None:
            raise SessionClosed(f"the session failed: {self._error}")
        if not self._accepting:
            raise SessionClosed("the session is closed")

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):  # full: it is readable already; closed: nothing to wake
            pass

    def _join(self) -> None:
        while self._thread.is_alive():
            self._thread.join(_JOIN_S)

    # -- the I/O thread ----------------------------------------------------------------------------------
    def _io(self, pool_options: dict, started: threading.Event) -> None:
        try:
            pool = FailoverPool(self.manifest, **pool_options)
            self.pool = pool.__enter__()
            pool.watch(self._wake_r)
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor, which raises it
            self._error = exc
            started.set()
            return
        self._ready = True
        started.set()
        try:
            self._serve(pool)
        except BaseException as exc:  # noqa: BLE001 - every accepted request learns of it
            logger.error("%s", exc)
            self._fail(exc)
        finally:
            pool.close()
            self._fail(SessionClosed("the session closed before the request ran"))  # none, unless it failed

    def _serve(self, pool: FailoverPool) -> None:
        failovers, adaptations = 0, 0
        for outputs, latency_ms, run_ms in pool.stream(self._source()):
            future = self._handed.popleft()
            future.latency_ms, future.run_ms, future.done_at = latency_ms, run_ms, time.perf_counter()
            self._tell("done", {"latency_ms": latency_ms, "run_ms": run_ms})
            if len(pool.failovers) > failovers:
                failovers = len(pool.failovers)
                self._tell("failover", pool.failovers[-1])
            decisions = [] if pool.adapter is None else [d for d in pool.adapter.decisions if d.switched_at is not None]
            if len(decisions) > adaptations:
                adaptations = len(decisions)
                self._tell("adaptation", {"plan": str(pool.manifest.path)})
            future.set_result(outputs)

    def _source(self) -> Iterator:
        """The queued requests, IDLE whenever none is at hand; ends once closing with none left."""
        while True:
            self._run_calls()
            closing, drain = self._closing, self._drain
            if closing and not drain:
                return
            self._wanted = True
            try:
                inputs, future = self._queue.get_nowait()
            except queue.Empty:
                if closing:
                    return
                yield IDLE
                continue
            self._wanted = False
            with self._room:
                self._room.notify()
            if future.set_running_or_notify_cancel():
                self._handed.append(future)
                yield inputs

    def _run_calls(self) -> None:
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                future.set_result(fn(self.pool))
            except BaseException as exc:  # noqa: BLE001 - the caller's to handle
                future.set_exception(exc)

    def _tell(self, event: str, figures: dict) -> None:
        for listener in self._listeners:
            try:
                listener(event, figures)
            except Exception:  # noqa: BLE001 - a broken listener must not fail a request
                logger.exception("session listener failed on %s", event)

    def _fail(self, exc: BaseException) -> None:
        """Fail every accepted request not answered: those in the devices, then those queued."""
        with self._room:
            if not isinstance(exc, SessionClosed):
                self._error = exc
            self._accepting = False
            self._room.notify_all()
            doomed = list(self._handed)
            self._handed.clear()
            while True:
                try:
                    doomed.append(self._queue.get_nowait()[1])
                except queue.Empty:
                    break
            while True:
                try:
                    doomed.append(self._calls.get_nowait()[1])
                except queue.Empty:
                    break
        for future in doomed:  # outside the lock: a done-callback may submit again (and be refused)
            with contextlib.suppress(InvalidStateError):  # cancelled by its caller meanwhile
                future.set_exception(exc)


def _arrays(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs: expected {{input name: array}}, got {type(inputs).__name__}")
    return {str(k): np.asarray(v) for k, v in inputs.items()}


def _check(inflight: int | None, timeout: float, threads: int | None, queue_size: int | None) -> None:
    if inflight is not None and (not isinstance(inflight, int) or isinstance(inflight, bool)
                                 or not 1 <= inflight <= MAX_INFLIGHT):
        raise InputError(f"inflight {inflight!r}: expected 1 (one request at a time) to {MAX_INFLIGHT}")
    if queue_size is not None and (not isinstance(queue_size, int) or isinstance(queue_size, bool)
                                   or not 1 <= queue_size <= 100_000):
        raise InputError(f"queue {queue_size!r}: expected 1 to 100000 waiting requests")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 0):
        raise InputError(f"threads {threads!r}: expected 0 (onnxruntime's default) or more")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InputError(f"timeout {timeout!r}: expected a positive number of seconds")
