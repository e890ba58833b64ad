"""Nodes that compute a value the graph already holds, merged into it (`merge_duplicates`): an Identity, and a
node with the same operator, attributes and inputs as an earlier one (a commutative one's inputs in any order).

A generative build runs it after cache_shapes.py: torch's export computes past + seq once per decoder layer
from that layer's cache, which, once every past is read from the mask, are the same sum; each copy would ride
along every pipeline cut as its own message (graph.py `riders`).
"""

from __future__ import annotations

import onnx

from .normalise import NOT_FOLDABLE

__all__ = ["merge_duplicates"]

COMMUTATIVE = {"Add", "Mul", "Max", "Min", "Sum", "Mean", "Equal", "And", "Or", "Xor", "BitwiseAnd", "BitwiseOr",
               "BitwiseXor"}
_SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def merge_duplicates(model: onnx.ModelProto) -> int:
    """Merge, in place, every node of the default domain whose outputs an earlier node (or, for an Identity,
    its input) already holds; returns how many nodes were removed. Graph outputs keep their producers, and a
    model with subgraphs (If, Loop, Scan: they may read any outer tensor by name) is left as it is."""
    g = model.graph
    if any(a.type in _SUBGRAPHS for n in g.node for a in n.attribute):
        return 0
    outputs = {o.name for o in g.output}
    alias: dict[str, str] = {}  # removed node's output -> the tensor that holds its value
    first: dict[tuple, onnx.NodeProto] = {}
    keep = []
    for node in g.node:
        for i, name in enumerate(node.input):
            node.input[i] = alias.get(name, name)
        if node.domain not in ("", "ai.onnx") or node.op_type in NOT_FOLDABLE:
            keep.append(node)
            continue
        pinned = any(o in outputs for o in node.output)
        if node.op_type == "Identity" and not pinned:
            alias[node.output[0]] = node.input[0]
            continue
        inputs = sorted(node.input) if node.op_type in COMMUTATIVE else list(node.input)
        key = (node.op_type, tuple(inputs), tuple(a.SerializeToString() for a in node.attribute), len(node.output))
        earlier = first.get(key)
        if earlier is not None and not pinned and all(e or not o for o, e in zip(node.output, earlier.output)):
            alias.update((o, e) for o, e in zip(node.output, earlier.output) if o)
            continue
        first.setdefault(key, node)
        keep.append(node)
    removed = len(g.node) - len(keep)
    if removed:
        del g.node[:]
        g.node.extend(keep)
    return removed
