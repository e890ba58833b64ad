"""Ingest: load an ONNX file, normalise it, pin and infer static shapes, and build its LayerGraph."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from edgec.runtime.manifest import file_sha256  # the runtime owns the hashes it checks

from .errors import UserError
from .graph import LayerGraph
from .layers import build_layer_graph, node_inputs, subgraph_inputs

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
        raise UserError(f"not a readable ONNX model ({_first_line(exc)})", str(path)) from None
    if not model.graph.node:
        raise UserError("not an ONNX model with a graph (no nodes)", str(path))
    try:
        onnx.checker.check_model(skeleton(model), full_check=False)
    except Exception as exc:
        raise UserError(f"invalid ONNX model: {_first_line(exc)}", str(path)) from None
    return model


SKELETON_MAX_ELEMENTS = 4096  # initializers up to this size stay (shape tensors feed data propagation)


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its large weights: each becomes a typed graph input of the same shape.

    The checker and shape inference serialise the whole model; on the skeleton they see the same structure
    and types at a fraction of the cost (weights were already parsed, so their contents are not in doubt).
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
        if int(np.prod(init.dims, dtype=np.int64)) <= SKELETON_MAX_ELEMENTS:
            sg.initializer.append(init)
        elif init.name not in listed:
            sg.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return sk


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), CONVERT_TO)


def _normalise(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """Fold constant subgraphs into initializers, drop Identity chains and initializer-inputs, name nodes."""
    if _opset(model) < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, CONVERT_TO)
        except Exception as exc:
            raise UserError(f"cannot convert opset {_opset(model)} to {CONVERT_TO}: {_first_line(exc)}", str(path)) from None
    out = model  # normalised in place: the caller's proto is ours
    _name_nodes(out)  # before folding, so names follow the file's node indices
    _fold_constants(out, path)
    out.ir_version = max(out.ir_version, 4)  # IR 3 needs initializers listed as inputs; we list none
    _drop_identities(out.graph)
    return out


# Operators whose output is not a function of their inputs: never fold.
NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def _fold_constants(model: onnx.ModelProto, path: Path) -> None:
    """Evaluate every node whose inputs are all constants (Constant, ConstantOfShape, Unsqueeze of a weight,
    Identity of a weight, ...) into initializers; drop initializers listed as graph inputs and unused ones."""
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    keep, opsets = [], list(model.opset_import)
    for node in g.node:
        ins = [i for i in node.input if i]
        foldable = node.op_type not in NOT_FOLDABLE and all(i in inits for i in ins) and not subgraph_inputs(node)
        if not foldable or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            keep.append(node)
            continue
        try:
            fn = helper.make_graph([node], "fold", [], [helper.make_empty_tensor_value_info(o) for o in node.output if o],
                                   initializer=[inits[i] for i in dict.fromkeys(ins)])
            values = ReferenceEvaluator(helper.make_model(fn, opset_imports=opsets)).run(None, {})
        except Exception as exc:
            raise UserError(f"cannot evaluate constant node {node.name or node.op_type}: {_first_line(exc)}", str(path)) from None
        for name, value in zip([o for o in node.output if o], values):
            inits[name] = numpy_helper.from_array(np.asarray(value), name)
    graph_outputs = {o.name for o in g.output}
    used = {i for n in keep for i in node_inputs(n)} | graph_outputs
    del g.node[:]
    g.node.extend(keep)
    del g.initializer[:]
    g.initializer.extend(inits[name] for name in inits if name in used)
    real_inputs = [i for i in g.input if i.name not in inits]
    del g.input[:]
    g.input.extend(real_inputs)


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


def node_keys(model: onnx.ModelProto) -> list[str]:
    """Unique node names as edgec knows them: the node's own name, else `<op_type>_<index>` in the file;
    a repeat gets `_<index>` appended. Measured per-node tables (`edgec profile --model`) use these keys."""
    keys, seen = [], set()
    for i, n in enumerate(model.graph.node):
        k = n.name or f"{n.op_type}_{i}"
        if k in seen:
            k = f"{k}_{i}"
        seen.add(k)
        keys.append(k)
    return keys


def _name_nodes(model: onnx.ModelProto) -> None:
    for node, key in zip(model.graph.node, node_keys(model)):
        node.name = key


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
                if d.HasField("dim_value") and d.dim_value != v:
                    raise UserError(f"--shape {name}: dimension {d.dim_value} is fixed by the model, not {v}", str(path))
                d.Clear()
                d.dim_value = v
        unknown = [i for i, d in enumerate(dims) if not d.HasField("dim_value") or d.dim_value <= 0]
        if unknown or not vi.type.tensor_type.HasField("shape"):
            syms = [dims[i].dim_param or "?" for i in unknown]
            raise UserError(
                f"input {name!r} has dynamic dimension(s) {', '.join(syms) or '(no shape)'}: "
                f"pin them with --shape {name}=D0,D1,...",
                str(path),
            )
    return model


def _infer_shapes(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    try:
        shaped = shape_inference.infer_shapes(skeleton(model), check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise UserError(f"shape inference failed: {_first_line(exc)}", str(path)) from None
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
            i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], dtype=_np_dtype(i.type.tensor_type.elem_type))
            for i in probe.graph.input
        }
        results = sess.run(names, feeds)
    except Exception as exc:
        raise UserError(f"cannot determine static shapes of {len(names)} tensors: {_first_line(exc)}", str(path)) from None
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


def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def initializer_arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
