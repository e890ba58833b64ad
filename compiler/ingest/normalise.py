"""Normalise a model: convert old opsets, name nodes, fold constant subgraphs into initializers (with
onnx-graphsurgeon), drop Identity chains, give constant graph outputs an operator."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Callable

import onnx
from onnx import helper, shape_inference

from ..errors import UserError
from ..layers import node_inputs, np_dtype
from ..names import fresh
from .protos import message, name_nodes

__all__ = ["normalise"]

MIN_OPSET = 7  # older models are converted up to CONVERT_TO
CONVERT_TO = 13


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), CONVERT_TO)


def normalise(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """Fold constant subgraphs into initializers, drop Identity chains and initializer-inputs, name nodes."""
    if _opset(model) < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, CONVERT_TO)
        except Exception as exc:
            raise UserError(f"cannot convert opset {_opset(model)} to {CONVERT_TO}: {message(exc)}", str(path)) from None
    out = model  # normalised in place: the caller's proto is ours
    name_nodes(out)  # before folding, so names follow the file's node indices
    _fold_constants(out, path)
    out.ir_version = max(out.ir_version, 4)  # IR 3 needs initializers listed as inputs; we list none
    _drop_identities(out.graph)
    _constant_outputs_as_identities(out.graph)
    _one_reader_per_dequantize(out.graph)
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
        raise UserError(f"shape inference failed: {message(exc)}", str(path)) from None
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
                raise UserError(f"cannot evaluate the model's constant nodes: {message(exc)}", str(path)) from None
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
        inits[name].name = new = fresh(f"{name}.const", taken, "")
        _rename_reads(graph.node, name, new)
        graph.node.append(helper.make_node("Identity", [new], [name], name=fresh(f"{name}.output", taken, "")))


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



def _one_reader_per_dequantize(graph: onnx.GraphProto) -> None:
    """A DequantizeLinear that several operators read is copied, one per reader, as onnxruntime does when it
    loads the model (its EnsureUniqueDQForNodeUnit pass): each copy then belongs to its reader's Q/DQ unit
    (quant.py), so a cut between two readers sends the int8 tensor, not the dequantized float one."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in dict.fromkeys(i for i in node.input if i):
            readers.setdefault(name, []).append(node)
    taken = {o for n in graph.node for o in n.output} | {n.name for n in graph.node} | \
        {i.name for i in graph.initializer} | {i.name for i in graph.input}
    out = []
    for node in graph.node:
        out.append(node)
        if node.op_type != "DequantizeLinear":
            continue
        for reader in readers.get(node.output[0], [])[1:]:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = fresh(f"{node.name}.{reader.name}", taken, "")
            copy.output[0] = fresh(f"{node.output[0]}.{reader.name}", taken, "")
            for k, name in enumerate(reader.input):
                if name == node.output[0]:
                    reader.input[k] = copy.output[0]
            out.append(copy)
    if len(out) != len(graph.node):
        del graph.node[:]
        graph.node.extend(out)
