"""A decoder's reads of its caches' shapes, answered from the token ids and the attention mask instead
(`detach_cache_shapes`), so that reading a cache's shape does not tie the cache to the top of the graph.

torch's dynamo exporter (torch.onnx.export(..., dynamo=True), transformers' Llama) reads the shape of every
cache input at the top of the graph, one Shape per past_key_values.i.*, where it sizes the masks and the
views of layer i. A stage that holds such a Shape must be fed the cache, so every cache's state span
(phases.state_spans) would start at the top of the graph, the spans would overlap, and no stage boundary
could fall between two decoder layers: the whole decoder on one stage.

A cache's dimensions are known without reading it: a fixed size is a constant, its batch is the token
input's, and its past is the attention mask's total length less the new tokens. That holds for every step
edgec runs (DimRoles.pin: every cache has the same past, the mask past + seq), and `edgec generate --verify`
checks the tokens against the unmodified model.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..names import fresh
from .state import DimRoles, StatePair, input_dims

__all__ = ["detach_cache_shapes"]

logger = logging.getLogger(__name__)

PREFIX = "edgec_cache_shape"  # names of the nodes and constants this pass adds


def detach_cache_shapes(model: onnx.ModelProto, pairs: tuple[StatePair, ...], roles: DimRoles) -> int:
    """Replace, in place, every Shape node that reads a cache input by the same dimensions taken from the
    token and mask inputs; returns how many were replaced (0: nothing to do, or no mask input to take the
    past from, in which case a cache stays tied to its Shape readers' stage)."""
    g = model.graph
    state = {p.input: p for p in pairs}
    sources = _sources(model, roles, set(state))
    rewrite = _Rewrite(g, sources)
    done = 0
    for node in list(g.node):
        if node.op_type != "Shape" or node.domain not in ("", "ai.onnx") or node.input[0] not in state:
            continue
        new = rewrite.shape(node, state[node.input[0]], roles)
        if new is None:
            continue
        at = list(g.node).index(node)
        del g.node[at]
        for i, n in enumerate(new):
            g.node.insert(at + i, n)
        done += 1
    if done:
        logger.info("%d Shape read(s) of cache inputs now taken from %s", done,
                    " and ".join(sorted({name for name, _ in sources.values()})))
    return done


def _sources(model: onnx.ModelProto, roles: DimRoles, state: set[str]) -> dict[str, tuple[str, int]]:
    """role -> (input, axis) that has a dimension of that role, the token input first."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits and vi.name not in state]
    inputs.sort(key=lambda vi: vi.name != roles.token_input)
    out: dict[str, tuple[str, int]] = {}
    for vi in inputs:
        for axis, d in enumerate(input_dims(vi)):
            if isinstance(d, str) and d in roles.roles:
                out.setdefault(roles.roles[d], (vi.name, axis))
    return out


class _Rewrite:
    """Builds the replacement nodes; the tensors of each role are made once, before the first Shape they
    replace, and shared by the later ones (the graph stays topologically ordered)."""

    def __init__(self, graph: onnx.GraphProto, sources: dict[str, tuple[str, int]]):
        self.graph, self.sources = graph, sources
        self.taken = {t for n in graph.node for t in (*n.input, *n.output, n.name)}
        self.taken |= {i.name for i in graph.initializer} | {i.name for i in graph.input}
        self.made: dict[str, str] = {}  # role -> tensor of shape [1]

    def shape(self, node: onnx.NodeProto, pair: StatePair, roles: DimRoles) -> list[onnx.NodeProto] | None:
        """The nodes that compute `node`'s output without reading the cache; None where a dimension cannot
        be had from the other inputs."""
        attrs = {a.name: a.i for a in node.attribute}
        rank = len(pair.dims)
        start, end = (_clamp(attrs.get(k, d), rank) for k, d in (("start", 0), ("end", rank)))
        if start >= end:
            return None
        nodes: list[onnx.NodeProto] = []
        pieces = []
        for d in pair.dims[start:end]:
            piece = self._constant(np.array([d], np.int64)) if isinstance(d, int) else self._role(roles.roles.get(d), nodes)
            if piece is None:
                return None
            pieces.append(piece)
        out = node.output[0]
        if len(pieces) == 1:
            nodes.append(helper.make_node("Identity", pieces, [out], name=self._name(node.name)))
        else:
            nodes.append(helper.make_node("Concat", pieces, [out], name=self._name(node.name), axis=0))
        return nodes

    def _role(self, role: str | None, nodes: list[onnx.NodeProto]) -> str | None:
        if role in self.made:
            return self.made[role]
        if role == "past":  # total - seq: the mask's length less the new tokens
            total, seq = self._role("total", nodes), self._role("seq", nodes)
            if total is None or seq is None:
                return None
            out = self._name("past")
            nodes.append(helper.make_node("Sub", [total, seq], [out], name=self._name("past_sub")))
        elif role in self.sources:
            name, axis = self.sources[role]
            whole, out = self._name(f"{name}_shape"), self._name(role)
            nodes.append(helper.make_node("Shape", [name], [whole], name=self._name(f"{name}_shape_op")))
            nodes.append(helper.make_node("Gather", [whole, self._constant(np.array([axis], np.int64))], [out],
                                          name=self._name(f"{role}_gather"), axis=0))
        else:
            return None
        self.made[role] = out
        return out

    def _constant(self, value: np.ndarray) -> str:
        name = self._name("const")
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def _name(self, stem: str) -> str:
        return fresh(f"{PREFIX}/{stem}", self.taken)


def _clamp(i: int, rank: int) -> int:
    """Shape's start/end: negative counts from the end; both clamp to [0, rank]."""
    return min(max(i + rank if i < 0 else i, 0), rank)
