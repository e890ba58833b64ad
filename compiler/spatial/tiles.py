"""Tile fragments: a segment's ONNX nodes restricted to the rows one tile computes (pads and slices rewritten)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import LayerGraph
from ..fragment import EncodedModel, assemble, value_info
from ..layers import node_inputs
from ..plan.types import Stage
from .regions import SegmentMaps, TileRegion, segment_maps, segment_region, tile_pads

__all__ = ["tile_name", "TileSpec", "stage_layout", "build_tile_model"]

# Operators whose operands broadcast numpy-style: a constant operand may span the tiled axis. Others
# (BatchNormalization's per-channel vectors, Clip's bounds, ...) never index rows.
BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Max", "Min", "Mean", "Sum", "Where", "Equal", "Greater",
             "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Mod"}


def tile_name(tensor: str, device: str, start: int, stop: int) -> str:
    """Store name of rows [start, stop) of graph tensor `tensor` held by `device`.

    The same name always means the same rows on the same device, so a piece that is exactly what a
    fragment needs is used as is; graph names never contain "@...[a:b]" in practice (checked in emit)."""
    return f"{tensor}@{device}[{start}:{stop}]"


@dataclass(frozen=True)
class TileSpec:
    """One tile fragment of a spatial stage: segment j's layers on `device`, producing rows `out_rows` of
    `output` from rows `in_rows` of `input` (the segment's input, clipped to the tensor)."""

    stage: int
    segment: int
    index: int
    device: str
    lo: int
    hi: int
    axis: int
    input: str
    in_rows: tuple[int, int]
    output: str
    out_rows: tuple[int, int]

    @property
    def fid(self) -> str:
        return f"f{self.stage}s{self.segment}t{self.index}"

    @property
    def in_name(self) -> str:
        return tile_name(self.input, self.device, *self.in_rows)

    @property
    def out_name(self) -> str:
        return tile_name(self.output, self.device, *self.out_rows)


def stage_layout(graph: LayerGraph, stage: Stage, k: int) -> list[tuple[SegmentMaps, list[tuple[TileSpec, TileRegion]]]]:
    """Per segment of spatial stage k: its row maps and each tile's spec and region.

    Consecutive segments must chain (segment j's input is segment j-1's output): the emitter moves only
    that one tensor between segments."""
    out = []
    prev = None
    for j, seg in enumerate(stage.spatial.segments):
        maps = segment_maps(graph, seg.lo, seg.hi, stage.spatial.axis)
        if prev is not None and maps.input != prev:
            raise ValueError(f"segment {seg.lo}-{seg.hi} reads {maps.input}, not the previous segment's {prev}")
        tiles = []
        for i, t in enumerate(seg.tiles):
            reg = segment_region(maps, t.start, t.stop)
            spec = TileSpec(k, j, i, t.device, seg.lo, seg.hi, maps.axis, maps.input, reg.rows[maps.input],
                            maps.output, (t.start, t.stop))
            tiles.append((spec, reg))
        out.append((maps, tiles))
        prev = maps.output
    return out


class _Builder:
    """Accumulates one tile's nodes and initializers; hands out names no other tensor of it uses."""

    def __init__(self, model: onnx.ModelProto, graph: LayerGraph, maps: SegmentMaps, reg: TileRegion):
        self.model, self.graph, self.maps, self.reg = model, graph, maps, reg
        self.inits = {i.name: i for i in model.graph.initializer}
        self.taken = set(self.inits) | {o for n in model.graph.node for o in n.output} | set(graph.tensors)
        self.nodes: list[onnx.NodeProto] = []
        self.new_inits: dict[str, onnx.TensorProto] = {}
        self.slices: dict[tuple[str, int, int], str] = {}
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)

    def fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}~{n}"
        self.taken.add(name)
        return name

    def slice(self, src: str, tensor: str, start: int, stop: int) -> str:
        """Rows [start, stop) (relative to what `src` holds) of an activation, one Slice node per range."""
        key = (src, start, stop)
        if key not in self.slices:
            out = self.fresh(f"{tensor}@slice[{start}:{stop}]")
            self.nodes.append(self._slice_node(src, out, start, stop))
            self.slices[key] = out
        return self.slices[key]

    def _slice_node(self, src: str, out: str, start: int, stop: int) -> onnx.NodeProto:
        axis = self.maps.axis
        if self.opset < 10:  # Slice-1 takes its ranges as attributes
            return helper.make_node("Slice", [src], [out], starts=[start], ends=[stop], axes=[axis], name=out)
        names = []
        for what, v in (("starts", start), ("ends", stop), ("axes", axis)):
            name = self.fresh(f"{out}:{what}")
            self.new_inits[name] = numpy_helper.from_array(np.array([v], dtype=np.int64), name)
            names.append(name)
        return helper.make_node("Slice", [src, *names], [out], name=out)

    def init_rows(self, name: str, layer: int) -> str:
        """An initializer that spans the tiled axis (a pointwise operand of the full plane): its tile rows."""
        init = self.inits[name]
        out = self.maps.out_of[layer]
        size, (r0, r1) = self.maps.size[out], self.reg.rows[out]
        at = self.maps.axis - (4 - len(init.dims))  # numpy broadcasting aligns trailing axes
        if at < 0 or init.dims[at] == 1 or (r0, r1) == (0, size):
            return name
        if init.dims[at] != size:
            raise ValueError(f"initializer {name} {list(init.dims)} does not broadcast over {out}")
        sliced = self.fresh(f"{name}@rows[{r0}:{r1}]")
        arr = np.take(numpy_helper.to_array(init), range(r0, r1), axis=at)
        self.new_inits[sliced] = numpy_helper.from_array(arr, sliced)
        return sliced


def _set_pads(node: onnx.NodeProto, pads: tuple[int, ...]) -> None:
    for a in node.attribute:
        if a.name == "pads":
            del a.ints[:]
            a.ints.extend(pads)
            return
    node.attribute.append(helper.make_attribute("pads", list(pads)))


def _tile_nodes(b: _Builder, in_name: str, out_name: str) -> None:
    """Copy the segment's nodes in order, reading each layer's inputs at exactly the rows it needs."""
    maps, reg, graph = b.maps, b.reg, b.graph
    held = {maps.input: in_name}  # graph tensor -> name of the rows this tile holds
    for i in range(maps.lo, maps.hi):
        layer = graph.layers[i]
        r0, r1 = reg.reads[i]
        feed = {}
        for t in layer.inputs:
            h0, h1 = reg.rows[t]
            src = held.get(t, t)
            feed[t] = src if (h0, h1) == (r0, r1) else b.slice(src, t, r0 - h0, r1 - h0)
        win = layer.window
        for pos, k in enumerate(layer.nodes):
            node = onnx.NodeProto()
            node.CopyFrom(b.model.graph.node[k])
            ins = [feed.get(x, x) for x in node.input]
            if node.op_type in BROADCAST:
                ins = [b.init_rows(x, i) if x in b.inits else x for x in ins]
            del node.input[:]
            node.input.extend(ins)
            outs = [out_name if o == maps.output else o for o in node.output]
            del node.output[:]
            node.output.extend(outs)
            if pos == 0 and win is not None:
                _set_pads(node, tile_pads(win, maps.axis, *reg.pads[i]))
            b.nodes.append(node)
        held[layer.outputs[0]] = layer.outputs[0] if layer.outputs[0] != maps.output else out_name


def _value_info(graph: LayerGraph, tensor: str, name: str, axis: int, rows: tuple[int, int]) -> onnx.ValueInfoProto:
    info = graph.tensors[tensor]
    shape = list(info.shape)
    shape[axis] = rows[1] - rows[0]
    return value_info(name, info, tuple(shape))


def build_tile_model(model: onnx.ModelProto, graph: LayerGraph, maps: SegmentMaps, reg: TileRegion,
                     in_name: str, out_name: str, name: str) -> EncodedModel:
    """ONNX model computing rows [reg.start, reg.stop) of the segment output as `out_name` from the rows
    reg.rows[input] of the segment input fed as `in_name`; checked, holding only the weights it uses."""
    b = _Builder(model, graph, maps, reg)
    b.taken |= {in_name, out_name}
    _tile_nodes(b, in_name, out_name)
    used = {x for n in b.nodes for x in node_inputs(n)}
    inits = [i for i in model.graph.initializer if i.name in used] + [v for k, v in b.new_inits.items() if k in used]
    return assemble(model, b.nodes, [_value_info(graph, maps.input, in_name, maps.axis, reg.rows[maps.input])],
                    [_value_info(graph, maps.output, out_name, maps.axis, (reg.start, reg.stop))], inits, name)
