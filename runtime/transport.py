"""Messages over pyzmq: msgpack control messages, and tensors as a msgpack header frame + raw bytes frame."""

from __future__ import annotations

import logging
from typing import Any, Callable

import msgpack
import numpy as np
import zmq

__all__ = ["pack", "unpack", "send_tensor", "decode_tensor", "bind_local", "Inbox", "POLL_MS"]

logger = logging.getLogger(__name__)

POLL_MS = 500  # how often blocked loops wake up to check on their peers (parent alive, deadlines)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, raw=False)


def bind_local(sock: zmq.Socket) -> str:
    """Bind to a free localhost TCP port and return the address peers should connect to."""
    sock.bind("tcp://127.0.0.1:0")
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()


def send_tensor(sock: zmq.Socket, req: int, src: str, name: str, array: np.ndarray) -> None:
    """Send one tensor; the bytes frame is the array's own buffer (zero-copy above pyzmq's copy threshold)."""
    # Only a non-contiguous view (a region along an inner axis) needs a copy here. (Not
    # np.ascontiguousarray: it turns a 0-d array into shape (1,).)
    arr = array if array.flags.c_contiguous else array.copy(order="C")
    header = pack({"req": req, "tensor": name, "src": src, "dtype": arr.dtype.name, "shape": arr.shape})
    sock.send_multipart([header, arr], copy=False)


def decode_tensor(frames: list[zmq.Frame]) -> tuple[int, str, str, np.ndarray]:
    """(req, src, tensor name, array) from a received message; the array views the frame's buffer."""
    header = unpack(frames[0].buffer)
    array = np.frombuffer(frames[1].buffer, dtype=np.dtype(header["dtype"])).reshape(header["shape"])
    return header["req"], header["src"], header["tensor"], array


class Inbox:
    """Tensors received on a PULL socket, buffered by (req, src, tensor) until a recv step takes them.

    Senders run ahead of receivers, so a tensor for a later step (or request) may arrive first.
    `control` (optional) is polled at the same time so a waiting worker still hears "stop".
    """

    def __init__(self, sock: zmq.Socket, control: zmq.Socket | None = None):
        self.sock = sock
        self.control = control
        self.buffer: dict[tuple[int, str, str], np.ndarray] = {}
        self.poller = zmq.Poller()
        self.poller.register(sock, zmq.POLLIN)
        if control is not None:
            self.poller.register(control, zmq.POLLIN)

    def drain(self) -> None:
        """Move every message already queued on the socket into the buffer."""
        while True:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            req, src, name, array = decode_tensor(frames)
            self.buffer[(req, src, name)] = array

    def wait(self, key: tuple[int, str, str], on_control: Callable[[], None], on_idle: Callable[[], None]) -> np.ndarray:
        """Block until `key` has arrived; calls on_control when a control message is pending and
        on_idle after each quiet poll interval (either may raise to abort the wait)."""
        while key not in self.buffer:
            events = dict(self.poller.poll(POLL_MS))
            if self.sock in events:
                self.drain()
            if self.control is not None and self.control in events:
                on_control()
            if not events:
                on_idle()
        return self.buffer.pop(key)
