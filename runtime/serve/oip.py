"""The Open Inference Protocol (KServe v2) without a transport: tensor datatypes, infer requests and responses
in JSON with the binary tensor data extension, server and model metadata, and which error is which status.

https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/ and Triton's binary data
extension: a JSON header of `Inference-Header-Content-Length` bytes, then each binary tensor's raw bytes
(row-major, little-endian) in the order of the header's tensors that give `binary_data_size`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import InputError
from ..manifest.types import Manifest, TensorSpec

__all__ = ["DATATYPES", "datatype", "BadRequest", "InferRequest", "parse_infer", "decode_tensor", "encode_response",
           "model_metadata", "server_metadata", "body_limit"]

SERVER_NAME = "edgec"
EXTENSIONS = ["binary_tensor_data"]
# The protocol's tensor datatypes and numpy's (BYTES, variable-length strings, is no dtype an edgec model takes).
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64"}
_BY_DTYPE = {v: k for k, v in DATATYPES.items()}
_JSON_BYTES_PER_BYTE = 8  # a float32 as JSON text ("-0.12345678, ") is about 6 bytes per byte of its value


class BadRequest(InputError):
    """A request the protocol calls malformed or invalid: HTTP 400, gRPC INVALID_ARGUMENT."""


class NotFound(InputError):
    """An unknown model: HTTP 404, gRPC NOT_FOUND."""


def datatype(dtype: str | np.dtype) -> str:
    """The protocol's datatype of a manifest dtype (numpy's name, or a numpy dtype)."""
    found = _BY_DTYPE.get(dtype) if isinstance(dtype, str) else None  # the common case, without numpy's lookup
    if found is not None:
        return found
    try:
        return _BY_DTYPE[np.dtype(dtype).name]
    except (KeyError, TypeError):
        raise InputError(f"dtype {dtype}: no Open Inference Protocol datatype") from None


def body_limit(m: Manifest) -> int:
    """The largest request body worth reading: every input as JSON text, with room for the header."""
    return _JSON_BYTES_PER_BYTE * sum(t.nbytes for t in m.inputs) + (1 << 20)


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None  # the outputs asked for, None: all
    binary: dict[str, bool]  # per output asked for: as binary data
    binary_default: bool  # the request's `binary_data_output` parameter


def parse_infer(body: bytes, header_length: int | None, m: Manifest) -> InferRequest:
    """An infer request's inputs checked against the model (names, shapes, datatypes, data lengths). Binary
    tensors are views of `body` (read-only arrays), not copies."""
    if header_length is not None and not 0 < header_length <= len(body):
        raise BadRequest(f"Inference-Header-Content-Length {header_length}: expected 1 to the body's {len(body)} bytes")
    head, rest = (body, memoryview(b"")) if header_length is None else (body[:header_length],
                                                                       memoryview(body)[header_length:])
    try:
        doc = json.loads(head)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise BadRequest("the body must be a JSON object with an \"inputs\" list")
    specs = {t.name: t for t in m.inputs}
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for entry in doc["inputs"]:
        if not isinstance(entry, dict):
            raise BadRequest("each input must be an object with name, shape, datatype and data")
        name = entry.get("name")
        if name not in specs:
            raise BadRequest(f"unknown input {str(name)[:80]!r} (the model's: {', '.join(specs)})")
        if name in inputs:
            raise BadRequest(f"input {name!r} given twice")
        size = _param(entry, "binary_data_size")
        raw = None
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(rest):
                raise BadRequest(f"input {name!r}: binary_data_size {size!r} runs past the body's binary data "
                                 f"({len(rest) - offset} bytes left)")
            raw, offset = rest[offset:offset + size], offset + size
        inputs[name] = decode_tensor(name, entry.get("shape"), entry.get("datatype"), entry.get("data"), raw, specs[name])
    if offset != len(rest):
        raise BadRequest(f"{len(rest) - offset} bytes of binary data that no input claims")
    missing = [n for n in specs if n not in inputs]
    if missing:
        raise BadRequest(f"missing input(s) {', '.join(map(repr, missing))}")
    wanted, binary = _outputs(doc.get("outputs"), m)
    default = _param(doc, "binary_data_output")
    rid = doc.get("id")
    return InferRequest(None if rid is None else str(rid), inputs, wanted, binary, bool(default))


def decode_tensor(name: str, shape: Any, dtype: Any, data: Any, raw: bytes | memoryview | None,
                  spec: TensorSpec) -> np.ndarray:
    """One input tensor from its JSON data or raw bytes, checked against the model's spec."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise BadRequest(f"input {name!r}: shape {shape!r}, expected a list of non-negative integers")
    if tuple(shape) != tuple(spec.shape):
        raise BadRequest(f"input {name!r}: shape {shape}, the model takes {list(spec.shape)}")
    want = datatype(spec.dtype)
    if dtype != want:
        raise BadRequest(f"input {name!r}: datatype {str(dtype)[:20]!r}, the model takes {want}")
    count = math.prod(spec.shape)
    npdtype = np.dtype(spec.dtype).newbyteorder("<")
    if raw is not None:
        if len(raw) != count * npdtype.itemsize:
            raise BadRequest(f"input {name!r}: {len(raw)} bytes of binary data, shape {shape} {dtype} takes "
                             f"{count * npdtype.itemsize}")
        return np.frombuffer(raw, npdtype).astype(spec.dtype, copy=False).reshape(spec.shape)
    if data is None:
        raise BadRequest(f"input {name!r}: no data (give \"data\" or the binary_data_size parameter)")
    try:
        array = np.asarray(data, dtype=spec.dtype if dtype != "BOOL" else bool)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"input {name!r}: data is not {dtype} numbers: {exc}") from None
    if array.size != count:
        raise BadRequest(f"input {name!r}: {array.size} values, shape {shape} takes {count}")
    return array.reshape(spec.shape)


def _param(entry: Mapping, key: str):
    params = entry.get("parameters")
    if params is None:
        return None
    if not isinstance(params, dict):
        raise BadRequest("\"parameters\" must be an object")
    return params.get(key)


def _outputs(requested: Any, m: Manifest) -> tuple[list[str] | None, dict[str, bool]]:
    if requested is None:
        return None, {}
    names = [o.name for o in m.outputs]
    if not isinstance(requested, list):
        raise BadRequest("\"outputs\" must be a list")
    wanted, binary = [], {}
    for entry in requested:
        name = entry.get("name") if isinstance(entry, dict) else None
        if name not in names:
            raise BadRequest(f"unknown output {str(name)[:80]!r} (the model's: {', '.join(names)})")
        wanted.append(name)
        binary[name] = bool(_param(entry, "binary_data"))
    return wanted, binary


def encode_response(model: str, request: InferRequest, outputs: Mapping[str, np.ndarray]) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary data follows it (None: all JSON)."""
    names = request.outputs or list(outputs)
    entries, blobs = [], []
    for name in names:
        array = outputs[name]
        entry = {"name": name, "datatype": datatype(array.dtype.name), "shape": list(array.shape)}
        if request.binary.get(name, request.binary_default):
            blob = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    head = json.dumps(doc, separators=(",", ":")).encode()
    return (head, None) if not blobs else (b"".join([head, *blobs]), len(head))


def server_metadata(version: str) -> dict:
    return {"name": SERVER_NAME, "version": version, "extensions": EXTENSIONS}


def model_metadata(name: str, m: Manifest) -> dict:
    def tensor(t: TensorSpec) -> dict:
        return {"name": t.name, "datatype": datatype(t.dtype), "shape": list(t.shape)}

    return {"name": name, "versions": ["1"], "platform": "edgec", "inputs": [tensor(t) for t in m.inputs],
            "outputs": [tensor(t) for t in m.outputs]}
