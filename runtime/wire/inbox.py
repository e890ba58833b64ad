"""A worker's received tensors, kept by (request, sender, name) until a recv step takes them.

Senders run ahead of receivers, so a tensor for a later step or a later request may arrive first. What is
kept is bounded three ways: only (sender, name) pairs that this device's recv steps expect, only request
ids inside the in-flight window [base, base + window), and at most `max_bytes` in total. Anything else is
refused with a reason (the caller drops and logs it), so a peer cannot grow a worker's memory.
"""

from __future__ import annotations

import logging

import numpy as np

from .transport import TensorMsg

__all__ = ["Inbox", "FULL"]

logger = logging.getLogger(__name__)

FULL = "buffer full"


class Inbox:
    def __init__(self, expected: set[tuple[str, str]], window: int, max_bytes: int):
        self.expected = expected
        self.window = window
        self.max_bytes = max_bytes
        self.base = 0  # the oldest request still open on this device
        self.bytes = 0
        self.buffer: dict[tuple[int, str, str], np.ndarray] = {}

    def offer(self, msg: TensorMsg) -> str | None:
        """Keep the tensor and return None, or return why it was refused."""
        if (msg.src, msg.name) not in self.expected:
            return "not a tensor this device receives"
        if not self.base <= msg.req < self.base + self.window:
            return f"request {msg.req} outside the window [{self.base}, {self.base + self.window})"
        key = (msg.req, msg.src, msg.name)
        if key in self.buffer:
            return "duplicate"
        if self.bytes + msg.array.nbytes > self.max_bytes:
            return FULL
        self.buffer[key] = msg.array
        self.bytes += msg.array.nbytes
        return None

    def take(self, key: tuple[int, str, str]) -> np.ndarray | None:
        array = self.buffer.pop(key, None)
        if array is not None:
            self.bytes -= array.nbytes
        return array

    def advance(self, done_req: int) -> None:
        """Request `done_req` is finished here: the window moves past it (nothing older can be kept)."""
        self.base = max(self.base, done_req + 1)
        for key in [k for k in self.buffer if k[0] < self.base]:
            self.take(key)

    def clear(self) -> None:
        self.buffer.clear()
        self.bytes = 0
