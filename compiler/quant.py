"""Quantized models: the node units onnxruntime fuses into int8 kernels, and the int8 operator classes.

A QDQ model (onnxruntime.quantization's QuantFormat.QDQ) writes each int8 operator as float operators between
DequantizeLinear and QuantizeLinear nodes; onnxruntime fuses such a unit (DequantizeLinear of the inputs and of
the weights -> Conv/MatMul/Add/... -> QuantizeLinear) into one int8 kernel (QLinearConv, QLinearMatMul, ...).
A dynamic model (quantize_dynamic) writes DynamicQuantizeLinear -> MatMulInteger/ConvInteger -> Cast -> Mul,
fused into DynamicQuantizeMatMul / MatMulIntegerToFloat.  Cut apart, a unit's pieces run as float operators
on two devices and the split no longer computes what the whole model computes (issue 41: MobileNetV2 QDQ cut
inside its units differed by 6 quantization steps).  So a unit is one layer: cuts fall between units, on the
int8 tensor a QuantizeLinear produces.  A QOperator model (QLinearConv, QLinearAdd, ...) needs no grouping:
each of its operators is one int8 kernel already.
"""

from __future__ import annotations

import heapq

import onnx

__all__ = ["INT8_OPS", "INT8_CLASSES", "QUANTIZE_OPS", "FLOAT_CLASS_OF", "unit_groups", "is_int8", "int8_class"]

# Operators that compute in int8 (or uint8) themselves: onnx's and onnxruntime's contrib ones.
INT8_OPS = {"QLinearConv", "ConvInteger", "MatMulInteger", "QLinearMatMul", "QGemm", "DynamicQuantizeMatMul",
            "MatMulIntegerToFloat"}
# The cost classes of int8 kernels, and the float class whose figure prices one where a profile has no
# int8 figure (cluster/profile.py: an int8 kernel is assumed no faster than the float one).
FLOAT_CLASS_OF = {"conv_int8": "conv", "depthwise_conv_int8": "depthwise_conv", "gemm_int8": "gemm"}
INT8_CLASSES = tuple(FLOAT_CLASS_OF)
QUANTIZE_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
# What follows an integer MatMul/Conv in a dynamic unit: the Cast of its int32 result, the Mul by the scales
_DYNAMIC_TAIL = ("Cast", "Mul")
# Float operators onnxruntime fuses with the one producing their input (Add + LayerNormalization ->
# SkipLayerNormalization).  Apart, each computes in float what the fused kernel computes slightly differently
# (1e-7 relative): harmless in a float model, but in a quantized one the next quantizer turns such a
# difference into a whole quantization step now and then (the dynamic transformer, cut between its residual
# Add and LayerNormalization, differed by 0.008).  In a quantized model they are one layer.
_FUSED_WITH_PRODUCER = {"LayerNormalization": "Add"}


def unit_groups(nodes, groups: list[list[int]]) -> list[list[int]]:
    """`groups` (node indices, a topological order of groups) merged so that no Q/DQ unit spans two groups,
    in a topological order (ties by first node); the same list when the model has no quantization nodes."""
    if not any(n.op_type in QUANTIZE_OPS for n in nodes):
        return groups
    group_of = {idx: gi for gi, grp in enumerate(groups) for idx in grp}
    producer = {o: idx for idx, n in enumerate(nodes) for o in n.output if o}
    readers: dict[str, list[int]] = {}
    for idx, n in enumerate(nodes):
        for name in dict.fromkeys(i for i in n.input if i):
            readers.setdefault(name, []).append(idx)
    parent = list(range(len(groups)))

    def root(g: int) -> int:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    def join(a: int, b: int) -> None:
        parent[root(group_of[a])] = root(group_of[b])

    for idx, n in enumerate(nodes):
        if n.op_type in ("DequantizeLinear", "DynamicQuantizeLinear"):  # with the operators reading it
            for o in n.output:
                for r in readers.get(o, ()):
                    join(idx, r)
        elif n.op_type == "QuantizeLinear" and n.input[0] in producer:  # with the operator it quantizes
            join(idx, producer[n.input[0]])
        elif n.op_type in ("MatMulInteger", "ConvInteger"):
            _join_tail(idx, nodes, readers, join)
        elif n.op_type in _FUSED_WITH_PRODUCER and n.input and n.input[0] in producer:
            src = producer[n.input[0]]
            if nodes[src].op_type == _FUSED_WITH_PRODUCER[n.op_type] and len(readers[n.input[0]]) == 1:
                join(idx, src)
    merged: dict[int, list[int]] = {}
    for gi, grp in enumerate(groups):
        merged.setdefault(root(gi), []).extend(grp)
    return _topological([sorted(g) for g in merged.values()], nodes, producer)


def _join_tail(idx: int, nodes, readers, join) -> None:
    """An integer MatMul/Conv with its Cast and the Mul that scales it back to float."""
    for op in _DYNAMIC_TAIL:
        users = readers.get(nodes[idx].output[0], [])
        if len(users) != 1 or nodes[users[0]].op_type != op:
            return
        join(idx, users[0])
        idx = users[0]


def _topological(groups: list[list[int]], nodes, producer: dict[str, int]) -> list[list[int]]:
    """Groups in dependency order, the one with the lowest first node first among those ready."""
    group_of = {idx: gi for gi, grp in enumerate(groups) for idx in grp}
    deps = [{group_of[producer[i]] for k in grp for i in nodes[k].input if i in producer} - {gi}
            for gi, grp in enumerate(groups)]
    waiting = [len(d) for d in deps]
    after: dict[int, list[int]] = {}
    for gi, d in enumerate(deps):
        for j in d:
            after.setdefault(j, []).append(gi)
    ready = [(groups[gi][0], gi) for gi in range(len(groups)) if not waiting[gi]]
    heapq.heapify(ready)
    out = []
    while ready:
        _, gi = heapq.heappop(ready)
        out.append(groups[gi])
        for k in after.get(gi, ()):
            waiting[k] -= 1
            if not waiting[k]:
                heapq.heappush(ready, (groups[k][0], k))
    if len(out) != len(groups):  # a unit that another unit both feeds and reads: not a quantized model's shape
        stuck = next(gi for gi in range(len(groups)) if waiting[gi])
        raise ValueError(f"the Q/DQ units around node {nodes[groups[stuck][0]].name!r} depend on each other")
    return out


def is_int8(lead: onnx.NodeProto, members: list[onnx.NodeProto]) -> bool:
    """Whether the layer's leading operator runs as an int8 kernel: an int8 operator itself, or a float one
    whose data and weight inputs both come from DequantizeLinear nodes of its own unit (onnxruntime fuses it)."""
    if lead.op_type in INT8_OPS:
        return True
    dequantized = {o for n in members if n.op_type == "DequantizeLinear" for o in n.output}
    return len(lead.input) >= 2 and lead.input[0] in dequantized and lead.input[1] in dequantized


def int8_class(float_class: str) -> str:
    """The int8 cost class of a float one (conv -> conv_int8); classes without an int8 kernel stay."""
    return f"{float_class}_int8" if f"{float_class}_int8" in FLOAT_CLASS_OF else float_class
