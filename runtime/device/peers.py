"""A session's links to its peer devices (a part of Session, session.py): the data sockets it connects to
each device it sends to once the coordinator says where they are (`peers`), the tensors that arrive from them
(checked against the sender's key, decoded, kept in the inbox for the step that waits for them) and the
tensors it sends them, compressed as the run says (wire/chooser.py)."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import zmq

from ..errors import InputError, RunError
from ..manifest.schedule import send_targets
from ..manifest.types import HOST
from ..wire.chooser import Chooser, calibrate
from ..wire.inbox import FULL
from ..wire.net import parse_endpoint
from ..wire.protocol import parse
from ..wire.transport import (BadMessage, TensorHeader, TensorMsg, contiguous, decode_tensor, frame_sender,
                              send_tensor, tensor_header)
from .emulate import DelayedLinks

__all__ = ["PeerLinks", "SEND_TIMEOUT_MS"]

SEND_TIMEOUT_MS = 60_000  # a peer that accepts nothing for this long has failed; the send raises


class PeerLinks:
    """Session's data sockets: `peers`, tensors from other devices (on_data) and to them (encode_peer)."""

    def _on_peers(self, msg: dict, payload) -> None:
        m, peers = self.manifest, msg["peers"]
        for name in sorted({src for src, _ in self.inbox.expected if src not in (HOST, self.device)}):
            self.peer_keys[name] = self._peer_entry(peers, name, need_addr=False)[1]
        token_to = {r.device for r in self.token_routes if r.device != self.device}
        for name in sorted(send_targets(m, self.device) | token_to):
            addr, key = self._peer_entry(peers, name, need_addr=True)
            sock = self.d.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
            sock.setsockopt(zmq.LINGER, 0)
            if self.d.keys is not None:
                self.d.keys.connect_to(sock, key.encode())
            sock.connect(addr)
            self.peers[name] = sock
            self.choosers[name] = Chooser(self.compress, bandwidth_mbps=m.network.link(self.device, name)[0])
        if self.compress == "auto" and self.peers:
            calibrate()  # measured now (about 0.1 s, once per process), not during the first request
        if self.emulate:
            self.links = DelayedLinks(m, self.device, self.dilate)
        self.state = "ready"
        self.reply(t="ready")

    def _peer_entry(self, peers: dict, name: str, need_addr: bool) -> tuple[str | None, str | None]:
        """(data address, public key) of a peer device: the address of one this device sends to, the key of
        every peer when keys are used (a sender's key is what its tensors must arrive with)."""
        entry = peers.get(name)
        addr = entry.get("addr") if isinstance(entry, dict) else None
        key = entry.get("key") if isinstance(entry, dict) else None
        if need_addr:
            if not isinstance(addr, str):
                raise InputError(f"device {self.device}: the coordinator sent no data address for peer {name}")
            parse_endpoint(addr, f"peer {name}")
        if self.d.keys is not None and not (isinstance(key, str) and self.d.keys.is_trusted(key)):
            raise InputError(f"device {self.device}: peer {name}'s key is not in {self.d.keys.where}")
        return addr, key

    def on_data(self, frames: list[zmq.Frame]) -> None:
        try:
            header, payload = parse(frames, {"tensor"})
            head = tensor_header(header, self.d.max_message_bytes)
        except BadMessage as exc:
            self.drops.drop("malformed", exc)
            return
        if head.src == HOST or head.src not in self.peer_keys:
            self.drops.drop("unknown sender", head.src[:80])
            return
        if self.d.keys is not None and frame_sender(payload) != self.peer_keys[head.src]:
            self.drops.drop(f"not signed with {head.src}'s key", head.name[:80])
            return
        if head.codec != "none":  # decompressing costs time and memory: only for a tensor we would keep
            unwanted = self._unwanted(head)
            if unwanted:
                self.drops.drop(unwanted, f"{head.src[:80]}/{head.name[:80]} request {head.req}")
                return
        start = time.perf_counter()
        try:
            tensor = decode_tensor(head, payload, self.d.max_message_bytes)
        except BadMessage as exc:
            self.drops.drop("malformed", exc)
            return
        if head.codec != "none":
            self.stats["decompress_ms"] += (time.perf_counter() - start) * 1000.0
        # Arrived: this worker holds the decoded tensor, what its recv step waits for. Right after a fragment
        # run, the checks and the decoding above take tens of microseconds (the runtime's code and data left
        # the caches), so the transfer's measure and the profile's message figure include them.
        self._keep(tensor, time.monotonic())

    def _unwanted(self, head: TensorHeader) -> str | None:
        """Why the inbox would refuse this tensor, judged from its header alone (the inbox checks again)."""
        inbox = self.inbox
        if (head.src, head.name) not in inbox.expected:
            return "not a tensor this device receives"
        if not inbox.base <= head.req < inbox.base + inbox.window:
            return f"request {head.req} outside the window [{inbox.base}, {inbox.base + inbox.window})"
        return None

    def _keep(self, tensor: TensorMsg, arrived: float | None = None) -> None:
        reason = self.inbox.offer(tensor)
        if reason == FULL:
            raise RunError(f"device {self.device}: tensors waiting for later steps exceed this worker's "
                           f"--max-buffer-mb ({self.d.max_buffer_bytes >> 20} MiB); raise it, or run with a "
                           "smaller --inflight")
        if reason is not None:
            self.drops.drop(reason, f"{tensor.src[:80]}/{tensor.name[:80]} request {tensor.req}")
            return
        self.stats["bytes_received"] += tensor.nbytes
        self.stats["bytes_received_raw"] += tensor.array.nbytes
        if (self.timings or self.emulate) and arrived is not None:
            self.arrivals[(tensor.req, tensor.src, tensor.name)] = arrived

    def _count_sent(self, wire: int, raw: int) -> None:
        with self._sent_lock:
            self.stats["bytes_sent"] += wire
            self.stats["bytes_sent_raw"] += raw

    def encode_peer(self, req: int, to: str, name: str, array: np.ndarray) -> tuple[int, Callable[[], None]]:
        """A tensor for a peer device, compressed as the run says: (its bytes on the wire, the call that
        sends it)."""
        sock = self.peers[to]
        arr = contiguous(array)  # the header's shape and the payload must describe the same bytes
        start = time.perf_counter()
        codec, payload = self.choosers[to].encode(name, arr)
        self.stats["compress_ms"] += (time.perf_counter() - start) * 1000.0
        wire = len(payload)
        if codec != "none":
            self.stats["sends_compressed"] += 1

        def send() -> None:
            try:
                send_tensor(sock, req, self.device, name, arr, codec, payload=payload)
            except zmq.Again:
                raise RunError(f"device {self.device}: device {to} accepted nothing for "
                               f"{SEND_TIMEOUT_MS // 1000} s") from None
            self._count_sent(wire, arr.nbytes)

        return wire, send
