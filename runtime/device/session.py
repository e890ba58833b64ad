"""One run on a worker (a session): the coordinator's manifest, this device's fragments and peers (the data
sockets: peers.py), and the requests it executes, each through the device's steps in order. The protocol is in
wire/protocol.py.

Device-to-device tensors are compressed as the run's `compress` mode says (wire/chooser.py): one Chooser per
destination, which in `auto` mode weighs this machine's measured codec speeds against that link's
bandwidth in the manifest's network. Model inputs and outputs (coordinator <-> worker) always travel raw:
the planner treats those transfers as free, and the coordinator is usually on the fastest link.

Once the coordinator has asked for this worker's clock (`sync`, for `edgec run --report`), every request is
timed: each fragment run and the moment it starts, the moment each device-to-device send starts and the
moment each tensor from another device has been taken off the data socket and decoded, sent back in `done`
(wire/protocol.py). An arrival is stamped when this worker's loop has read the socket: while it runs a fragment it
does not read, so a tensor that arrives meanwhile is stamped after the run ends (its measured transfer
includes that wait).

Under --emulate (emulate.py) each fragment run is padded to predicted_ms x the run's dilation, and each burst
of consecutive sends travels on the device's DelayedLinks, its step list waiting for the burst to end; on a
shared medium the burst first asks the coordinator for the channel. A send's clock is then the emulated start
of its transfer, a run's the moment its padding is counted from (when the device was ready for it), and runs
slower than their padding are reported (`overrun`).

A generative session (manifest version 2) keeps each sequence's caches between its steps (sequences.py), and
carries the token's direct path (sequences.token_routes): the device that gives the logits sends each token it
chooses, when the step's `run` names the sequence's next request (next_req), to every device that takes it as a
model input, over the data sockets like every peer send (CURVE with keys), or into its own inbox when that is
itself; a step whose `run` says token_from takes that input from the chooser instead of the host. So the inbox
expects (chooser, input) besides the manifest's receives, a first stage that receives nothing else from its
peers binds its data socket for it, and the chooser connects to it. That token's arrival holds the step as a
tensor from a device does (under --emulate its timeline waits for it), but `done` has no clock for it: the
timed steps are the manifest's (wire/protocol.py timed_steps), where it is a host input."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Protocol

import numpy as np
import zmq

from ..wire.protocol import timed_steps
from .cache import FragmentCache, Incoming, check_sha256
from ..wire.chooser import Chooser
from ..wire.compress import parse_mode
from .emulate import DelayedLinks
from ..errors import InputError, RunError
from .executor import Executor
from .sequences import Sequences, TokenRoute, token_device, token_routes
from .peers import PeerLinks
from .steps import Steps
from ..wire.inbox import Inbox
from ..manifest.types import HOST, Manifest
from ..manifest.load import decode_manifest_json, parse_manifest
from ..wire.keys import Keyring
from ..wire.net import Endpoint
from ..wire.protocol import MAX_TIMED_STEPS, DropLog, parse
from ..manifest.schedule import recv_keys
from ..wire.transport import POLL_MS, BadMessage, TensorMsg, decode_tensor, pack, send_tensor

__all__ = ["Session", "SessionEnd", "SessionLost", "SessionHost", "MAX_INFLIGHT"]

logger = logging.getLogger(__name__)

MAX_INFLIGHT = 64
MAX_FRAGMENT_BYTES = 2 << 30  # protobuf cannot serialize a larger ONNX file

_ALLOWED = {
    "hello": frozenset({"open", "ping", "end"}),
    "loading": frozenset({"blob", "ping", "end"}),
    "loaded": frozenset({"peers", "ping", "end"}),
    "ready": frozenset({"run", "tensor", "sync", "grant", "ping", "end", "begin", "drop"}),
}


class SessionEnd(Exception):
    """The coordinator ended the session."""


class SessionLost(Exception):
    """The coordinator went silent: the session is abandoned."""


class SessionHost(Protocol):
    """What a session needs of the worker that runs it (worker.py's Daemon): its sockets, fragment cache,
    keys and limits."""

    endpoint: Endpoint
    ctx: zmq.Context
    control: zmq.Socket
    cache: FragmentCache
    keys: Keyring | None
    threads: int
    max_buffer_bytes: int
    max_message_bytes: int
    idle_timeout: float

    def bind_data(self) -> zmq.Socket: ...

    def unbind_data(self, sock: zmq.Socket) -> None: ...

    def trim(self) -> None: ...

    def send_to(self, peer: bytes, frames: list) -> None: ...

    def pump(self, timeout_ms: int = ...) -> None: ...


class Session(PeerLinks):
    def __init__(self, daemon: SessionHost, owner: bytes, peer: str):
        self.d = daemon
        self.owner, self.peer = owner, peer
        self.started = time.time()
        self.heard = time.monotonic()
        self.state = "hello"
        self.manifest: Manifest | None = None
        self.device = ""
        self.label = "manifest"
        self.emulate = False
        self.dilate = 1.0  # --emulate --dilate K: every predicted time and delay x K
        self.compress = "none"
        self.choosers: dict[str, Chooser] = {}  # per destination device: its link's codec choices
        self.executor: Executor | None = None
        self.inbox: Inbox | None = None
        self.data: zmq.Socket | None = None
        self.peers: dict[str, zmq.Socket] = {}
        self.peer_keys: dict[str, str | None] = {}
        self.links: DelayedLinks | None = None
        self.need: dict[str, str] = {}  # sha256 -> fragment id, still to arrive
        self.incoming: Incoming | None = None
        self.queue: deque[int] = deque()
        self.slow: dict[int, float] = {}  # emulated slow-down of a queued request's runs, when not 1 (wire/protocol.py)
        self.next_run = 0
        self.sequences: Sequences | None = None  # a generative session's (manifest version 2)
        self.seq_of: dict[int, int] = {}  # a queued generative request's sequence
        # A generative session's token path (sequences.token_routes): the device that chooses each token, where
        # this device sends it when it is that device, and the inputs this device takes it as.
        self.chooser = ""
        self.token_routes: list[TokenRoute] = []
        self.token_inputs: set[str] = set()
        self.next_of: dict[int, int] = {}  # a queued request -> its sequence's next request (`run`'s next_req)
        self.token_from: dict[int, str] = {}  # a queued request whose token input comes from that device
        self.drops = DropLog(f"worker {daemon.endpoint}")
        # bytes_sent / bytes_received: tensor payloads on the wire (compressed where they were); *_raw: the
        # same tensors' own sizes. compress_ms / decompress_ms: time spent choosing, compressing, decoding.
        self.stats = {"requests": 0, "fragment_bytes_received": 0, "bytes_received": 0, "bytes_sent": 0,
                      "bytes_received_raw": 0, "bytes_sent_raw": 0, "sends_compressed": 0, "compress_ms": 0.0,
                      "decompress_ms": 0.0}
        self.shas: set[str] = set()
        self._sent_lock = threading.Lock()  # emulated links send from their own threads
        self.timings = False  # set by the coordinator's first `sync`: `done` then carries the request's timings
        # (request, sender, name) -> this worker's clock when the tensor arrived, until its recv step takes it;
        # bounded like the inbox, which holds the same keys.
        self.arrivals: dict[tuple[int, str, str], float] = {}
        self.channel_seq = 0  # the shared medium's channel requests (`channel`), numbered
        self.asked: tuple[int, float] | None = None  # the request awaiting its grant: (seq, this worker's clock)
        self.grants: dict[int, float] = {}  # request seq -> this worker's clock at which its burst starts

    # -- control messages from the coordinator --------------------------------------------------------
    def reply(self, **msg) -> None:
        self.d.send_to(self.owner, [pack(msg)])

    def on_control(self, frames: list[zmq.Frame]) -> None:
        try:
            msg, payload = parse(frames, _ALLOWED[self.state])
        except BadMessage as exc:
            self.drops.drop("bad message from the coordinator", exc)
            return
        self.heard = time.monotonic()
        getattr(self, f"_on_{msg['t']}")(msg, payload)

    def _on_ping(self, msg: dict, payload) -> None:
        pass

    def _on_end(self, msg: dict, payload) -> None:
        raise SessionEnd()

    def _on_sync(self, msg: dict, payload) -> None:
        if not self.timings:
            if self.next_run:  # tensors already received carry no arrival time
                raise InputError(f"device {self.device}: the coordinator asked for timings after the first request")
            timed = sum(1 for _ in timed_steps(self.manifest.steps[self.device]))
            if timed > MAX_TIMED_STEPS:
                raise InputError(f"{self.label}: device {self.device} has {timed} fragment runs, sends and "
                                 f"receives per request, too many to time (at most {MAX_TIMED_STEPS})")
            self.timings = True
        self.reply(t="synced", seq=msg["seq"], clock=time.monotonic())

    def _on_grant(self, msg: dict, payload) -> None:
        if self.asked is None or msg["seq"] != self.asked[0]:
            return self.drops.drop("a grant of the channel that answers no request", msg["seq"])
        # The coordinator's clock read when it reserved is mapped to the middle of the round trip (as Cristian's
        # method does): half the round trip early or late at worst, usually much less.
        self.grants[msg["seq"]] = (self.asked[1] + time.monotonic()) / 2.0 + msg["wait_ms"] / 1000.0
        self.asked = None

    def _on_open(self, msg: dict, payload) -> None:
        self.label = msg["path"][:500]
        m = parse_manifest(decode_manifest_json(msg["manifest"], self.label), self.label)
        device, inflight = msg["device"], msg["inflight"]
        if device not in m.device_names or not m.steps.get(device):
            raise InputError(f"{self.label}: device {device!r} has no steps in this manifest")
        if not 1 <= inflight <= MAX_INFLIGHT:
            raise InputError(f"inflight {inflight}: expected 1 to {MAX_INFLIGHT}")
        self.manifest, self.device, self.emulate, self.dilate = m, device, msg["emulate"], float(msg["dilate"])
        expected = recv_keys(m, device)
        if m.generate is not None:
            self.sequences = Sequences(m, device)
            self.chooser, routes = token_device(m), token_routes(m)
            self.token_routes = routes if device == self.chooser else []
            self.token_inputs = {r.input for r in routes if r.device == device}
            expected |= {(self.chooser, name) for name in self.token_inputs}
            # The token's direct path: the tokens this device handed to a sequence's next step (a peer's, over
            # the data sockets, or its own), and the steps whose token input came that way, not from the host.
            self.stats.update(tokens_sent=0, tokens_received=0)
        # Absent from an older coordinator's "open": it sends and expects raw tensors.
        self.compress = parse_mode(msg["compress"])
        for frag in m.device_fragments(device):
            try:
                sha = check_sha256(frag.sha256)
            except ValueError as exc:
                raise InputError(f"{self.label}: fragment {frag.id}: {exc}") from None
            self.shas.add(sha)
            if self.d.cache.has(sha):
                self.d.cache.touch(sha)
            else:
                self.need[sha] = frag.id
        self.inbox = Inbox(expected, inflight, self.d.max_buffer_bytes)
        if any(src not in (HOST, device) for src, _ in expected):  # its own token goes straight to the inbox
            self.data = self.d.bind_data()
        port = None if self.data is None else int(self.data.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])
        logger.info("session from %s: device %s, %d fragment(s), %d to receive, inflight %d, compress %s", self.peer,
                    device, len(self.shas), len(self.need), inflight, self.compress)
        self.state = "loading"
        self.reply(t="opened", data_port=port, need=sorted(self.need))
        if not self.need:
            self._load()

    def _on_blob(self, msg: dict, payload: zmq.Frame) -> None:
        sha, size = msg["sha256"], msg["size"]
        if sha not in self.need:
            raise RunError(f"device {self.device}: received a fragment file it did not ask for")
        if self.incoming is not None and self.incoming.sha256 != sha:
            raise RunError(f"device {self.device}: fragment {self.need[sha]} started before "
                           f"{self.need[self.incoming.sha256]} was complete")
        if self.incoming is None:
            if not 0 <= size <= MAX_FRAGMENT_BYTES:
                raise InputError(f"{self.label}: fragment {self.need[sha]}: size {size} is out of range")
            self.incoming = self.d.cache.begin(sha, size)
        data = payload.buffer
        try:
            complete = self.incoming.write(msg["offset"], data)
        except ValueError as exc:
            self.incoming.abort()
            self.incoming = None
            raise InputError(f"{self.label}: fragment {self.need[sha]}: {exc}") from None
        self.stats["fragment_bytes_received"] += len(data)
        self.reply(t="ack", sha256=sha, offset=msg["offset"])
        if complete:
            self.incoming = None
            del self.need[sha]
            if not self.need:
                self._load()

    def _load(self) -> None:
        self.executor = Executor(self.manifest, self.device, self.d.threads,
                                 files=lambda frag: self.d.cache.path(frag.sha256))
        self.executor.load()
        self.d.trim()
        self.state = "loaded"
        self.reply(t="loaded")

    def _on_run(self, msg: dict, payload) -> None:
        req = msg["req"]
        if req != self.next_run or req >= self.inbox.base + self.inbox.window:
            raise RunError(f"device {self.device}: run request {req} out of order (expected {self.next_run}, "
                           f"window from {self.inbox.base})")
        if msg["slow"] != 1 and not self.emulate:
            raise InputError(f"device {self.device}: run request {req} asks for an emulated slow-down, but the run "
                             "is not emulated")
        if msg["slow"] != 1:
            self.slow[req] = float(msg["slow"])
        if (self.sequences is None) != ("seq" not in msg):
            raise InputError(f"device {self.device}: run request {req} " + (
                "names no sequence in a generative session" if self.sequences is not None else
                "names a sequence, but the manifest is not a generative build"))
        if self.sequences is not None:
            self.seq_of[req] = msg["seq"]
        self._token_fields(req, msg)
        self.queue.append(req)
        self.next_run += 1

    def _token_fields(self, req: int, msg: dict) -> None:
        """`run`'s next_req and token_from (wire/protocol.py), checked against this session."""
        nxt, src = msg.get("next_req"), msg.get("token_from")
        if nxt is None and src is None:
            return
        if self.sequences is None:
            raise InputError(f"device {self.device}: run request {req} names a token path, but the manifest is not "
                             "a generative build")
        if src is not None and src != self.chooser:
            raise InputError(f"device {self.device}: run request {req}: token_from {src[:80]!r} is not the device "
                             f"that chooses the tokens ({self.chooser})")
        if nxt is not None and nxt - req >= self.inbox.window:
            raise InputError(f"device {self.device}: run request {req}: next_req {nxt} is beyond the window of "
                             f"{self.inbox.window} requests")
        if nxt is not None:
            self.next_of[req] = nxt
        if src is not None:
            self.token_from[req] = src

    def _on_begin(self, msg: dict, payload) -> None:
        self._generative("begin").begin(msg["seq"], float(msg["temperature"]), msg["seed"], msg["logits"],
                                             msg["drawn"])

    def _on_drop(self, msg: dict, payload) -> None:
        self._generative("drop").drop(msg["seq"])

    def _generative(self, what: str) -> Sequences:
        if self.sequences is None:
            raise InputError(f"device {self.device}: {what} of a sequence, but the manifest is not a generative build")
        return self.sequences

    def _on_tensor(self, msg: dict, payload: zmq.Frame) -> None:
        try:
            tensor = decode_tensor(msg, payload, self.d.max_message_bytes)
        except BadMessage as exc:
            self.drops.drop("bad input tensor", exc)
            return
        if tensor.src != HOST:
            self.drops.drop("a device's tensor on the control connection", tensor.src)
            return
        self._keep(tensor)

    # -- requests -------------------------------------------------------------------------------------
    def check_idle(self) -> None:
        silent = time.monotonic() - self.heard
        if silent > self.d.idle_timeout:
            raise SessionLost(f"no word from the coordinator at {self.peer} for {silent:.0f} s")

    def execute_next(self) -> None:
        req = self.queue.popleft()
        seq = self.seq_of.pop(req, None)
        sequence = None if seq is None else self.sequences.get(seq)
        steps = Steps(self, req, self.slow.pop(req, 1.0), sequence, self.next_of.pop(req, None),
                      self.token_from.pop(req, None))
        run_s = steps.execute()
        self.inbox.advance(req)
        self.stats["requests"] += 1
        if steps.overruns:
            self.reply(t="overrun", req=req, fragments=[f for f, _ in steps.overruns],
                       measured_ms=[ms for _, ms in steps.overruns])
        self.reply(t="done", req=req, run_ms=run_s * 1000.0, frag_ms=steps.frag_ms, run_clocks=steps.run_clocks,
                   clocks=steps.clocks)

    def wait_for(self, key: tuple[int, str, str]) -> np.ndarray:
        while True:
            array = self.inbox.take(key)
            if array is not None:
                return array
            self.d.pump()
            self.check_idle()

    def deliver(self, req: int, name: str, array: np.ndarray) -> None:
        """This device's own token for its request `req`'s input `name`: into its inbox, without the network."""
        reason = self.inbox.offer(TensorMsg(req, self.device, name, array, array.nbytes))
        if reason is not None:
            raise RunError(f"device {self.device}: its own token for request {req} was refused: {reason}")

    def send_output(self, req: int, name: str, array: np.ndarray) -> None:
        wire = send_tensor(self.d.control, req, self.device, name, array, prefix=(self.owner,))
        self._count_sent(wire, array.nbytes)

    def acquire_channel(self, duration_s: float, ready: float) -> float:
        """The shared medium's one channel for a burst of duration_s that could have started at `ready` (this
        worker's clock): asks the coordinator and serves the sockets until it grants it; returns this
        worker's clock at which the burst starts (before now when the channel was free since `ready`)."""
        seq = self.channel_seq
        self.channel_seq += 1
        self.asked = (seq, time.monotonic())
        self.reply(t="channel", seq=seq, ms=duration_s * 1000.0, since_ms=max(0.0, self.asked[1] - ready) * 1000.0)
        while seq not in self.grants:
            self.d.pump()
            self.check_idle()
        return self.grants.pop(seq)

    def hold_until(self, deadline: float) -> None:
        """Serve the sockets until this worker's clock reaches `deadline` (poll waits whole milliseconds: the
        last one is slept)."""
        while (left := deadline - time.monotonic()) > 0:
            if left > 0.002:
                self.d.pump(min(POLL_MS, int(left * 1000.0) - 1))
            else:
                time.sleep(left)

    # -- end ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Free everything the session holds (fragments, buffers, sockets); idempotent."""
        if self.incoming is not None:
            self.incoming.abort()
            self.incoming = None
        if self.links is not None:
            self.links.close()
            self.links = None
        if self.executor is not None:
            self.executor.close()
            self.executor = None
        if self.inbox is not None:
            self.inbox.clear()
        self.arrivals.clear()
        for sock in self.peers.values():
            sock.close(linger=0)
        self.peers.clear()
        self.choosers.clear()
        if self.data is not None:
            self.d.unbind_data(self.data)
            self.data = None
        self.queue.clear()
        self.slow.clear()
        self.seq_of.clear()
        self.next_of.clear()
        self.token_from.clear()
        if self.sequences is not None:
            self.sequences.clear()
