"""Protobuf helpers the ingest steps share: the model's skeleton, node keys, errors as one line."""

from __future__ import annotations

import math

import onnx
from onnx import helper

from edgec.runtime.errors import one_line
from edgec.runtime.profile.nodes import node_keys  # the keys of the device's measured per-node tables

__all__ = ["skeleton", "node_keys", "name_nodes", "message", "SKELETON_MAX_ELEMENTS"]


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



def message(exc: Exception) -> str:
    """The exception's message as one line: onnx's checker puts what it names (a node, a tensor) on the
    lines after the first, so they are joined, not dropped."""
    return one_line(exc) or type(exc).__name__


def name_nodes(model: onnx.ModelProto) -> None:
    for node, key in zip(model.graph.node, node_keys(model)):
        node.name = key

