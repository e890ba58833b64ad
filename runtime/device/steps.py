"""One request through a device's steps, in order: runs, receives, sends, slices, concatenations and frees,
timed and (under --emulate) padded and delayed as the session's module docstring (session.py) describes.

A generative step (sequences.py) also reads and keeps its sequence's state, and on the device that gives the
logits, chooses the token: its id goes to the coordinator and, when the `run` named the sequence's next request
(next_req), to every device that takes it as a model input, keyed by that request (sequences.token_routes; to
this device itself through its inbox). A step whose `run` said token_from takes its token input from that
device instead of the host: its recv step from the host waits for (request, token_from, input)."""

from __future__ import annotations

import time
from typing import Callable, Protocol

import numpy as np

from .emulate import DelayedLinks, pad_run
from .sequences import SequenceState, TokenRoute, feed_state, keep_state
from ..errors import RunError, one_line
from .executor import Executor
from ..manifest.types import HOST, Concat, Free, Manifest, Recv, Run, Send, Slice, region_ranges
from ..wire.protocol import TOKEN_TENSOR

__all__ = ["Steps", "StepsHost"]


class StepsHost(Protocol):
    """What a request's steps need of the session that runs them (session.py's Session): the device's
    manifest and executor, its emulated links, the run's settings, and the calls that move tensors."""

    device: str
    manifest: Manifest
    executor: Executor
    links: DelayedLinks | None
    timings: bool
    emulate: bool
    dilate: float
    arrivals: dict[tuple[int, str, str], float]
    token_routes: list[TokenRoute]
    token_inputs: set[str]
    stats: dict[str, float]

    def wait_for(self, key: tuple[int, str, str]) -> np.ndarray: ...

    def send_output(self, req: int, name: str, array: np.ndarray) -> None: ...

    def deliver(self, req: int, name: str, array: np.ndarray) -> None: ...

    def encode_peer(self, req: int, to: str, name: str, array: np.ndarray) -> tuple[int, Callable[[], None]]: ...

    def acquire_channel(self, duration_s: float, ready: float) -> float: ...

    def hold_until(self, deadline: float) -> None: ...


class Steps:
    """One request through this device's steps, in order."""

    def __init__(self, session: StepsHost, req: int, slow: float = 1.0, sequence: SequenceState | None = None,
                 next_req: int | None = None, token_from: str | None = None):
        self.s, self.req = session, req
        self.sequence = sequence  # a generative step's: its sequence's state and token chooser (sequences.py)
        self.next_req = next_req  # the sequence's next request, which the token chosen here feeds
        self.token_from = token_from  # the device this step's token input comes from (else the host)
        self.pad = session.dilate * slow  # an emulated run takes pad x its predicted time
        self.device = session.device
        # With the session's timings on (see session.py's module docstring): run ms and start clock per run
        # step; clock per device-to-device send and recv step (the order of timed_steps).
        self.frag_ms: list[float] = []
        self.run_clocks: list[float] = []
        self.clocks: list[float] = []
        self.burst: list[tuple[str, int, Callable[[], None]]] = []  # emulated sends not yet on the link
        self.overruns: list[tuple[str, float]] = []  # emulated runs slower than their padding: (fragment, ms)
        # Emulation: this worker's clock when the device finished its last step in the planner's timeline (a
        # run, a burst of sends, a tensor's arrival). Steps the planner counts as free (slice, concat, free,
        # sends to the host, decoding and encoding tensors) take real time on this host; counting the next
        # run and burst from here absorbs it.
        self.ready = time.monotonic()

    def execute(self) -> float:
        """Run the steps; returns the total (emulated) fragment run time in seconds."""
        s, store, run_s = self.s, {}, 0.0
        for step in s.manifest.steps[self.device]:
            if not isinstance(step, Send):
                self.flush()
            if isinstance(step, Run):
                started, elapsed = self.run(step, store)
                run_s += elapsed
                if s.timings:
                    self.run_clocks.append(started)
                    self.frag_ms.append(elapsed * 1000.0)
            elif isinstance(step, Recv):
                store[step.tensor] = self.recv(step)
            elif isinstance(step, Send):
                self.send(step, store[step.tensor])
            elif isinstance(step, Slice):
                store[step.as_name] = self.cut(store[step.tensor], step.axis, step.start, step.stop, step.tensor)
            elif isinstance(step, Concat):
                store[step.as_name] = self.concat(step, store)
            elif isinstance(step, Free):
                for name in step.tensors:
                    del store[name]
        self.flush()
        if s.links is not None:  # a send delivered after the last hold may have failed
            s.links.raise_if_failed()
        return run_s

    def run(self, step: Run, store: dict[str, np.ndarray]) -> tuple[float, float]:
        """The fragment run's start (this worker's clock) and run time (s). Emulated: padded to its predicted
        time x the dilation, counted from when the device was ready for it, which is then its start."""
        s = self.s
        own = None if self.sequence is None else self.sequence.state.get(step.fragment)
        if own is not None:
            feed_state(own, store)
        started = time.monotonic()
        elapsed = s.executor.run(step.fragment, store)
        if own is not None:
            keep_state(s.executor.fragments[step.fragment], own, store, self.device)
        if not s.emulate:
            return started, elapsed
        frag = s.executor.fragments[step.fragment]
        started = self.ready
        taken = time.monotonic() - started
        emulated = pad_run(frag, taken, self.pad)
        if taken > frag.predicted_ms * self.pad / 1000.0:
            self.overruns.append((frag.id, taken * 1000.0))
        self.ready += emulated
        return started, emulated

    def recv(self, step: Recv) -> np.ndarray:
        s = self.s
        direct = step.src == HOST and self.token_from is not None and step.tensor in s.token_inputs
        key = (self.req, self.token_from if direct else step.src, step.tensor)
        array = s.wait_for(key)
        if direct:  # the token from the device that chose it: the device waited for that hop, as the plan prices
            s.stats["tokens_received"] += 1
            arrived = s.arrivals.pop(key, None)
            if s.emulate and arrived is not None:
                self.ready = max(self.ready, arrived)
            return array
        if step.src == HOST:  # free in the planner's model: the device's timeline does not wait for it
            return array
        arrived = s.arrivals.pop(key, None)
        if s.timings:
            self.clocks.append(arrived)
        if s.emulate:
            self.ready = max(self.ready, arrived)
        return array

    def send(self, step: Send, array: np.ndarray) -> None:
        s = self.s
        if s.timings and step.to != HOST and s.links is None:  # emulated: stamped when its transfer starts
            self.clocks.append(time.monotonic())
        for r in region_ranges(step.region):  # a box: one view per axis, still no copy
            array = self.cut(array, r.axis, r.start, r.stop, step.tensor)
        if step.to == HOST:  # free in the planner's model: never delayed
            if self.sequence is not None and step.name == s.manifest.generate.logits_output:
                self.send_token(array)
                if not self.sequence.logits:
                    return
            s.send_output(self.req, step.name, array)
            return
        wire, send = s.encode_peer(self.req, step.to, step.name, array)
        if s.links is None:
            send()
        else:
            self.burst.append((step.to, wire, send))  # the link carries the bytes actually sent

    def send_token(self, logits: np.ndarray) -> None:
        """A generative step's token, chosen here from the logits of its last position: only its id leaves, to
        the devices that take it as the sequence's next step's input first (the next step's critical path),
        then to the coordinator, which reports and verifies it."""
        s = self.s
        token = self.sequence.choose(logits.reshape(-1, logits.shape[-1])[-1])
        if self.next_req is not None:
            for route in s.token_routes:
                array = np.full(route.shape, token, dtype=route.dtype)
                if route.device == self.device:
                    s.deliver(self.next_req, route.input, array)
                else:
                    wire, send = s.encode_peer(self.next_req, route.device, route.input, array)
                    if s.links is None:
                        send()
                    else:  # on the lane that owns the peer sockets, delayed as its link says; not timed in `done`
                        s.links.submit(route.device, wire, send, not_before=self.ready)
                s.stats["tokens_sent"] += 1
        s.send_output(self.req, TOKEN_TENSOR, np.array([token], dtype=np.int64))

    def flush(self) -> None:
        """Emulation: put the burst of consecutive sends on the link (on a shared medium, once the coordinator
        grants the channel for all of it) and wait for its end, as the planner's sender does."""
        if not self.burst:
            return
        s, burst, self.burst = self.s, self.burst, []
        links = s.links
        start = self.ready
        if links.shared:
            start = s.acquire_channel(sum(links.duration_s(to, n) for to, n, _ in burst), self.ready)
        starts = [links.submit(to, n, send, not_before=start) for to, n, send in burst]
        if s.timings:
            self.clocks.extend(starts)
        s.hold_until(links.busy_until)
        self.ready = links.busy_until
        links.raise_if_failed()

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
            raise RunError(f"device {self.device}: concat of {list(step.parts)} into {step.as_name!r} failed: "
                           f"{one_line(exc)}") from None

