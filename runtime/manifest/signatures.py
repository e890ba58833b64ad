"""The manifest's tensors checked against its fragments' own ONNX signatures, before a run starts.

A fragment's graph inputs and outputs (name, element type, shape) are read straight from the ONNX file's
protobuf wire format: the few fields of ModelProto.graph.{input,output} are decoded and everything else
(nodes, initializers: the bulk of the file) is skipped by seeking, so the check costs milliseconds even for
ResNet-50's fragments and needs neither the `onnx` package (not a dependency of the device-only
distribution) nor an onnxruntime session (which would load every weight).

`check_signatures` then walks every device's steps as the worker will, with each tensor's shape and dtype:
a model input as the manifest declares it, a fragment's outputs as its graph declares them, a received
tensor as its sender sent it, a region, slice or concat as it cuts or joins; and checks each fragment's
inputs against its graph, each model output against the manifest, and each transfer entry against the
send it describes. A dimension the graph leaves symbolic matches any size.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import InputError
from .types import HOST, Concat, Free, Fragment, Manifest, Recv, Regions, Run, Send, Slice, region_ranges

__all__ = ["Spec", "Signature", "read_signature", "check_signatures"]

logger = logging.getLogger(__name__)

Dims = tuple  # of int (a fixed size) or None (symbolic); None for the whole shape: the rank is unknown


class Spec:
    """A tensor's dtype (a numpy name, or "onnx type N" for a type the runtime has no name for) and shape."""

    __slots__ = ("dtype", "shape")

    def __init__(self, dtype: str | None, shape: Dims | None):
        self.dtype, self.shape = dtype, shape

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"
        return f"{dims} {self.dtype or '?'}"

    def matches(self, other: "Spec") -> bool:
        if self.dtype is not None and other.dtype is not None and self.dtype != other.dtype:
            return False
        if self.shape is None or other.shape is None:
            return True
        return len(self.shape) == len(other.shape) and all(
            a is None or b is None or a == b for a, b in zip(self.shape, other.shape))


class Signature:
    """A fragment graph's inputs and outputs: {name: Spec}, each in graph order."""

    def __init__(self, inputs: dict[str, Spec], outputs: dict[str, Spec]):
        self.inputs, self.outputs = inputs, outputs


# ONNX TensorProto.DataType -> numpy name, for the dtypes a manifest may name
_ELEM = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
         10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}
# field numbers: ModelProto.graph, GraphProto.input/output, ValueInfoProto.name/type, TypeProto.tensor_type,
# TypeProto.Tensor.elem_type/shape, TensorShapeProto.dim, Dimension.dim_value
_GRAPH, _INPUT, _OUTPUT, _NAME, _TYPE, _TENSOR, _ELEM_TYPE, _SHAPE, _DIM, _DIM_VALUE = 7, 11, 12, 1, 2, 1, 1, 2, 1, 1
_MAX_VALUE_INFO = 1 << 20  # a name and a shape: kilobytes; more is not a ValueInfoProto worth reading


class _Malformed(Exception):
    pass


def read_signature(path: Path) -> Signature:
    """The graph inputs and outputs of the ONNX file at `path` (InputError if it is not one)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            graph = None
            for field, wire, length in _fields(fh, size):
                if field == _GRAPH and wire == 2:
                    graph = (fh.tell(), length)
                _skip(fh, wire, length)
            if graph is None:
                raise _Malformed("no graph")
            fh.seek(graph[0])
            inputs: dict[str, Spec] = {}
            outputs: dict[str, Spec] = {}
            for field, wire, length in _fields(fh, graph[0] + graph[1]):
                if field in (_INPUT, _OUTPUT) and wire == 2:
                    if length > _MAX_VALUE_INFO:
                        raise _Malformed("a graph input or output of more than a MiB")
                    name, spec = _value_info(fh.read(length))
                    (inputs if field == _INPUT else outputs)[name] = spec
                else:
                    _skip(fh, wire, length)
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except (_Malformed, IndexError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not an ONNX model ({exc or 'truncated'})") from None
    return Signature(inputs, outputs)


def _fields(fh: BinaryIO, end: int):
    """(field number, wire type, length or None) of each field up to offset `end`, the file positioned at
    its value; the caller reads or skips it."""
    while fh.tell() < end:
        key = _varint_from(fh)
        field, wire = key >> 3, key & 7
        length = _varint_from(fh) if wire == 2 else None
        if field == 0 or wire not in (0, 1, 2, 5) or (length is not None and fh.tell() + length > end):
            raise _Malformed(f"bad protobuf field at byte {fh.tell()}")
        yield field, wire, length
    if fh.tell() != end:
        raise _Malformed("a field runs past its message")


def _skip(fh: BinaryIO, wire: int, length: int | None) -> None:
    if wire == 0:
        _varint_from(fh)
    else:
        fh.seek({1: 8, 5: 4}.get(wire, length), 1)


def _varint_from(fh: BinaryIO) -> int:
    value = shift = 0
    while True:
        b = fh.read(1)
        if not b:
            raise _Malformed("truncated")
        value |= (b[0] & 0x7F) << shift
        if b[0] < 0x80:
            return value
        shift += 7
        if shift > 63:
            raise _Malformed("varint too long")


def _message(buf: bytes):
    """(field, wire, value) of each field of a message held in memory: an int for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, pos = buf[pos:pos + n], pos + n
        else:
            raise _Malformed(f"wire type {wire}")
        if pos > len(buf):
            raise _Malformed("truncated")
        yield field, wire, value


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise _Malformed("varint too long")


def _value_info(buf: bytes) -> tuple[str, Spec]:
    name, spec = "", Spec(None, None)  # a type other than a tensor (sequence, map): nothing to compare
    for field, wire, value in _message(buf):
        if field == _NAME and wire == 2:
            name = value.decode("utf-8")
        elif field == _TYPE and wire == 2:
            for f, w, tensor in _message(value):
                if f == _TENSOR and w == 2:
                    spec = _tensor_type(tensor)
    return name, spec


def _tensor_type(buf: bytes) -> Spec:
    dtype, shape = None, None
    for field, wire, value in _message(buf):
        if field == _ELEM_TYPE and wire == 0:
            dtype = _ELEM.get(value, f"onnx type {value}") if value else None
        elif field == _SHAPE and wire == 2:
            shape = tuple(_dim(v) for f, w, v in _message(value) if f == _DIM and w == 2)
    return Spec(dtype, shape)


def _dim(buf: bytes) -> int | None:
    for field, wire, value in _message(buf):
        if field == _DIM_VALUE and wire == 0:
            return value - (1 << 64) if value >= 1 << 63 else value
    return None  # a dim_param (symbolic) or nothing


# -- the check --------------------------------------------------------------------------------------------
def check_signatures(m: Manifest, signatures: dict[str, Signature] | None = None) -> None:
    """InputError "<manifest>: <tensor>: ..." (one line) on the first tensor whose shape or dtype in the
    manifest disagrees with a fragment's graph (read from the build folder unless `signatures` gives them
    by fragment id), with the other end of a transfer, or with a region, slice or concat. The schedule
    must have been validated (parse_manifest): every name is there when a step needs it, no deadlock."""
    if signatures is None:
        signatures = {f.id: read_signature(m.fragment_path(f)) for f in m.fragments.values()}
    _Walk(m, signatures).run()


class _Walk:
    """Every device's steps in an order the schedule allows (sends before their recvs), tracking specs."""

    def __init__(self, m: Manifest, signatures: dict[str, Signature]):
        self.m, self.sigs = m, signatures
        self.inputs = {t.name: Spec(t.dtype, t.shape) for t in m.inputs}
        self.outputs = {o.name: Spec(o.dtype, o.shape) for o in m.outputs}
        self.stores: dict[str, dict[str, Spec]] = {d: {} for d in m.steps}
        self.delivered: dict[tuple[str, str, str], Spec] = {}  # (src, dst, name as received) -> what was sent
        self.sent: dict[tuple[str, str, str, Regions | None], Spec] = {}  # (src, dst, tensor, region) -> same
        self.device = ""

    def fail(self, problem: str):
        raise InputError(f"{self.m.path}: {problem}")

    def run(self) -> None:
        pc = dict.fromkeys(self.m.steps, 0)
        moved = True
        while moved:
            moved = False
            for device, steps in self.m.steps.items():
                self.device = device
                while pc[device] < len(steps):
                    step = steps[pc[device]]
                    if isinstance(step, Recv) and step.src != HOST and \
                            (step.src, device, step.tensor) not in self.delivered:
                        break
                    self._step(step)
                    pc[device] += 1
                    moved = True
        self._check_transfers()

    def _step(self, step) -> None:
        store = self.stores[self.device]
        if isinstance(step, Recv):
            store[step.tensor] = self.inputs[step.tensor] if step.src == HOST else \
                self.delivered[(step.src, self.device, step.tensor)]
        elif isinstance(step, Run):
            self._run(self.m.fragments[step.fragment], store)
        elif isinstance(step, Send):
            self._send(step, store)
        elif isinstance(step, Slice):
            store[step.as_name] = self._cut(store[step.tensor], ((step.axis, step.start, step.stop),),
                                            f"slice of {step.tensor!r} on {self.device}")
        elif isinstance(step, Concat):
            store[step.as_name] = self._concat(step, [store[p] for p in step.parts])
        elif isinstance(step, Free):
            for name in step.tensors:
                store.pop(name, None)

    def _run(self, frag: Fragment, store: dict[str, Spec]) -> None:
        sig, where = self.sigs[frag.id], f"fragment {frag.id} ({frag.file})"
        for st in frag.state:  # a generative build's state, which the device keeps: any length along its axis
            store[st.input] = Spec(st.dtype, tuple(None if i == st.axis else d for i, d in enumerate(st.shape)))
        for name in frag.inputs:
            want = sig.inputs.get(name)
            if want is None:
                self.fail(f"{where}: input {name!r} is not an input of its graph (graph inputs: "
                          f"{', '.join(sig.inputs) or 'none'})")
            have = store[name]
            if not have.matches(want):
                self.fail(f"tensor {name!r}: {self._origin(name)} {have}, but {where} reads it as {want}")
        for name in frag.outputs:
            made = sig.outputs.get(name)
            if made is None:
                self.fail(f"{where}: output {name!r} is not an output of its graph (graph outputs: "
                          f"{', '.join(sig.outputs) or 'none'})")
            store[name] = made

    def _origin(self, name: str) -> str:
        """How a tensor reached the store, for a message: the manifest's own figure is the likelier edit."""
        declared = self.inputs.get(name)
        if declared is not None and self.stores[self.device].get(name) is declared:
            return "the manifest declares model input"
        return f"device {self.device} holds"

    def _send(self, step: Send, store: dict[str, Spec]) -> None:
        spec = store[step.tensor]
        if step.region is not None:
            spec = self._cut(spec, [(r.axis, r.start, r.stop) for r in region_ranges(step.region)],
                             f"send of {step.tensor!r} from {self.device} to {step.to}")
        if step.to == HOST:
            declared = self.outputs[step.name]
            if not spec.matches(declared):
                self.fail(f"output {step.name!r}: the manifest declares {declared}, but device {self.device} "
                          f"sends {spec}")
            return
        self.delivered[(self.device, step.to, step.name)] = spec
        self.sent[(self.device, step.to, step.tensor, step.region)] = spec

    def _cut(self, spec: Spec, ranges, what: str) -> Spec:
        if spec.shape is None:
            return spec
        dims = list(spec.shape)
        for axis, start, stop in ranges:
            if not -len(dims) <= axis < len(dims):
                self.fail(f"{what}: axis {axis} of a tensor of {len(dims)} dimensions ({spec})")
            if dims[axis] is not None and stop > dims[axis]:
                self.fail(f"{what}: [{start}, {stop}) on axis {axis} runs past its size {dims[axis]} ({spec})")
            dims[axis] = stop - start
        return Spec(spec.dtype, tuple(dims))

    def _concat(self, step: Concat, parts: list[Spec]) -> Spec:
        what = f"concat of {list(step.parts)} as {step.as_name!r} on {self.device}"
        dtypes = {p.dtype for p in parts if p.dtype is not None}
        if len(dtypes) > 1:
            self.fail(f"{what}: parts of different dtypes ({', '.join(str(p) for p in parts)})")
        dtype = next(iter(dtypes), None)
        if any(p.shape is None for p in parts):
            return Spec(dtype, None)
        ranks = {len(p.shape) for p in parts}
        if len(ranks) > 1 or not -min(ranks) <= step.axis < min(ranks):
            self.fail(f"{what}: axis {step.axis} of parts {', '.join(str(p) for p in parts)}")
        axis = step.axis % min(ranks)
        dims = []
        for i, sizes in enumerate(zip(*(p.shape for p in parts))):
            if i == axis:
                dims.append(None if None in sizes else sum(sizes))
                continue
            fixed = {s for s in sizes if s is not None}
            if len(fixed) > 1:
                self.fail(f"{what}: parts differ on axis {i} ({', '.join(str(p) for p in parts)})")
            dims.append(next(iter(fixed), None))
        return Spec(dtype, tuple(dims))

    def _check_transfers(self) -> None:
        """Each transfer entry describes a device-to-device send: the tensor on the sender (cut to the region)
        that the receiver's steps then read."""
        for i, tr in enumerate(self.m.transfers):
            where = f"transfers[{i}] ({tr.tensor!r} from {tr.src} to {tr.dst})"
            spec = self.sent.get((tr.src, tr.dst, tr.tensor, tr.region))
            if spec is None:
                self.fail(f"{where}: no step sends {tr.tensor!r} from {tr.src} to {tr.dst}"
                          + (" with this region" if any(k[:3] == (tr.src, tr.dst, tr.tensor) for k in self.sent)
                             else ""))
            declared = Spec(tr.dtype, tr.shape)
            if not declared.matches(spec):
                self.fail(f"{where}: the manifest says {declared}, but {tr.src} sends {spec}")
            nbytes = int(np.prod(tr.shape, dtype=object)) * np.dtype(tr.dtype).itemsize
            if tr.bytes != nbytes:
                self.fail(f"{where}: bytes {tr.bytes}, but {declared} is {nbytes} bytes")
