"""Fragments: a Plan's stages cut out of the model, one ONNX model per pipeline stage and per tile."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..cost import Prediction, crossing_tensors
from ..graph import LayerGraph
from ..ingest import Ingested
from ..layers import node_inputs
from ..plan_types import Plan, Stage
from ..spatial.tiles import stage_layout
from .encode import EncodedModel, assemble, value_info
from .tiles import build_tile_model

__all__ = ["EmittedFragment", "build_fragments", "safe_name"]


@dataclass(frozen=True)
class EmittedFragment:
    """One fragment as the manifest lists it, with its encoded ONNX model (written as `file`)."""

    id: str
    device: str
    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    encoded: EncodedModel
    predicted_ms: float

    @property
    def sha256(self) -> str:
        return self.encoded.sha256

    @property
    def data(self) -> bytes:
        return self.encoded.data


def safe_name(name: str) -> str:
    """`name` as a file name: every character but letters, digits, "_", "." and "-" replaced by "_"."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def build_fragments(ing: Ingested, plan: Plan, pred: Prediction,
                    shapes: dict[str, tuple[int | str, ...]] | None = None) -> list[EmittedFragment]:
    """The plan's fragments in stage order: a pipeline stage's layers as fragment f{stage}, a spatial stage
    as one fragment per tile; each carries its predicted time from `pred`. `shapes` (a generative build's,
    emit/state.py fragment_shapes) declares the fragments' inputs and outputs with the dimensions that
    change from step to step dynamic."""
    graph, model = ing.graph, ing.model
    crossing = crossing_tensors(plan, graph)
    leaving = {(t, a) for t, a, _ in crossing}
    frags = []
    for k, stage in enumerate(plan.stages):
        if stage.spatial is not None:
            frags.extend(_tile_fragments(ing, stage, k, pred))
            continue
        layers = graph.layers[stage.lo:stage.hi]
        produced = {t for layer in layers for t in layer.outputs}
        inputs = [t for layer in layers for t in layer.inputs if t not in produced]
        inputs = list(dict.fromkeys(inputs))
        outputs = [t for layer in layers for t in layer.outputs if (t, k) in leaving or t in graph.outputs]
        node_ids = sorted(i for layer in layers for i in layer.nodes)
        fid = f"f{k}"
        encoded = _fragment_model(model, graph, node_ids, inputs, outputs, f"{safe_name(stage.device)}_{fid}", shapes or {})
        frags.append(EmittedFragment(fid, stage.device, f"{safe_name(stage.device)}.{fid}.onnx", tuple(inputs),
                                     tuple(outputs), encoded, pred.stage_ms[k]))
    return frags


def _tile_fragments(ing: Ingested, stage: Stage, k: int, pred: Prediction) -> list[EmittedFragment]:
    """One fragment per tile of every segment of spatial stage k (ids f{stage}s{segment}t{tile})."""
    out = []
    for _, tiles in stage_layout(ing.graph, stage, k):
        for spec, geo in tiles:
            clash = {spec.in_name, spec.out_name} & set(ing.graph.tensors)
            if clash:
                raise RuntimeError(f"tile tensor name {clash.pop()!r} is also a tensor of the model")
            name = f"{safe_name(spec.device)}_{spec.fid}"
            encoded = build_tile_model(ing.model, ing.graph, geo, spec.in_name, spec.out_name, name)
            out.append(EmittedFragment(spec.fid, spec.device, f"{safe_name(spec.device)}.{spec.fid}.onnx",
                                       (spec.in_name,), (spec.out_name,), encoded,
                                       pred.tile_ms[spec.stage, spec.segment, spec.index]))
    return out


def _fragment_model(model, graph: LayerGraph, node_ids, inputs, outputs, name, shapes: dict) -> EncodedModel:
    nodes = [model.graph.node[i] for i in node_ids]
    used = {n for node in nodes for n in node_inputs(node)}
    inits = [i for i in model.graph.initializer if i.name in used]
    return assemble(model, nodes, [value_info(t, graph.tensors[t], shapes.get(t)) for t in inputs],
                    [value_info(t, graph.tensors[t], shapes.get(t)) for t in outputs], inits, name)
