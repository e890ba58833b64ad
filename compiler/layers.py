"""Build the LayerGraph of a normalised, shaped ONNX model: group operators into layers, classify, count."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import Layer, LayerGraph, TensorInfo, Window
from .quant import QUANTIZE_OPS, int8_class, is_int8, unit_groups
from .spatial.ops import Refused, SliceWindow, Transposed, Upsample

__all__ = ["build_layer_graph", "cost_class", "np_dtype", "spatial_type", "subgraph_inputs"]

# Cheap operators that join the layer of the operator producing their single activation input.
FOLLOWERS = {
    "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Elu", "Selu",
    "Softplus", "Softsign", "Gelu", "Erf", "Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal", "Cast",
    "BatchNormalization", "Dropout", "Identity", "Add", "Sub", "Mul", "Div", "Pow", "LRN",
}
POINTWISE = FOLLOWERS | {"Sum", "Max", "Min", "Mean", "InstanceNormalization", "Where", "Equal", "Not"}
NEIGHBOURHOOD = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "QLinearConv"}
# Per-tensor (or per-channel) quantization maps each element alone: pointwise on the spatial axes.  Not
# DynamicQuantizeLinear: its scale is computed over the whole tensor, so a tile would compute another one.
QUANTIZE_POINTWISE = {"QuantizeLinear", "DequantizeLinear"}
POOLS = {"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}
NORMS = {"BatchNormalization", "LayerNormalization", "LRN", "InstanceNormalization", "GroupNormalization"}
DATA = {
    "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "Expand", "Tile", "Pad", "Shape", "Size", "Resize", "Upsample", "DepthToSpace",
    "SpaceToDepth", "Identity", "Cast", "ConstantOfShape", "Range",
}
CONTROL_FLOW = {"If", "Loop", "Scan"}


def np_dtype(elem_type: int) -> np.dtype | None:
    """The numpy dtype of an ONNX element type; None for a code this onnx release does not know."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except KeyError:
        return None


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def cost_class(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> str:
    op = node.op_type
    if op.startswith("QLinear") and op not in ("QLinearConv", "QLinearMatMul"):
        op = op[len("QLinear"):]  # onnxruntime's int8 Add, Mul, GlobalAveragePool, Concat...: the float op's class
    if op in QUANTIZE_OPS:
        return "elementwise"
    if op in ("Conv", "ConvTranspose", "QLinearConv", "ConvInteger"):
        group = _attr(node, "group", 1)
        cin = shapes.get(node.input[0], (0, 0))[1] if len(shapes.get(node.input[0], ())) > 1 else 0
        return "depthwise_conv" if group > 1 and group == cin else "conv"
    if op in ("Gemm", "MatMul", "MatMulInteger", "QLinearMatMul", "QGemm", "Einsum"):
        return "gemm"
    if op in POOLS:
        return "pool"
    if op in NORMS:
        return "norm"
    if op in ("Softmax", "LogSoftmax"):
        return "softmax"
    if op in DATA:
        return "data"
    if op in POINTWISE:
        return "elementwise"
    return "other"


def spatial_type(node: onnx.NodeProto) -> int:
    """ADaPS operator class: 1 neighbourhood, 2 pointwise, 3 not split."""
    if node.op_type in NEIGHBOURHOOD:
        return 1
    if node.op_type in POINTWISE or node.op_type in QUANTIZE_POINTWISE or (node.op_type == "Concat" and _attr(node, "axis", 0) == 1):
        return 2
    return 3


def node_window(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]],
                inits: dict[str, onnx.TensorProto] | None = None) -> Window | None:
    """Row geometry of a 2-D operator on NCHW: Conv/MaxPool/AveragePool windows, and (spatial/ops.py) strided
    Slice, SpaceToDepth, DepthToSpace, Resize/Upsample by integer factors, ConvTranspose; Refused (with the
    reason) where their attributes admit no exact tiling; None for anything else."""
    if node.op_type in ROW_OPS:
        return row_window(node, shapes, inits or {})
    if node.op_type not in ("Conv", "MaxPool", "AveragePool", "QLinearConv"):
        return None
    if node.op_type in ("Conv", "QLinearConv"):
        w = shapes.get(node.input[3 if node.op_type == "QLinearConv" else 1], ())
        kernel = tuple(_attr(node, "kernel_shape", list(w[2:])))
    else:
        kernel = tuple(_attr(node, "kernel_shape", []))
    if len(kernel) != 2 or _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    pads = tuple(_attr(node, "pads", [0, 0, 0, 0]))
    return Window(node.op_type, (int(kernel[0]), int(kernel[1])), tuple(_attr(node, "strides", [1, 1])),
                  (pads[0], pads[1], pads[2], pads[3]), tuple(_attr(node, "dilations", [1, 1])),
                  bool(_attr(node, "ceil_mode", 0)), int(_attr(node, "group", 1)))


ROW_OPS = ("Slice", "SpaceToDepth", "DepthToSpace", "Resize", "Upsample", "ConvTranspose")
RESIZE_MODES = ("asymmetric", "half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn")


class _Refuse(Exception):
    """An attribute combination with no exact row algebra (the message says which)."""


def row_window(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]], inits: dict[str, onnx.TensorProto]):
    """The spatial/ops.py geometry of a ROW_OPS node on 4-D tensors (None on other ranks), or Refused."""
    src, dst = shapes.get(node.input[0], ()), shapes.get(node.output[0], ())
    if len(src) != 4 or len(dst) != 4:
        return None
    build = {"Slice": _slice_window, "SpaceToDepth": _space_to_depth, "DepthToSpace": _depth_to_space,
             "Resize": _resize_window, "Upsample": _resize_window, "ConvTranspose": _transposed_window}
    try:
        return build[node.op_type](node, src, dst, inits)
    except _Refuse as exc:
        return Refused(node.op_type, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), why=f"{node.op_type}: {exc}")


def _const(node: onnx.NodeProto, pos: int, inits: dict[str, onnx.TensorProto], what: str):
    """Input `pos` of node as a numpy array: None if absent, _Refuse if computed at run time."""
    if len(node.input) <= pos or not node.input[pos]:
        return None
    name = node.input[pos]
    if name not in inits:
        raise _Refuse(f"its {what} are computed at run time")
    return numpy_helper.to_array(inits[name])


def _slice_window(node, src, dst, inits) -> Window:
    if len(node.input) == 1:  # Slice-1: ranges as attributes
        starts, ends = _attr(node, "starts", []), _attr(node, "ends", [])
        axes, steps = _attr(node, "axes", list(range(len(starts)))), [1] * len(starts)
    else:
        starts, ends = _const(node, 1, inits, "starts"), _const(node, 2, inits, "ends")
        axes = _const(node, 3, inits, "axes")
        steps = _const(node, 4, inits, "steps")
        axes = list(range(len(starts))) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
    box = {ax: (0, src[ax], 1) for ax in (2, 3)}
    for ax, st, en, step in zip(axes, starts, ends, steps):
        ax = int(ax) % 4
        if ax in box:
            box[ax] = _slice_range(int(st), int(en), int(step), src[ax])
    rows = {ax: -(-(en - st) // step) for ax, (st, en, step) in box.items()}
    if any(rows[ax] != dst[ax] for ax in rows):
        raise _Refuse(f"the graph says {dst[2:]} on H/W, the slice takes {(rows[2], rows[3])}")
    (s2, e2, k2), (s3, e3, k3) = box[2], box[3]
    return SliceWindow("Slice", (1, 1), (k2, k3), (-s2, -s3, e2 - src[2], e3 - src[3]), (1, 1))


def _slice_range(start: int, end: int, step: int, size: int) -> tuple[int, int, int]:
    """ONNX's clamping of a positive-step slice: [start, end) within [0, size), negatives from the end."""
    if step <= 0:
        raise _Refuse(f"step {step} on a spatial axis (only positive steps are tiled)")
    start, end = (start + size if start < 0 else start), (end + size if end < 0 else end)
    start, end = min(max(start, 0), size), min(max(end, 0), size)
    if end <= start:
        raise _Refuse("an empty slice")
    return start, end, step


def _space_to_depth(node, src, dst, inits) -> Window:
    k = int(_attr(node, "blocksize", 1))
    return Window("SpaceToDepth", (k, k), (k, k), (0, 0, 0, 0), (1, 1))


def _depth_to_space(node, src, dst, inits) -> Window:
    k = int(_attr(node, "blocksize", 1))
    repeat = tuple((0, 1) for _ in range(k))
    return Upsample("DepthToSpace", (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), factors=(k, k), taps=(repeat, repeat))


def _resize_window(node, src, dst, inits) -> Window:
    """Integer upsampling (nearest, linear, cubic) with a shift-invariant coordinate map, where the tile's
    floating-point coordinates equal the whole model's (see _resize_taps)."""
    factors = []
    for ax in (2, 3):
        if dst[ax] % src[ax]:
            raise _Refuse(f"axis {ax} grows from {src[ax]} to {dst[ax]}, not by an integer factor")
        factors.append(dst[ax] // src[ax])
    if src[:2] != dst[:2]:
        raise _Refuse("it resizes the batch or channel axis")
    _check_resize_inputs(node, src, dst, inits)
    legacy = node.op_type == "Upsample" or len(node.input) == 2  # Upsample, Resize-10: (X, scales)
    mode = _text(_attr(node, "mode", "nearest"))
    transform = "asymmetric" if legacy else _text(_attr(node, "coordinate_transformation_mode", "half_pixel"))
    rounding = "floor" if legacy else _text(_attr(node, "nearest_mode", "round_prefer_floor"))
    if mode != "nearest" and _attr(node, "antialias", 0):
        raise _Refuse("antialias")
    taps = tuple(_resize_taps(u, mode, transform, rounding) for u in factors)
    return Upsample(node.op_type, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), factors=tuple(factors), taps=taps)


def _check_resize_inputs(node, src, dst, inits) -> None:
    """Scales (or sizes) must be constants that say what the graph's shapes say (the tile rewrites sizes)."""
    if node.op_type == "Upsample" and len(node.input) == 1:
        scales = _attr(node, "scales", None)
    else:
        scales = _const(node, 1 if len(node.input) == 2 or node.op_type == "Upsample" else 2, inits, "scales")
    sizes = _const(node, 3, inits, "sizes") if node.op_type == "Resize" and len(node.input) > 3 else None
    axes = [int(a) % 4 for a in _attr(node, "axes", [0, 1, 2, 3])]
    if sizes is not None and len(sizes):
        if _text(_attr(node, "keep_aspect_ratio_policy", "stretch")) != "stretch":
            raise _Refuse("sizes with a keep_aspect_ratio_policy (a tile's aspect ratio differs)")
        return
    if scales is None or not len(scales):
        raise _Refuse("neither scales nor sizes")
    for ax, sc in zip(axes, scales):
        if float(sc) != dst[ax] / src[ax]:
            raise _Refuse(f"scale {float(sc):g} on axis {ax} is not the integer factor {dst[ax]}/{src[ax]}")


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _resize_taps(u: int, mode: str, transform: str, rounding: str) -> tuple[tuple[int, int], ...]:
    """Input row offsets [lo, hi) from q read by output row q*u + r, r = 0..u-1.

    Every transform here maps o + u to x + 1, so a tile (whose output row 0 is the model's row lo*u)
    computes the same source coordinates shifted by lo, provided floating point computes them exactly: it
    does for any x = k / 2^n, so the half-pixel transforms and interpolation weights need u a power of two;
    nearest with asymmetric (x = o / u, a correctly rounded quotient) only needs an exact tie, r/u = 1/2."""
    if transform not in RESIZE_MODES:
        raise _Refuse(f"coordinate_transformation_mode {transform} (the source coordinate depends on the "
                      "tensor's length or a crop box, so a tile's differs from the whole model's)")
    if mode not in ("nearest", "linear", "cubic"):
        raise _Refuse(f"mode {mode}")
    if (mode != "nearest" or transform != "asymmetric") and u & (u - 1):
        raise _Refuse(f"{mode} {transform} by {u}: the source coordinates are not exact in floating point, "
                      "a tile could round them differently from the whole model")
    if mode != "nearest" and transform == "tf_half_pixel_for_nn":
        raise _Refuse(f"{mode} with tf_half_pixel_for_nn")
    taps = []
    for r in range(u):
        x = Fraction(r, u) if transform == "asymmetric" else Fraction(2 * r + 1, 2 * u) - Fraction(
            0 if transform == "tf_half_pixel_for_nn" else 1, 2)
        if mode == "nearest":
            src = _round(x, rounding)
            taps.append((src, src + 1))
        else:  # linear reads floor(x) and the next row, cubic one more on each side
            f = math.floor(x)
            taps.append((f, f + 2) if mode == "linear" else (f - 1, f + 3))
    return tuple(taps)


def _round(x: Fraction, rounding: str) -> int:
    if rounding == "floor":
        return math.floor(x)
    if rounding == "ceil":
        return math.ceil(x)
    if rounding not in ("round_prefer_floor", "round_prefer_ceil"):
        raise _Refuse(f"nearest_mode {rounding}")
    if x - math.floor(x) == Fraction(1, 2):
        return math.floor(x) if rounding == "round_prefer_floor" else math.ceil(x)
    return math.floor(x + Fraction(1, 2))


def _transposed_window(node, src, dst, inits) -> Window:
    w = inits.get(node.input[1])
    kernel = _attr(node, "kernel_shape", list(w.dims[2:]) if w is not None else [])
    if len(kernel) != 2:
        raise _Refuse("no 2-D kernel_shape and no constant weight to read it from")
    if _text(_attr(node, "auto_pad", "NOTSET")) not in ("NOTSET", "VALID") or _attr(node, "output_shape", None):
        raise _Refuse("auto_pad or output_shape (pads implied by a target shape)")
    pads = tuple(int(v) for v in _attr(node, "pads", [0, 0, 0, 0]))
    strides, dil = tuple(_attr(node, "strides", [1, 1])), tuple(_attr(node, "dilations", [1, 1]))
    out_pad = tuple(_attr(node, "output_padding", [0, 0]))
    if min(pads) < 0:
        raise _Refuse("negative pads")
    return Transposed("ConvTranspose", (int(kernel[0]), int(kernel[1])), (int(strides[0]), int(strides[1])),
                     pads, (int(dil[0]), int(dil[1])), group=int(_attr(node, "group", 1)),
                     output_padding=(int(out_pad[0]), int(out_pad[1])))


def _numel(shape: tuple[int, ...]) -> int:
    return int(math.prod(shape)) if shape else 1


def node_flops(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    out = shapes.get(node.output[0], ()) if node.output else ()
    n_out = _numel(out)
    op = node.op_type
    if op in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv"):
        w = shapes.get(node.input[3 if op == "QLinearConv" else 1], ())  # QLinearConv: x, its scale and zero point, w
        if len(w) < 3:
            return 0
        per_out = 2 * _numel(w[1:])  # (Cin / group) * kernel MACs, per output element
        if op == "ConvTranspose":
            return 2 * _numel(shapes.get(node.input[0], ())) * _numel(w[1:])
        return per_out * n_out
    if op in ("Gemm", "QGemm"):
        a = shapes.get(node.input[0], ())
        k = a[0] if _attr(node, "transA", 0) else a[-1] if a else 0
        return 2 * n_out * k
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        a = shapes.get(node.input[0], ())
        return 2 * n_out * (a[-1] if a else 0)
    if op in ("MaxPool", "AveragePool", "LpPool"):
        return n_out * _numel(tuple(_attr(node, "kernel_shape", [1])))
    if op.startswith("Global"):
        return _numel(shapes.get(node.input[0], ()))
    if op in ("Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "InstanceNormalization"):
        return 5 * n_out
    if op in ("BatchNormalization", "LRN"):
        return 2 * n_out * (_attr(node, "size", 1) if op == "LRN" else 1)
    if op in DATA:
        return 0
    return n_out


def subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Outer-scope names a control-flow node's subgraphs read (they are implicit inputs of the node)."""
    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            local = {i.name for i in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                local |= set(n.output)
            for n in g.node:
                names |= {i for i in n.input if i and i not in local}
                names |= subgraph_inputs(n) - local
            names |= {o.name for o in g.output if o.name not in local}
    return names


def node_inputs(node: onnx.NodeProto) -> list[str]:
    return [i for i in node.input if i] + sorted(subgraph_inputs(node) - set(node.input))


def _tensor_infos(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    infos = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tt = vi.type.tensor_type
        if not tt.HasField("shape") or tt.elem_type == 0:
            continue
        shape = tuple(int(d.dim_value) for d in tt.shape.dim)
        dtype = np_dtype(tt.elem_type)
        if dtype is None:
            raise ValueError(f"tensor {vi.name!r}: unknown element type {tt.elem_type} (ingest rejects these)")
        infos[vi.name] = TensorInfo(vi.name, shape, dtype.name, _numel(shape) * dtype.itemsize)
    return infos


def build_layer_graph(model: onnx.ModelProto) -> LayerGraph:
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    tensors = _tensor_infos(model)
    shapes = {name: t.shape for name, t in tensors.items()} | {n: tuple(i.dims) for n, i in inits.items()}
    graph_outputs = [o.name for o in g.output]
    users: dict[str, set[int]] = {}
    for idx, node in enumerate(g.node):
        for name in node_inputs(node):
            users.setdefault(name, set()).add(idx)
    consumers = {name: len(u) for name, u in users.items()}

    # A follower joins the group whose last node produced its one activation input (dataflow, not
    # adjacency: branches may interleave in node order). Groups ordered by first node stay topological.
    groups: list[list[int]] = []
    tail_group: dict[str, int] = {}  # output of a group's last node -> group index
    for idx, node in enumerate(g.node):
        acts = [i for i in node_inputs(node) if i not in inits]
        src = acts[0] if len(acts) == 1 else None
        if node.op_type in FOLLOWERS and src in tail_group and consumers.get(src) == 1 and src not in graph_outputs:
            gi = tail_group.pop(src)
            for o in g.node[groups[gi][-1]].output:
                tail_group.pop(o, None)
            groups[gi].append(idx)
        else:
            gi = len(groups)
            groups.append([idx])
        tail_group.update({o: gi for o in node.output if o})
    groups = unit_groups(g.node, groups)  # a quantized model's Q/DQ units, each one layer
    layers = tuple(_make_layer(i, grp, g, inits, tensors, shapes, graph_outputs, users) for i, grp in enumerate(groups))
    inputs = tuple(i.name for i in g.input if i.name not in inits)
    # a model may list an output twice: it is one tensor, returned once
    return LayerGraph(layers=layers, tensors=tensors, inputs=inputs, outputs=tuple(dict.fromkeys(graph_outputs)))


def _make_layer(index, group, g, inits, tensors, shapes, graph_outputs, users) -> Layer:
    nodes = [g.node[i] for i in group]
    produced = {o for n in nodes for o in n.output if o}
    inputs, params = [], []
    for n in nodes:
        for name in node_inputs(n):
            if name in inits:
                if name not in params:
                    params.append(name)
            elif name not in produced and name not in inputs:
                inputs.append(name)
    members = set(group)
    outputs = [o for o in _ordered(produced, nodes) if users.get(o, set()) - members or o in graph_outputs]
    lead = max(nodes, key=lambda n: (n.op_type not in QUANTIZE_OPS, node_flops(n, shapes)))  # a unit's operator
    found = {k: node_window(g.node[k], shapes, inits) for k in group}
    kinds = {_kind(n, found[k]) for k, n in zip(group, nodes)}
    windows = [found[k] for k, n in zip(group, nodes) if _kind(n, found[k]) == 1 or isinstance(found[k], Refused)]
    return Layer(
        index=index,
        name=nodes[0].name,
        nodes=tuple(group),
        node_names=tuple(n.name for n in nodes),
        op_types=tuple(n.op_type for n in nodes),
        cost_class=int8_class(cost_class(lead, shapes)) if is_int8(lead, nodes) else cost_class(lead, shapes),
        spatial_type=3 if 3 in kinds else 1 if 1 in kinds else 2,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        flops=sum(node_flops(n, shapes) for n in nodes),
        param_bytes=sum(_init_bytes(inits[p]) for p in params),
        param_read_bytes=_param_read_bytes(nodes, params, inits, tensors),
        input_bytes=sum(tensors[t].nbytes for t in inputs if t in tensors),
        output_bytes=sum(tensors[t].nbytes for t in outputs if t in tensors),
        window=windows[0] if len(windows) == 1 else None,
    )


def _param_read_bytes(nodes, params: list[str], inits, tensors) -> int | None:
    """The initializer bytes one run of the layer reads, where a Gather reads fewer than its data's (only
    the rows it gathers: its output's bytes); None when every initializer is read whole."""
    gathered = {}
    for n in nodes:
        if n.op_type == "Gather" and n.input and n.input[0] in inits and n.output[0] in tensors:
            gathered[n.input[0]] = min(gathered.get(n.input[0], 0) + tensors[n.output[0]].nbytes,
                                       _init_bytes(inits[n.input[0]]))
    if not gathered:
        return None
    return sum(gathered.get(p, _init_bytes(inits[p])) for p in params)


def _kind(node: onnx.NodeProto, window: Window | None) -> int:
    """spatial_type, with the data-movement operators that have a row geometry (a Slice, a Resize, ...)
    counted as neighbourhood operators; those whose attributes refuse tiling stay Type 3."""
    if node.op_type in ROW_OPS and node.op_type not in NEIGHBOURHOOD:
        return 1 if window is not None and not isinstance(window, Refused) else 3
    return spatial_type(node)


def _ordered(names: set[str], nodes) -> list[str]:
    return [o for n in nodes for o in n.output if o in names]


def _init_bytes(init: onnx.TensorProto) -> int:
    dtype = np_dtype(init.data_type)
    if dtype is None:
        raise ValueError(f"initializer {init.name!r}: unknown element type {init.data_type} (ingest rejects these)")
    return _numel(tuple(init.dims)) * dtype.itemsize
