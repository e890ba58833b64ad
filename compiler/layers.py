"""Build the LayerGraph of a normalised, shaped ONNX model: group operators into layers, classify, count."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from .graph import Layer, LayerGraph, TensorInfo, Window

__all__ = ["build_layer_graph", "cost_class", "np_dtype", "spatial_type", "subgraph_inputs"]

# Cheap operators that join the layer of the operator producing their single activation input.
FOLLOWERS = {
    "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Elu", "Selu",
    "Softplus", "Softsign", "Gelu", "Erf", "Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal", "Cast",
    "BatchNormalization", "Dropout", "Identity", "Add", "Sub", "Mul", "Div", "Pow", "LRN",
}
POINTWISE = FOLLOWERS | {"Sum", "Max", "Min", "Mean", "InstanceNormalization", "Where", "Equal", "Not"}
NEIGHBOURHOOD = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"}
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
    if op in ("Conv", "ConvTranspose"):
        group = _attr(node, "group", 1)
        cin = shapes.get(node.input[0], (0, 0))[1] if len(shapes.get(node.input[0], ())) > 1 else 0
        return "depthwise_conv" if group > 1 and group == cin else "conv"
    if op in ("Gemm", "MatMul", "MatMulInteger", "QLinearMatMul", "Einsum"):
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
    if node.op_type in POINTWISE or (node.op_type == "Concat" and _attr(node, "axis", 0) == 1):
        return 2
    return 3


def node_window(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> Window | None:
    """Window geometry of a 2-D Conv/MaxPool/AveragePool on NCHW; None for anything else."""
    if node.op_type not in ("Conv", "MaxPool", "AveragePool"):
        return None
    if node.op_type == "Conv":
        w = shapes.get(node.input[1], ())
        kernel = tuple(_attr(node, "kernel_shape", list(w[2:])))
    else:
        kernel = tuple(_attr(node, "kernel_shape", []))
    if len(kernel) != 2 or _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    pads = tuple(_attr(node, "pads", [0, 0, 0, 0]))
    return Window(node.op_type, (int(kernel[0]), int(kernel[1])), tuple(_attr(node, "strides", [1, 1])),
                  (pads[0], pads[1], pads[2], pads[3]), tuple(_attr(node, "dilations", [1, 1])),
                  bool(_attr(node, "ceil_mode", 0)), int(_attr(node, "group", 1)))


def _numel(shape: tuple[int, ...]) -> int:
    return int(math.prod(shape)) if shape else 1


def node_flops(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    out = shapes.get(node.output[0], ()) if node.output else ()
    n_out = _numel(out)
    op = node.op_type
    if op in ("Conv", "ConvTranspose"):
        w = shapes.get(node.input[1], ())
        if len(w) < 3:
            return 0
        per_out = 2 * _numel(w[1:])  # (Cin / group) * kernel MACs, per output element
        if op == "ConvTranspose":
            return 2 * _numel(shapes.get(node.input[0], ())) * _numel(w[1:])
        return per_out * n_out
    if op == "Gemm":
        a = shapes.get(node.input[0], ())
        k = a[0] if _attr(node, "transA", 0) else a[-1] if a else 0
        return 2 * n_out * k
    if op == "MatMul":
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
    layers = tuple(_make_layer(i, grp, g, inits, tensors, shapes, graph_outputs, users) for i, grp in enumerate(groups))
    inputs = tuple(i.name for i in g.input if i.name not in inits)
    return LayerGraph(layers=layers, tensors=tensors, inputs=inputs, outputs=tuple(graph_outputs))


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
    lead = max(nodes, key=lambda n: node_flops(n, shapes))
    kinds = {spatial_type(n) for n in nodes}
    windows = [node_window(n, shapes) for n in nodes if spatial_type(n) == 1]
    return Layer(
        index=index,
        name=nodes[0].name,
        nodes=tuple(group),
        node_names=tuple(n.name for n in nodes),
        op_types=tuple(n.op_type for n in nodes),
        cost_class=cost_class(lead, shapes),
        spatial_type=3 if 3 in kinds else 1 if 1 in kinds else 2,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        flops=sum(node_flops(n, shapes) for n in nodes),
        param_bytes=sum(_init_bytes(inits[p]) for p in params),
        input_bytes=sum(tensors[t].nbytes for t in inputs if t in tensors),
        output_bytes=sum(tensors[t].nbytes for t in outputs if t in tensors),
        window=windows[0] if len(windows) == 1 else None,
    )


def _ordered(names: set[str], nodes) -> list[str]:
    return [o for n in nodes for o in n.output if o in names]


def _init_bytes(init: onnx.TensorProto) -> int:
    dtype = np_dtype(init.data_type)
    if dtype is None:
        raise ValueError(f"initializer {init.name!r}: unknown element type {init.data_type} (ingest rejects these)")
    return _numel(tuple(init.dims)) * dtype.itemsize
