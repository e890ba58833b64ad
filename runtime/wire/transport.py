"""Wire format over pyzmq: a message is a msgpack header frame (a map with a "t" type), optionally
followed by one raw payload frame (a tensor's bytes, a chunk of a fragment file).

A tensor message's header is {"t": "tensor", "req", "src", "tensor", "dtype", "shape", "codec"}; the
payload is the C-order bytes of the array, encoded by `codec`: "none", or "lz4" / "zstd" (compress.py:
`edgec run --compress`); another codec plugs in with `register_codec`. Every received header is decoded
with size limits and type-checked before it is used (protocol.py), and a tensor's payload must hold
exactly shape x dtype bytes once decoded: a compressed payload is decoded into a buffer of that size and
no larger, and one that decodes to any other size is a BadMessage (dropped and logged by the receiver).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import msgpack
import numpy as np
import zmq

from . import compress
from ..manifest.types import DTYPES

__all__ = ["pack", "unpack", "BadMessage", "TensorMsg", "Codec", "register_codec", "codec_names", "contiguous",
           "tensor_frames", "send_tensor", "TensorHeader", "tensor_header", "decode_tensor", "frame_sender", "bind_local", "POLL_MS",
           "MAX_HEADER_BYTES", "MAX_DIMS", "send_frames", "recv_message"]

logger = logging.getLogger(__name__)

POLL_MS = 500  # how often blocked loops wake up to check on their peers (deadlines, parent alive)
MAX_HEADER_BYTES = 1 << 16  # a header is a few hundred bytes; only a session's "open" carries more (its own limit)
MAX_DIMS = 32  # onnxruntime's own limit on tensor rank is far below what anyone uses

# Every request crosses the hot path below a few times on each side, after onnxruntime has evicted the caches:
# plain ints instead of pyzmq's enum flags (whose operators run Python code), and the dtypes looked up once
# (numpy computes dtype.name in Python).
_SNDMORE, _NOBLOCK, _EVENTS, _POLLIN = int(zmq.SNDMORE), int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)
_DTYPE = {name: np.dtype(name) for name in DTYPES}
_DTYPE_NAME = {dtype: name for name, dtype in _DTYPE.items()}


class BadMessage(ValueError):
    """A frame that is not a well-formed message of this protocol (dropped and logged by the receiver)."""


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes | memoryview, limit: int = MAX_HEADER_BYTES) -> Any:
    """Decode one msgpack value from a frame of at most `limit` bytes; BadMessage on anything else."""
    if len(data) > limit:
        raise BadMessage(f"header of {len(data)} bytes (limit {limit})")
    try:
        # unpackb bounds every string, binary, array and map by the frame's own length.
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise BadMessage(f"not msgpack ({type(exc).__name__})") from None


def send_frames(sock: zmq.Socket, frames: list | tuple) -> None:
    """Send one message of `frames` (bytes, buffers or zmq.Frame), zero-copy where pyzmq's copy threshold
    allows: what Socket.send_multipart(copy=False) does, without its per-frame type checks and enum flags."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, _SNDMORE if i < last else 0, copy=False)


def recv_message(sock: zmq.Socket) -> list[zmq.Frame] | None:
    """The next whole message waiting on `sock` (its frames, not copied), or None when none is waiting.
    zmq delivers a multipart message atomically, so once its first frame is there the rest is too. Asking
    the socket first is cheaper than letting a non-blocking receive raise zmq.Again at the end of every drain.
    The receive may still find nothing: on a CURVE connection zmq queues the peer's credential ahead of its
    first message and counts it as readable, then skips it, before that message has fully arrived."""
    if not sock.getsockopt(_EVENTS) & _POLLIN:
        return None
    try:
        frame = sock.recv(_NOBLOCK, copy=False)
    except zmq.Again:
        return None
    frames = [frame]
    while frame.more:
        frame = sock.recv(_NOBLOCK, copy=False)
        frames.append(frame)
    return frames


def bind_local(sock: zmq.Socket) -> str:
    """Bind to a free localhost TCP port and return the address peers should connect to."""
    sock.bind("tcp://127.0.0.1:0")
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()


# -- codecs ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Codec:
    """encode(C-order array bytes) -> payload; decode(payload, expected byte count) -> the array bytes.
    decode must refuse (BadMessage) a payload that does not decode to exactly that many bytes, and must
    not allocate more than that (a hostile payload is not allowed to decompress into gigabytes)."""

    encode: Callable[[memoryview], Any]
    decode: Callable[[memoryview, int], Any]


def _decode_none(payload: memoryview, nbytes: int) -> memoryview:
    if len(payload) != nbytes:
        raise BadMessage(f"payload of {len(payload)} bytes, shape x dtype needs {nbytes}")
    return payload


def _compression(name: str) -> Codec:
    """A compress.py codec, its PayloadError turned into the transport's BadMessage."""

    def decode(payload: memoryview, nbytes: int) -> Any:
        try:
            return compress.decode(name, payload, nbytes)
        except compress.PayloadError as exc:
            raise BadMessage(str(exc)) from None

    return Codec(encode=lambda data: compress.encode(name, data), decode=decode)


_CODECS: dict[str, Codec] = {"none": Codec(encode=lambda data: data, decode=_decode_none),
                             **{name: _compression(name) for name in compress.CODECS if name != "none"}}


def register_codec(name: str, codec: Codec) -> None:
    """Make `name` usable in tensor messages (both ends must register it; unknown codecs are dropped)."""
    _CODECS[name] = codec


def codec_names() -> tuple[str, ...]:
    return tuple(_CODECS)


# -- tensors --------------------------------------------------------------------------------------------
@dataclass
class TensorMsg:
    req: int
    src: str
    name: str
    array: np.ndarray
    nbytes: int  # bytes on the wire (the payload as sent; array.nbytes is the decoded size)
    sender: str | None = None  # the CURVE public key (z85) the message arrived with, when keys are used
    codec: str = "none"


def contiguous(array: np.ndarray) -> np.ndarray:
    """The array itself when it is C-contiguous, else a C-order copy (only a region along an inner axis
    needs one). Not np.ascontiguousarray: it turns a 0-d array into shape (1,)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def tensor_frames(req: int, src: str, name: str, array: np.ndarray, codec: str = "none", payload: Any = None) -> list:
    """[header, payload] for one tensor. The payload is `array` encoded with `codec`, or `payload` when the
    caller encoded it already (compress.Chooser does, to learn from the result); uncompressed, it is the
    array's own buffer when no copy is needed."""
    arr = contiguous(array)
    dtype = _DTYPE_NAME.get(arr.dtype) or arr.dtype.name
    header = pack({"t": "tensor", "req": req, "src": src, "tensor": name, "dtype": dtype,
                   "shape": list(arr.shape), "codec": codec})
    if payload is None:
        payload = _CODECS[codec].encode(memoryview(arr).cast("B") if arr.size else b"")
    return [header, payload]


def send_tensor(sock: zmq.Socket, req: int, src: str, name: str, array: np.ndarray, codec: str = "none",
                prefix: tuple[bytes, ...] = (), payload: Any = None) -> int:
    """Send one tensor (after `prefix` frames: a ROUTER's peer id); returns the payload bytes sent (the
    bytes on the wire: compressed, when `codec` compresses)."""
    frames = tensor_frames(req, src, name, array, codec, payload)
    send_frames(sock, [*prefix, *frames])
    return len(frames[1])


@dataclass(frozen=True)
class TensorHeader:
    """A tensor message's header, checked: `nbytes` is the array's size once decoded (shape x dtype)."""

    req: int
    src: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    codec: str
    nbytes: int


def tensor_header(header: dict, max_bytes: int | None = None) -> TensorHeader:
    """The checked fields of a tensor header; BadMessage when one is missing or of the wrong type, the dtype
    or codec is unknown, or the array would be larger than `max_bytes`. Nothing is decoded yet, so a
    receiver can refuse a tensor it would not keep before paying for its decompression."""
    req, src, name = header.get("req"), header.get("src"), header.get("tensor")
    dtype, shape, codec = header.get("dtype"), header.get("shape"), header.get("codec")
    if not (_is_int(req) and req >= 0 and isinstance(src, str) and isinstance(name, str)):
        raise BadMessage("tensor header needs req (int >= 0), src and tensor (strings)")
    if not isinstance(dtype, str) or dtype not in DTYPES:  # a list or map is not even hashable
        raise BadMessage(f"tensor {name!r}: unknown dtype {str(dtype)[:40]!r}")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(_is_int(d) and d >= 0 for d in shape)):
        raise BadMessage(f"tensor {name!r}: shape must be a list of at most {MAX_DIMS} integers >= 0")
    if not isinstance(codec, str) or codec not in _CODECS:
        raise BadMessage(f"tensor {name!r}: unknown codec {codec!r}")
    nbytes = math.prod(shape) * _DTYPE[dtype].itemsize
    if max_bytes is not None and nbytes > max_bytes:
        raise BadMessage(f"tensor {name!r}: {nbytes} bytes, more than the {max_bytes} allowed")
    return TensorHeader(req, src, name, dtype, tuple(shape), codec, nbytes)


def decode_tensor(header: dict | TensorHeader, payload: zmq.Frame | None, max_bytes: int | None = None) -> TensorMsg:
    """A tensor message's array (a view of the payload frame when uncompressed); BadMessage when the header
    is not a valid one (`tensor_header`; pass its result to skip checking again), there is no payload, or
    the payload does not decode to exactly shape x dtype bytes. A compressed payload is decoded into a
    buffer of at most that size, so `max_bytes` also bounds what a hostile payload can make us allocate."""
    head = header if isinstance(header, TensorHeader) else tensor_header(header, max_bytes)
    if max_bytes is not None and head.nbytes > max_bytes:
        raise BadMessage(f"tensor {head.name!r}: {head.nbytes} bytes, more than the {max_bytes} allowed")
    if payload is None:
        raise BadMessage(f"tensor {head.name!r}: no payload frame")
    wire = payload.buffer
    data = _CODECS[head.codec].decode(wire, head.nbytes)
    dtype = _DTYPE[head.dtype]
    array = np.frombuffer(data, dtype=dtype).reshape(head.shape) if head.nbytes else np.zeros(head.shape, dtype)
    return TensorMsg(head.req, head.src, head.name, array, len(wire), frame_sender(payload), head.codec)


def frame_sender(frame: zmq.Frame) -> str | None:
    """The CURVE public key (z85) a frame arrived with; None on a socket without keys (asking raises there)."""
    try:
        return frame.get("User-Id") or None
    except zmq.ZMQError:
        return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)

