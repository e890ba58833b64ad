"""Wire format over pyzmq: a message is a msgpack header frame (a map with a "t" type), optionally
followed by one raw payload frame (a tensor's bytes, a chunk of a fragment file).

A tensor message's header is {"t": "tensor", "req", "src", "tensor", "dtype", "shape", "codec"}; the
payload is the C-order bytes of the array, encoded by `codec` ("none" here; a compression codec plugs in
with `register_codec`). Every received header is decoded with size limits and type-checked before it is
used (protocol.py), and a tensor's payload must hold exactly shape x dtype bytes once decoded.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import msgpack
import numpy as np
import zmq

from .manifest_types import DTYPES

__all__ = ["pack", "unpack", "BadMessage", "TensorMsg", "Codec", "register_codec", "codec_names", "tensor_frames",
           "send_tensor", "decode_tensor", "bind_local", "POLL_MS", "MAX_HEADER_BYTES", "MAX_DIMS"]

logger = logging.getLogger(__name__)

POLL_MS = 500  # how often blocked loops wake up to check on their peers (deadlines, parent alive)
MAX_HEADER_BYTES = 1 << 16  # a header is a few hundred bytes; only a session's "open" carries more (its own limit)
MAX_DIMS = 32  # onnxruntime's own limit on tensor rank is far below what anyone uses


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


_CODECS: dict[str, Codec] = {"none": Codec(encode=lambda data: data, decode=_decode_none)}


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
    nbytes: int  # bytes on the wire (the payload as sent)
    sender: str | None = None  # the CURVE public key (z85) the message arrived with, when keys are used


def tensor_frames(req: int, src: str, name: str, array: np.ndarray, codec: str = "none") -> list:
    """[header, payload] for one tensor; the payload is the array's own buffer when no copy is needed."""
    # Only a non-contiguous view (a region along an inner axis) needs a copy here. (Not
    # np.ascontiguousarray: it turns a 0-d array into shape (1,).)
    arr = array if array.flags.c_contiguous else array.copy(order="C")
    header = pack({"t": "tensor", "req": req, "src": src, "tensor": name, "dtype": arr.dtype.name,
                   "shape": list(arr.shape), "codec": codec})
    payload = _CODECS[codec].encode(memoryview(arr).cast("B") if arr.size else b"")
    return [header, payload]


def send_tensor(sock: zmq.Socket, req: int, src: str, name: str, array: np.ndarray, codec: str = "none",
                prefix: tuple[bytes, ...] = ()) -> int:
    """Send one tensor (after `prefix` frames: a ROUTER's peer id); returns the payload bytes sent."""
    frames = tensor_frames(req, src, name, array, codec)
    sock.send_multipart([*prefix, *frames], copy=False)
    return len(frames[1])


def decode_tensor(header: dict, payload: zmq.Frame | None, max_bytes: int | None = None) -> TensorMsg:
    """A tensor message's array (a view of the payload frame when uncompressed); BadMessage when the header's
    fields are missing or of the wrong type, the dtype or codec is unknown, the sizes disagree, or the
    array would be larger than `max_bytes`."""
    req, src, name = header.get("req"), header.get("src"), header.get("tensor")
    dtype, shape, codec = header.get("dtype"), header.get("shape"), header.get("codec")
    if not (_is_int(req) and req >= 0 and isinstance(src, str) and isinstance(name, str)):
        raise BadMessage("tensor header needs req (int >= 0), src and tensor (strings)")
    if dtype not in DTYPES:
        raise BadMessage(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(_is_int(d) and d >= 0 for d in shape)):
        raise BadMessage(f"tensor {name!r}: shape must be a list of at most {MAX_DIMS} integers >= 0")
    if not isinstance(codec, str) or codec not in _CODECS:
        raise BadMessage(f"tensor {name!r}: unknown codec {codec!r}")
    if payload is None:
        raise BadMessage(f"tensor {name!r}: no payload frame")
    itemsize = np.dtype(dtype).itemsize
    nbytes = math.prod(shape) * itemsize
    if max_bytes is not None and nbytes > max_bytes:
        raise BadMessage(f"tensor {name!r}: {nbytes} bytes, more than the {max_bytes} allowed")
    wire = payload.buffer
    data = _CODECS[codec].decode(wire, nbytes)
    array = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape) if nbytes else np.zeros(shape, dtype)
    sender = payload.get("User-Id") if _has_user_id(payload) else None
    return TensorMsg(req, src, name, array, len(wire), sender or None)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _has_user_id(frame: zmq.Frame) -> bool:
    """A frame received on a CURVE socket carries the ZAP User-Id; on a plain socket asking raises."""
    try:
        return bool(frame.get("User-Id"))
    except zmq.ZMQError:
        return False
