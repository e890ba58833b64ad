"""Static shapes: pin the inputs' dynamic dimensions (--shape), infer the rest, and measure with onnxruntime
what inference cannot tell (or tells wrong, as after a ceil_mode pool)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, shape_inference

from ..errors import UserError
from ..layers import node_inputs, np_dtype
from .protos import message, skeleton

__all__ = ["pin_shapes", "infer_shapes"]

logger = logging.getLogger(__name__)


def _is_fixed(d: onnx.TensorShapeProto.Dimension) -> bool:
    """Exporters mark a dynamic dimension with a dim_param, nothing, or (PaddlePaddle) a dim_value of -1."""
    return d.HasField("dim_value") and d.dim_value > 0


def pin_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], path: Path,
               empty: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """Pin the inputs' dynamic dimensions to `shapes`; an input of `empty` may have a dimension of size 0
    (a generative model's cache before its first step)."""
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
        if name not in empty and any(d.HasField("dim_value") and d.dim_value == 0 for d in dims):
            shape = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in dims]
            raise UserError(f"input {name!r} has a dimension of size 0 (shape {shape}): it holds no data to "
                            "split among devices", str(path))
        unknown = [d for d in dims if not (_is_fixed(d) or (name in empty and d.HasField("dim_value") and d.dim_value == 0))]
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


def infer_shapes(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    try:
        # strict: an inconsistent graph (a corrupt Reshape target, a bad attribute) fails here, in one line,
        # instead of compiling and failing when a device loads its fragment
        shaped = shape_inference.infer_shapes(skeleton(model), check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise UserError(f"shape inference failed: {message(exc)}", str(path)) from None
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
        raise UserError(f"cannot determine static shapes of {len(names)} tensors: {message(exc)}", str(path)) from None
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

