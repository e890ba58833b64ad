"""Ingest: load an ONNX file, normalise it, pin and infer static shapes, and build its LayerGraph."""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import TensorProto, helper, numpy_helper, shape_inference

from edgec.runtime.errors import one_line
from edgec.runtime.manifest import file_sha256  # the runtime owns the hashes it checks
from edgec.runtime.profile.nodes import node_keys  # the keys of the device's measured per-node tables

from .errors import UserError
from .graph import LayerGraph
from .layers import build_layer_graph, node_inputs, np_dtype

__all__ = ["Ingested", "load_model", "parse_shape_option", "file_sha256", "skeleton", "node_keys"]

logger = logging.getLogger(__name__)

MIN_OPSET = 7  # older models are converted up to CONVERT_TO
CONVERT_TO = 13


@dataclass(frozen=True, eq=False)
class Ingested:
    """The normalised model (static shapes, unique node names) and its layer graph."""

    path: Path
    sha256: str
    model: onnx.ModelProto
    graph: LayerGraph


def parse_shape_option(items: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """`NAME=D0,D1,...` strings -> {name: dims}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        try:
            parsed = tuple(int(d) for d in dims.split(","))
        except ValueError:
            parsed = ()
        if not sep or not name or not parsed or any(d <= 0 for d in parsed):
            raise UserError(f"--shape {item!r}: expected NAME=D0,D1,... with positive integers")
        shapes[name] = parsed
    return shapes


def load_model(path: str | Path, shapes: dict[str, tuple[int, ...]] | None = None) -> Ingested:
    """Load, check, normalise and shape an ONNX model; build its layer graph."""
    path = Path(path)
    model = _read(path)
    model = _normalise(model, path)
    model = _pin_shapes(model, shapes or {}, path)
    model = _infer_shapes(model, path)
    graph = build_layer_graph(model)
    if not graph.layers:
        raise UserError("the model has no operators to run", str(path))
    return Ingested(path=path, sha256=file_sha256(path), model=model, graph=graph)


def _read(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise UserError("no such ONNX file", str(path))
    try:
        model = onnx.load(str(path), load_external_data=True)
    except Exception as exc:  # protobuf DecodeError, missing external data, ...
        raise UserError(f"not a readable ONNX model ({_message(exc)})", str(path)) from None
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
        raise UserError(f"invalid ONNX model: {_message(exc)}", str(path)) from None
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


SKELETON_MAX_ELEMENTS = 4096  # initializers up to this size stay (shape tensors feed data propagation)


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its large weights: each becomes a typed graph input of the same shape.

    The checker and shape inference serialise the whole model; on the skeleton they see the same structure
    and types at a fraction of the cost (_read has checked the weights' sizes and types).
    """
    g = model.graph
    sk = onnx.ModelProto()
    sk.ir_version = max(model.ir_version, 4)
    sk.opset_import.extend(model.opset_import)
    sk.functions.extend(model.functions)
    sg = sk.graph
    sg.name = g.name or "graph"
    sg.node.extend(g.node)
    sg.input.extend(g.input)
    sg.output.extend(g.output)
    sg.value_info.extend(g.value_info)
    listed = {i.name for i in g.input}  # old models also list initializers as inputs
    for init in g.initializer:
        if math.prod(init.dims) <= SKELETON_MAX_ELEMENTS:
            sg.initializer.append(init)
        elif init.name not in listed:
            sg.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return sk


def _message(exc: Exception) -> str:
    """The exception's message as one line: onnx's checker puts what it names (a node, a tensor) on the
    lines after the first, so they are joined, not dropped."""
    return one_line(exc) or type(exc).__name__


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


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), CONVERT_TO)


def _normalise(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """Fold constant subgraphs into initializers, drop Identity chains and initializer-inputs, name nodes."""
    if _opset(model) < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, CONVERT_TO)
        except Exception as exc:
            raise UserError(f"cannot convert opset {_opset(model)} to {CONVERT_TO}: {_message(exc)}", str(path)) from None
    out = model  # normalised in place: the caller's proto is ours
    _name_nodes(out)  # before folding, so names follow the file's node indices
    _fold_constants(out, path)
    out.ir_version = max(out.ir_version, 4)  # IR 3 needs initializers listed as inputs; we list none
    _drop_identities(out.graph)
    _constant_outputs_as_identities(out.graph)
    return out


# Operators whose output is not a function of their inputs: never fold.
NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


# A folded tensor may be as large as the model's largest weight (a transposed weight) or this; a larger
# one (an Expand or ConstantOfShape of a huge shape) stays an operator instead of bloating the fragments
# and, at worst, exhausting memory while it is evaluated.
FOLD_MIN_LIMIT_BYTES = 64 << 20


def _fold_constants(model: onnx.ModelProto, path: Path) -> None:
    """Evaluate every node whose inputs are all constants (Constant, ConstantOfShape, Unsqueeze of a weight,
    Identity of a weight, ...) into initializers; drop nodes nothing reads, initializers listed as graph
    inputs and unused initializers. Node order and names are kept.

    graphsurgeon works on the model without the weights no foldable node reads (exporting the full graph
    would copy every weight: seconds for VGG); the result is spliced back into `model`."""
    light = _foldable_part(model)
    limit = max([FOLD_MIN_LIMIT_BYTES, *(_nbytes(i.dims, i.data_type) for i in model.graph.initializer)])
    sizes = _output_nbytes(light, path)

    def never(node) -> bool:  # a graphsurgeon Node; an output of unknown size is not evaluated
        return node.op in NOT_FOLDABLE or any(o.name and sizes.get(o.name, limit + 1) > limit for o in node.outputs)

    _splice(model, _fold_with_graphsurgeon(light, never, path))


def _nbytes(dims, elem_type: int) -> int | None:
    dtype = np_dtype(elem_type)
    return None if dtype is None else math.prod(dims) * dtype.itemsize


def _output_nbytes(light: onnx.ModelProto, path: Path) -> dict[str, int]:
    """Bytes of every tensor whose shape and type inference can tell before anything is evaluated."""
    try:
        shaped = shape_inference.infer_shapes(light, data_prop=True)
    except Exception as exc:  # onnx's inference errors (malformed attributes, ...) have no common type
        raise UserError(f"shape inference failed: {_message(exc)}", str(path)) from None
    sizes = {}
    for vi in shaped.graph.value_info:
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") and d.dim_value >= 0 for d in tt.shape.dim):
            n = _nbytes([d.dim_value for d in tt.shape.dim], tt.elem_type)
            if n is not None:
                sizes[vi.name] = n
    return sizes


def _foldable_part(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with only the initializers foldable nodes read. The others' names dangle, which leaves
    their readers unfoldable as they are anyway; neither stand-in inputs (graphsurgeon's cleanup is
    quadratic in the inputs) nor value_info (onnxruntime infers what folding needs) are given."""
    g = model.graph
    needed = _read_by_foldable_nodes(g)
    inits = {i.name for i in g.initializer}
    light = onnx.ModelProto()
    light.ir_version = max(model.ir_version, 4)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    light.graph.name = g.name or "graph"
    light.graph.node.extend(g.node)
    light.graph.input.extend(i for i in g.input if i.name not in inits)
    light.graph.output.extend(g.output)
    light.graph.initializer.extend(i for i in g.initializer if i.name in needed)
    return light


def _read_by_foldable_nodes(g: onnx.GraphProto) -> set[str]:
    """Initializers that some node computable from constants alone reads (graphsurgeon needs their values)."""
    inits = {i.name for i in g.initializer}
    constant, needed = set(inits), set()
    for node in g.node:  # topological order: a folded output is known before its readers
        ins = node_inputs(node)
        if node.op_type not in NOT_FOLDABLE and all(i in constant for i in ins):
            needed.update(i for i in ins if i in inits)
            constant.update(o for o in node.output if o)
    return needed


def _fold_with_graphsurgeon(light: onnx.ModelProto, never: Callable, path: Path) -> onnx.GraphProto:
    import onnx_graphsurgeon as gs
    import onnxruntime as ort
    from onnx_graphsurgeon.logger import G_LOGGER

    # graphsurgeon's onnxruntime sessions take no options, so the default log level is what quiets them:
    # optimiser notes ("UnsqueezeElimination cannot remove node ...") and the error log of a failed
    # evaluation would clutter stderr, where the user gets that failure as one line (error_ok=False).
    # graphsurgeon's own warnings are suppressed likewise. onnxruntime has no getter for the level: it
    # goes back to onnxruntime's default (warnings) for the rest of the process.
    ort.set_default_logger_severity(4)
    try:
        with G_LOGGER.suppress():
            graph = gs.import_onnx(light)
            try:
                # Shape nodes are not folded: shapes are pinned and inferred after this (data propagation
                # carries them); subgraphs and functions are left as they are
                graph.fold_constants(fold_shapes=False, recurse_subgraphs=False, flatten_subgraphs=False,
                                     recurse_functions=False, error_ok=False, should_exclude_node=never)
            except _onnxruntime_errors() as exc:  # onnxruntime could not evaluate the model's constants
                raise UserError(f"cannot evaluate the model's constant nodes: {_message(exc)}", str(path)) from None
            graph.cleanup()
            return gs.export_onnx(graph, do_type_check=False).graph
    finally:
        ort.set_default_logger_severity(2)


@functools.lru_cache(maxsize=1)
def _onnxruntime_errors() -> tuple[type[Exception], ...]:
    """The exception types onnxruntime raises (Fail, InvalidArgument, ...: they share no base class)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return tuple(v for v in vars(ort_state).values() if isinstance(v, type) and issubclass(v, Exception))


def _splice(model: onnx.ModelProto, folded: onnx.GraphProto) -> None:
    """Give `model` the folded graph's nodes and new initializers; keep its own weights (no copy) where
    still read, and its inputs that are not initializers."""
    g = model.graph
    inits = {i.name for i in g.initializer}
    used = {i for n in folded.node for i in node_inputs(n)} | {o.name for o in g.output}
    for k in reversed(range(len(g.initializer))):
        if g.initializer[k].name not in used:
            del g.initializer[k]
    g.initializer.extend(t for t in folded.initializer if t.name not in inits and t.name in used)
    inputs = [i for i in g.input if i.name not in inits]
    del g.input[:]
    g.input.extend(inputs)
    del g.node[:]
    g.node.extend(folded.node)


def _drop_identities(graph: onnx.GraphProto) -> None:
    """Remove Identity/Dropout-free Identity chains by rewiring consumers (graph outputs keep theirs)."""
    outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}
    keep = []
    for node in graph.node:
        if node.op_type == "Identity" and node.output[0] not in outputs:
            src = node.input[0]
            rename[node.output[0]] = rename.get(src, src)
            continue
        keep.append(node)
    if not rename:
        return
    for node in keep:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
    del graph.node[:]
    graph.node.extend(keep)


def _constant_outputs_as_identities(graph: onnx.GraphProto) -> None:
    """A graph output that is an initializer (a weight, or a Constant folded into one) is produced by no
    operator, so no fragment would hold it to send: the initializer is renamed (its readers follow) and an
    Identity of it, appended after the other nodes (their indices stay), produces the output."""
    inits = {i.name: i for i in graph.initializer}
    produced = {o for n in graph.node for o in n.output}
    taken = set(inits) | produced | {i.name for i in graph.input} | {n.name for n in graph.node}
    for name in dict.fromkeys(o.name for o in graph.output):
        if name not in inits or name in produced:
            continue
        inits[name].name = new = _fresh(f"{name}.const", taken)
        _rename_reads(graph.node, name, new)
        graph.node.append(helper.make_node("Identity", [new], [name], name=_fresh(f"{name}.output", taken)))


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        name, k = f"{base}{k}", k + 1
    taken.add(name)
    return name


def _rename_reads(nodes, old: str, new: str) -> None:
    """Point every read of `old` by `nodes` (and by their subgraphs, where no local name shadows it) at `new`."""
    for node in nodes:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for a in node.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                local = {i.name for i in g.input} | {i.name for i in g.initializer} | {o for n in g.node for o in n.output}
                if old not in local:
                    _rename_reads(g.node, old, new)
                    for o in g.output:
                        if o.name == old:
                            o.name = new


def _name_nodes(model: onnx.ModelProto) -> None:
    for node, key in zip(model.graph.node, node_keys(model)):
        node.name = key


def _is_fixed(d: onnx.TensorShapeProto.Dimension) -> bool:
    """Exporters mark a dynamic dimension with a dim_param, nothing, or (PaddlePaddle) a dim_value of -1."""
    return d.HasField("dim_value") and d.dim_value > 0


def _pin_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], path: Path) -> onnx.ModelProto:
    inits = {i.name for i in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in inits}
    for name in shapes:
        if name not in inputs:
            raise UserError(f"--shape names {name!r}, which is not an input (inputs: {', '.join(inputs)})", str(path))
    for name, vi in inputs.items():
        dims = vi.type.tensor_type.shape.dim
        if name in shapes:
            if len(shapes[name]) != len(dims):
                raise UserError(f"--shape {name}: rank {len(shapes[name])}, but the input has rank {len(dims)}", str(path))
            for d, v in zip(dims, shapes[name]):
                if _is_fixed(d) and d.dim_value != v:
                    raise UserError(f"--shape {name}: dimension {d.dim_value} is fixed by the model, not {v}", str(path))
                d.Clear()
                d.dim_value = v
        if any(d.HasField("dim_value") and d.dim_value == 0 for d in dims):
            shape = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in dims]
            raise UserError(f"input {name!r} has a dimension of size 0 (shape {shape}): it holds no data to "
                            "split among devices", str(path))
        unknown = [d for d in dims if not _is_fixed(d)]
        if unknown or not vi.type.tensor_type.HasField("shape"):
            syms = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?") for d in unknown]
            raise UserError(
                f"input {name!r} has dynamic dimension(s) {', '.join(syms) or '(no shape)'}: "
                f"pin them with --shape {name}=D0,D1,...",
                str(path),
            )
    _forget_dynamic_dims(model.graph)
    return model


def _forget_dynamic_dims(graph: onnx.GraphProto) -> None:
    """A -1 left in an output or value_info would contradict the pinned shapes during inference: unknown."""
    for vi in [*graph.output, *graph.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value <= 0:
                d.Clear()


def _infer_shapes(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    try:
        # strict: an inconsistent graph (a corrupt Reshape target, a bad attribute) fails here, in one line,
        # instead of compiling and failing when a device loads its fragment
        shaped = shape_inference.infer_shapes(skeleton(model), check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise UserError(f"shape inference failed: {_message(exc)}", str(path)) from None
    inferred = model
    del inferred.graph.value_info[:]
    inferred.graph.value_info.extend(shaped.graph.value_info)
    for out, new in zip(inferred.graph.output, shaped.graph.output):
        out.CopyFrom(new)
    missing = _tensors_without_static_shape(inferred)
    missing += [t for t in _downstream_of_ceil_pools(inferred) if t not in missing]
    if missing:
        logger.info("shape inference left %d tensors unshaped; measuring them with onnxruntime", len(missing))
        _measure_shapes(inferred, missing, path)
    return inferred


def _ceil_pool_rows(size: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    """Output size of a ceil_mode pool as onnxruntime computes it: a last window that would start in
    the end padding is dropped (ONNX shape inference keeps it)."""
    out = -(-(size + pb + pe - ((k - 1) * d + 1)) // s) + 1
    return out - 1 if (out - 1) * s >= size + pb else out


def _downstream_of_ceil_pools(model: onnx.ModelProto) -> list[str]:
    """Tensors whose inferred shape may be wrong: the outputs of ceil_mode pools where shape inference
    and onnxruntime disagree, and everything computed from them (measured instead)."""
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in [*model.graph.value_info, *model.graph.output, *model.graph.input]}
    bad = set()
    for node in model.graph.node:
        if node.op_type not in ("MaxPool", "AveragePool", "LpPool") or not node.output:
            continue
        a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
        x, y = shapes.get(node.input[0]), shapes.get(node.output[0])
        if not a.get("ceil_mode") or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or not x or not y:
            continue
        k = list(a["kernel_shape"])
        n = len(k)
        pads = list(a.get("pads", [0] * 2 * n))
        strides, dil = list(a.get("strides", [1] * n)), list(a.get("dilations", [1] * n))
        want = [_ceil_pool_rows(x[2 + i], k[i], strides[i], dil[i], pads[i], pads[n + i]) for i in range(n)]
        if list(y[2:]) != want:
            bad.add(node.output[0])
    if not bad:
        return []
    out = []
    for node in model.graph.node:  # nodes are topologically sorted
        if any(i in bad for i in node_inputs(node)) or any(o in bad for o in node.output):
            for o in node.output:
                bad.add(o)
                out.append(o)
    needed = {i for n in model.graph.node for i in node_inputs(n)} | {o.name for o in model.graph.output}
    return [t for t in out if t in needed]


def _tensors_without_static_shape(model: onnx.ModelProto) -> list[str]:
    known = {}
    for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input):
        tt = vi.type.tensor_type
        ok = tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim) and tt.elem_type != 0
        known[vi.name] = ok
    inits = {i.name for i in model.graph.initializer}
    needed = {i for n in model.graph.node for i in node_inputs(n)} | {o.name for o in model.graph.output}
    missing = []
    for node in model.graph.node:
        for out in node.output:  # outputs nothing reads (e.g. Dropout's mask) need no shape
            if out in needed and out not in inits and not known.get(out, False) and out not in missing:
                missing.append(out)
    return missing


def _measure_shapes(model: onnx.ModelProto, names: list[str], path: Path) -> None:
    """Shapes inference could not derive: run the model once on zeros and record what comes out."""
    import onnxruntime as ort

    probe = skeleton(model)  # weights become inputs, fed zeros: no multi-GB re-serialisation
    graph_outputs = {o.name for o in probe.graph.output}
    for n in names:
        if n not in graph_outputs:
            probe.graph.output.append(helper.make_empty_tensor_value_info(n))
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {
            i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], dtype=np_dtype(i.type.tensor_type.elem_type))
            for i in probe.graph.input
        }
        results = sess.run(names, feeds)
    except Exception as exc:
        raise UserError(f"cannot determine static shapes of {len(names)} tensors: {_message(exc)}", str(path)) from None
    by_name = {vi.name: vi for vi in model.graph.value_info}
    for name, value in zip(names, results):
        value = np.asarray(value)
        vi = helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
        if name in by_name:
            by_name[name].CopyFrom(vi)
        elif name in graph_outputs:
            next(o for o in model.graph.output if o.name == name).CopyFrom(vi)
        else:
            model.graph.value_info.append(vi)


def initializer_arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
