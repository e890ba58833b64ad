"""A generative model ingested once per phase: the prompt's prefill and a decode step, each with its dynamic
dimensions pinned, and which dimensions of every tensor change from step to step (`load_phases`).

The pins (batch 1):
- prefill: seq = prompt_len, past = 0 (the cache inputs are empty);
- decode: seq = 1, past = `priced_past`, the mean past of the decode steps of one generation: they run with
  past = prompt_len .. max_context - 1, so the mean is (prompt_len + max_context - 1) / 2, rounded down.
  A decode step's cost grows linearly with its past (attention reads the cache), so the step priced at
  the mean past is priced at the mean step;
- a probe (seq = 2, past = 3) that only tells, with the other two, which dimensions of each tensor vary.

Shape reads of the caches are first taken from the token and mask inputs (cache_shapes.py), so that they do
not tie every cache to the top of the graph, and what that made one computation is merged (duplicates.py).
The decode step's graph is the one planned: its `unsplit` ranges keep each cache, and what grows with it, on
one stage (`state_spans`), and its `riders` let the tables every decoder layer reads ride along any cut.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from ..errors import UserError
from ..graph import LayerGraph
from ..layers import build_layer_graph
from . import Ingested, file_sha256
from .cache_shapes import detach_cache_shapes
from .duplicates import merge_duplicates
from .checks import read_model
from .normalise import normalise
from .shapes import infer_shapes, pin_shapes
from .state import DimRoles, StatePair, dim_roles, find_state, input_dims

__all__ = ["GenerateOptions", "Phases", "load_phases", "priced_past", "state_spans", "riders"]

PROBE = (2, 3)  # (seq, past) of the probe: distinct from any prefill (past 0) and decode (seq 1) pin


@dataclass(frozen=True)
class GenerateOptions:
    """`edgec compile --generate`'s options."""

    max_context: int = 512
    prompt_len: int = 64
    state: tuple[tuple[str, str], ...] = ()  # --state IN=OUT pairs

    def check(self) -> None:
        if self.prompt_len < 1 or self.max_context <= self.prompt_len:
            raise UserError(f"--prompt-len {self.prompt_len} and --max-context {self.max_context}: need "
                            "1 <= prompt-len < max-context (a generation decodes at least one token)")


def priced_past(options: GenerateOptions) -> int:
    """The past a decode step is priced at: the mean over the steps of one generation (module docstring)."""
    return (options.prompt_len + options.max_context - 1) // 2


@dataclass(frozen=True, eq=False)
class Phases:
    """The model per phase (same nodes, same layers), its state pairs and what its dimensions are."""

    decode: Ingested
    prefill: Ingested
    pairs: tuple[StatePair, ...]
    roles: DimRoles
    options: GenerateOptions
    varying: dict[str, tuple[bool, ...]]  # tensor -> per dimension, whether it changes from step to step
    grows: frozenset[str] = frozenset()  # tensors with a dimension that grows with the context (`_grows`)

    @property
    def priced_past(self) -> int:
        return priced_past(self.options)


def load_phases(path: str | Path, options: GenerateOptions) -> Phases:
    """Read and normalise the model once; pin and shape it per phase; check that the phases' layers agree."""
    options.check()
    path = Path(path)
    model = normalise(read_model(path), path)
    pairs = find_state(model, dict(options.state), str(path))
    roles = dim_roles(model, pairs, str(path))
    detach_cache_shapes(model, pairs, roles)  # before the copies: every phase has the same nodes
    merge_duplicates(model)  # what the past reads computed once per layer, now the same
    sha = file_sha256(path)
    past = priced_past(options)
    prefill = _pinned(_copy(model), path, sha, roles, pairs, options.prompt_len, 0)
    probe = _pinned(_copy(model), path, sha, roles, pairs, *PROBE)
    decode = _pinned(model, path, sha, roles, pairs, 1, past)  # the one emitted from: no copy
    for other in (prefill, probe):
        if [layer.nodes for layer in other.graph.layers] != [layer.nodes for layer in decode.graph.layers]:
            raise UserError("--generate: the model's layers differ between prefill and decode", str(path))
    grows = _grows((prefill.graph, decode.graph, probe.graph), options, past)
    spans = state_spans(decode.graph, pairs, grows, str(path))
    decode = replace(decode, graph=replace(decode.graph, unsplit=spans, riders=riders(decode.graph, spans)))
    varying = {}
    for name, t in decode.graph.tensors.items():
        shapes = [g.graph.tensors[name].shape for g in (prefill, probe) if name in g.graph.tensors]
        varying[name] = tuple(any(len(s) != len(t.shape) or s[i] != d for s in shapes) for i, d in enumerate(t.shape))
    return Phases(decode, prefill, pairs, roles, options, varying, frozenset(grows))


def state_spans(graph: LayerGraph, pairs: tuple[StatePair, ...], grows: set[str], path: str) -> tuple[tuple[int, int], ...]:
    """Per pair, the (first, last) layer that reads or writes its cache or a tensor computed from it that
    grows with the context (`grows`: the cache repeated for grouped-query heads, the attention scores): one
    stage must hold them all, so that neither the cache nor what grows with it crosses the network."""
    spans = []
    for p in pairs:
        layers: set[int] = set()
        todo, seen = [p.input], {p.input}
        while todo:
            t = todo.pop()
            users = graph.consumers.get(t, ())
            layers.update(users)
            if t in graph.producer:
                layers.add(graph.producer[t])
            for i in users:
                for out in graph.layers[i].outputs:
                    if out in grows and out not in seen:
                        seen.add(out)
                        todo.append(out)
        if p.output in graph.producer:
            layers.add(graph.producer[p.output])
        layers.update(graph.consumers.get(p.output, ()))
        if not layers:
            raise UserError(f"state {p.input!r} -> {p.output!r}: no operator reads or writes it", path)
        spans.append((min(layers), max(layers)))
    return tuple(spans)


def riders(graph: LayerGraph, spans: tuple[tuple[int, int], ...]) -> frozenset[str]:
    """Tensors live into two or more decoder layers (groups of overlapping spans): the rotary tables and the
    attention mask that every layer reads. A decode step's hidden state is one token, as small as they are,
    so the size rule of pipeline cuts (graph.py is_small) would leave no cut between decoder layers."""
    starts: list[int] = []
    ends = -1  # the last layer of the group so far (spans start at layer 0 or later)
    for lo, hi in sorted(spans):
        if lo > ends:
            starts.append(lo)
        ends = max(ends, hi)
    out = set()
    for t, p in graph.producer.items():
        users = graph.consumers.get(t, ())
        if users and sum(1 for s in starts if p < s <= max(users)) >= 2:
            out.add(t)
    return frozenset(out)


def _grows(phases_graphs, options: "GenerateOptions", past: int) -> set[str]:
    """Tensors with a dimension that grows with the context: at the prefill, decode and probe pins, sized as
    the past (0, past, 3) or the total (prompt_len, past + 1, 5)."""
    prefill, decode, probe = phases_graphs
    grow = {(0, past, PROBE[1]), (options.prompt_len, past + 1, sum(PROBE))}
    out = set()
    for name, t in decode.tensors.items():
        shapes = [g.tensors[name].shape if name in g.tensors else () for g in (prefill, decode, probe)]
        if len({len(s) for s in shapes}) == 1 and any(dims in grow for dims in zip(*shapes)):
            out.add(name)
    return out


LIGHT_ABOVE = 1 << 20  # bytes: a weight this large is a matrix, never a constant a pass reads


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model for a phase that is only shaped and priced, never emitted: weights beyond LIGHT_ABOVE keep
    their name, type and dims (all that shapes and parameter counts read) without their data, so a 2 GB
    decoder is not copied twice."""
    out = onnx.ModelProto()
    out.ir_version = model.ir_version
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    g, src = out.graph, model.graph
    g.name = src.name
    for name in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(g, name).extend(getattr(src, name))
    for init in src.initializer:
        t = g.initializer.add()
        if init.ByteSize() > LIGHT_ABOVE:
            t.name, t.data_type = init.name, init.data_type
            t.dims.extend(init.dims)
        else:
            t.CopyFrom(init)
    return out


def _pinned(model: onnx.ModelProto, path: Path, sha: str, roles: DimRoles, pairs: tuple[StatePair, ...],
            seq: int, past: int) -> Ingested:
    inits = {i.name for i in model.graph.initializer}
    shapes = {vi.name: roles.pin(input_dims(vi), seq, past) for vi in model.graph.input if vi.name not in inits}
    copy = pin_shapes(model, shapes, path, empty=frozenset(p.input for p in pairs) if past == 0 else frozenset())
    copy = infer_shapes(copy, path)
    graph = build_layer_graph(copy)
    if not graph.layers:
        raise UserError("the model has no operators to run", str(path))
    return Ingested(path=path, sha256=sha, model=copy, graph=graph)
