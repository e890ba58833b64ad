"""Read an ONNX file and refuse what edgec cannot compile: undecodable text, operators onnxruntime cannot run,
corrupt tensors, repeated node names, nodes out of order or on a cycle, and what onnx's checker rejects."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import onnx
from google.protobuf.message import Message
from onnx import TensorProto, helper

from ..errors import UserError
from ..layers import np_dtype
from .protos import message, skeleton

__all__ = ["read_model"]


def read_model(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise UserError("no such ONNX file", str(path))
    try:
        model = onnx.load(str(path), load_external_data=True)
    except Exception as exc:  # protobuf DecodeError, missing external data, ...
        raise UserError(f"not a readable ONNX model ({message(exc)})", str(path)) from None
    if not model.graph.node:
        raise UserError("not an ONNX model with a graph (no nodes)", str(path))
    _check_text(model, path)
    _check_operators(model, path)
    _check_tensors(model, path)
    _check_node_names(model.graph, path)
    _check_order(model.graph, path)
    try:
        onnx.checker.check_model(skeleton(model), full_check=False)
    except Exception as exc:
        raise UserError(f"invalid ONNX model: {message(exc)}", str(path)) from None
    return model


def _check_text(model: onnx.ModelProto, path: Path) -> None:
    where = _undecodable_text(model, "model")
    if where:
        raise UserError(f"corrupt model: {where} is not valid UTF-8 text", str(path))


# bytes fields that ONNX defines as UTF-8 text (string attributes, string tensors); raw_data is not text
TEXT_BYTES = {"s", "strings", "string_data"}


def _undecodable_text(msg: Message, where: str) -> str | None:
    """The field path of the first string in `msg` that is not UTF-8. Protobuf parses ONNX's (proto2) strings
    without checking them: such a string reads back as bytes (upb) and breaks whatever uses it later."""
    for name, is_message in _text_fields(msg.DESCRIPTOR):
        value = getattr(msg, name)
        if not is_message:
            if not _is_text(value):
                return f"{where}.{name}"
            continue
        if isinstance(value, Message):  # singular: only if set (TypeProto nests itself without end)
            children = [(f"{where}.{name}", value)] if msg.HasField(name) else []
        else:
            children = [(f"{where}.{name}[{i}]", v) for i, v in enumerate(value)]
        for label, child in children:
            bad = _undecodable_text(child, label)
            if bad:
                return bad
    return None


@functools.lru_cache(maxsize=None)
def _text_fields(descriptor) -> tuple[tuple[str, bool], ...]:
    """(name, is a message) of the fields that hold text or may contain some."""
    return tuple((fd.name, fd.type == fd.TYPE_MESSAGE) for fd in descriptor.fields
                 if fd.type in (fd.TYPE_STRING, fd.TYPE_MESSAGE) or (fd.type == fd.TYPE_BYTES and fd.name in TEXT_BYTES))


def _is_text(value) -> bool:
    try:
        for item in [value] if isinstance(value, (str, bytes)) else value:
            if isinstance(item, bytes):
                item.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# Domains whose operators onnx.defs defines ("ai.onnx" is the default domain's other name).
STANDARD_DOMAINS = {"": "", "ai.onnx": "", "ai.onnx.ml": "ai.onnx.ml"}
CONTRIB_DOMAIN = "com.microsoft"


def _check_operators(model: onnx.ModelProto, path: Path) -> None:
    """Reject operators onnxruntime cannot run, before any work is done: without this a custom op compiles
    and fails only when a device loads its fragment."""
    functions = {(f.domain, f.name) for f in model.functions}
    scopes = [(model.opset_import, model.graph.node)] + [(f.opset_import or model.opset_import, f.node) for f in model.functions]
    for opset_import, nodes in scopes:
        opsets = _opsets(opset_import, path)
        for node in _with_subgraph_nodes(nodes):
            problem = _unrunnable(node, opsets, functions)
            if problem:
                raise UserError(f"node {node.name or node.op_type!r}: {problem}", str(path))


def _opsets(opset_import, path: Path) -> dict[str, int]:
    newest = {"": onnx.defs.onnx_opset_version(), "ai.onnx.ml": onnx.defs.onnx_ml_opset_version()}
    opsets = {}
    for o in opset_import:
        domain = STANDARD_DOMAINS.get(o.domain, o.domain)
        if domain in newest and not 1 <= o.version <= newest[domain]:
            raise UserError(f"the model imports opset {o.version} of domain {o.domain!r}, which does not exist "
                            f"(onnx {onnx.__version__} knows 1 to {newest[domain]})", str(path))
        opsets[domain] = o.version
    return opsets


def _with_subgraph_nodes(nodes):
    for node in nodes:
        yield node
        for a in node.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                yield from _with_subgraph_nodes(g.node)


def _unrunnable(node: onnx.NodeProto, opsets: dict[str, int], functions: set[tuple[str, str]]) -> str | None:
    op, domain = node.op_type, node.domain
    if (domain, op) in functions:
        return None
    what = f"operator {op!r} of domain {domain!r}"
    if domain in STANDARD_DOMAINS:
        version = opsets.get(STANDARD_DOMAINS[domain])
        if version is None:
            return f"{what}: the model imports no opset for this domain"
        try:
            onnx.defs.get_schema(op, version, STANDARD_DOMAINS[domain])
        except onnx.defs.SchemaError:
            return f"{what} does not exist in opset {version}"
        return None
    if domain == CONTRIB_DOMAIN:
        known = _contrib_cpu_ops()
        return None if known is None or op in known else f"{what} is not an onnxruntime contrib operator with a CPU kernel"
    return f"{what} is not an operator onnxruntime can run (a custom domain, and not a function of the model)"


@functools.lru_cache(maxsize=1)
def _contrib_cpu_ops() -> frozenset[str] | None:
    """com.microsoft operators with a CPU kernel in this onnxruntime; None if it does not list its kernels
    (then emit's load check of each fragment is what rejects an unknown one)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    kernels = getattr(ort_state, "get_all_opkernel_def", None)
    if kernels is None:
        return None
    return frozenset(k.op_name for k in kernels() if k.domain == CONTRIB_DOMAIN and k.provider == "CPUExecutionProvider")


# Element types packed below a byte (raw_data holds ceil(n * bits / 8) bytes); absent in older onnx releases.
PACKED_BITS = {getattr(TensorProto, name): bits for name, bits in
               (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2), ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6))
               if hasattr(TensorProto, name)}
# Packed types whose typed field (int32_data) holds one element per entry, as onnx.numpy_helper reads them.
UNPACKED_FIELD = {getattr(TensorProto, name) for name in ("FLOAT6E2M3", "FLOAT6E3M2") if hasattr(TensorProto, name)}


def _check_tensors(model: onnx.ModelProto, path: Path) -> None:
    """Element types and initializer sizes. The checker sees only the skeleton, so large weights are checked
    here: a corrupt dimension would otherwise be priced, planned and emitted, and fail on the device."""
    g = model.graph
    for role, vis in (("input", g.input), ("output", g.output)):  # the runtime feeds and returns numpy arrays
        for vi in vis:
            if not vi.type.HasField("tensor_type"):
                kind = vi.type.WhichOneof("value") or "no type"
                raise UserError(f"graph {role} {vi.name!r} is not a tensor ({kind}): "
                                "edgec runs models whose inputs and outputs are tensors", str(path))
    for vi in [*g.input, *g.output, *g.value_info]:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.elem_type != TensorProto.UNDEFINED and np_dtype(tt.elem_type) is None:
            raise UserError(f"tensor {vi.name!r} has an unknown element type {tt.elem_type}", str(path))
    for label, tensor in _stored_tensors(g.initializer, [g.node, *(f.node for f in model.functions)]):
        problem = _initializer_problem(tensor)
        if problem:
            raise UserError(f"{label}: {problem}", str(path))


def _stored_tensors(initializers, node_lists):
    """Every tensor the file stores: initializers, and Constant values and other tensor attributes of the
    nodes, subgraphs included."""
    for init in initializers:
        yield f"initializer {init.name!r}", init
    for nodes in node_lists:
        for node in nodes:
            for a in node.attribute:
                for t in ([a.t] if a.HasField("t") else []) + list(a.tensors):
                    yield f"node {node.name or node.op_type!r}, attribute {a.name!r}", t
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    yield from _stored_tensors(sub.initializer, [sub.node])


def _initializer_problem(t: onnx.TensorProto) -> str | None:
    dtype = np_dtype(t.data_type)
    if dtype is None:
        return f"unknown element type {t.data_type}"
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        return f"negative dimension in {dims}"
    n = math.prod(dims)
    if t.HasField("raw_data"):
        if t.data_type == TensorProto.STRING:
            return "strings stored as raw bytes"
        bits = PACKED_BITS.get(t.data_type)
        have, want, unit = len(t.raw_data), -(-n * bits // 8) if bits else n * dtype.itemsize, "bytes"
    else:
        field = helper.tensor_dtype_to_field(t.data_type)
        have, want, unit = len(getattr(t, field)), _typed_count(n, t.data_type), f"{field} values"
    if have != want:
        return f"holds {have} {unit}, but its dims {dims} of {dtype.name} need {want}"
    return None


def _typed_count(n: int, data_type: int) -> int:
    if data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        return 2 * n
    bits = PACKED_BITS.get(data_type)
    return -(-n * bits // 8) if bits and data_type not in UNPACKED_FIELD else n



def _check_node_names(graph: onnx.GraphProto, path: Path) -> None:
    """Two nodes of one graph with the same name: onnxruntime refuses the model (so `run --verify` could not
    load it), so the compile does too. Unnamed nodes are named later (node_keys)."""
    seen: set[str] = set()
    for node in graph.node:
        if node.name and node.name in seen:
            raise UserError(f"two nodes are named {node.name!r}; onnxruntime refuses a model whose node names "
                            "repeat: rename one", str(path))
        seen.add(node.name)


def _check_order(graph: onnx.GraphProto, path: Path) -> None:
    """Every node reads only tensors produced before it (inputs, initializers, earlier nodes). Otherwise the
    graph has a cycle or is out of order: either is refused naming the node(s), which onnx's checker puts
    on a line of its own."""
    producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    for k, node in enumerate(graph.node):
        later = next((t for t in node.input if producer.get(t, -1) >= k), None)
        if later is None:
            continue
        cycle = _cycle_nodes(graph, producer)
        if cycle:
            names = ", ".join(repr(graph.node[i].name or graph.node[i].op_type) for i in cycle[:6])
            more = f" and {len(cycle) - 6} more" if len(cycle) > 6 else ""
            raise UserError(f"the graph has a cycle through node(s) {names}{more}", str(path))
        by = graph.node[producer[later]]
        raise UserError(f"node {node.name or node.op_type!r} reads {later!r} before node {by.name or by.op_type!r} "
                        "produces it: the nodes are not in topological order", str(path))


def _cycle_nodes(graph: onnx.GraphProto, producer: dict[str, int]) -> list[int]:
    """Indices of the nodes on a cycle, in file order (empty if the graph is acyclic): what is left after
    repeatedly removing nodes whose inputs all come from outside or from removed nodes (Kahn), and then
    nodes that only read from a cycle."""
    deps = [{producer[t] for t in n.input if t in producer} for n in graph.node]
    readers: dict[int, list[int]] = {}
    for k, d in enumerate(deps):
        for j in d:
            readers.setdefault(j, []).append(k)
    left = [len(d) for d in deps]
    ready = [k for k, n in enumerate(left) if n == 0]
    done = set(ready)
    while ready:
        j = ready.pop()
        for k in readers.get(j, ()):
            left[k] -= 1
            if left[k] == 0 and k not in done:
                done.add(k)
                ready.append(k)
    left_over = {k for k in range(len(deps)) if k not in done}
    while True:  # then drop what only hangs below a cycle: nodes no remaining node reads
        tails = {k for k in left_over if not any(r in left_over for r in readers.get(k, ()))}
        if not tails:
            return sorted(left_over)
        left_over -= tails

