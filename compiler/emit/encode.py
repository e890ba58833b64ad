"""Fragment encoding: an ONNX model from nodes + weights, checked, encoded without whole-model copies."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..graph import TensorInfo

__all__ = ["EncodedModel", "assemble", "value_info"]

_GRAPH_FIELD = (7 << 3) | 2  # ModelProto.graph, length-delimited
_INITIALIZER_FIELD = (5 << 3) | 2  # GraphProto.initializer, length-delimited


@dataclass(frozen=True, eq=False)
class EncodedModel:
    """A serialised ModelProto as a sequence of byte chunks (their concatenation is the file)."""

    chunks: tuple[bytes, ...]
    sha256: str

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


def value_info(name: str, info: TensorInfo, shape: tuple[int, ...] | None = None) -> onnx.ValueInfoProto:
    dtype = helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
    return helper.make_tensor_value_info(name, dtype, list(shape if shape is not None else info.shape))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def assemble(source: onnx.ModelProto, nodes, inputs, outputs, inits, name: str) -> EncodedModel:
    """Check and encode a fragment of `source` (opsets, IR version and functions come from it).

    Protobuf lets a message's fields arrive in any order and repeated fields in pieces, so the graph's
    structure is serialised once and each weight once, straight from the source's TensorProtos: a 500 MB
    VGG fragment is never copied into a new ModelProto and re-serialised whole.
    """
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs))
    head = onnx.ModelProto()
    head.ir_version = source.ir_version
    head.producer_name = "edgec"
    head.opset_import.extend(source.opset_import)
    head.functions.extend(source.functions)
    _check(head, graph, inits, name)
    weights = []
    for init in inits:
        body = init.SerializeToString()
        weights += [bytes([_INITIALIZER_FIELD]) + _varint(len(body)), body]
    graph_bytes = graph.SerializeToString()
    graph_len = len(graph_bytes) + sum(len(w) for w in weights)
    chunks = (head.SerializeToString(), bytes([_GRAPH_FIELD]) + _varint(graph_len), graph_bytes, *weights)
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return EncodedModel(chunks, h.hexdigest())


def _check(head: onnx.ModelProto, graph: onnx.GraphProto, inits, name: str) -> None:
    """onnx.checker on the structure: weights appear as typed inputs, as in ingest's skeleton."""
    probe = onnx.ModelProto()
    probe.CopyFrom(head)
    probe.graph.CopyFrom(graph)
    probe.graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in inits)
    try:
        onnx.checker.check_model(probe)
    except Exception as exc:  # an emitter bug, not a user error: say which fragment
        raise RuntimeError(f"fragment {name} fails onnx.checker: {exc}") from exc
