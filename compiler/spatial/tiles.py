"""Tile fragments: a segment's ONNX nodes restricted to the rows one tile computes (pads and slices rewritten)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import LayerGraph
from ..fragment import EncodedModel, assemble, value_info
from ..layers import node_inputs
from ..plan_types import Stage
from .regions import SegmentMaps, TileRegion, segment_maps, segment_region, tile_pads

__all__ = ["tile_name", "TileSpec", "Geometry", "stage_layout", "build_tile_model"]

# A tile's row math on each tiled axis: ((maps, region),) along the group's axis, or, for a 2-D grid
# tile, the height pair then the width pair (windows are separable: each axis is independent).
Geometry = tuple[tuple[SegmentMaps, TileRegion], ...]

# Operators whose operands broadcast numpy-style: a constant operand may span the tiled axis. Others
# (BatchNormalization's per-channel vectors, Clip's bounds, ...) never index rows.
BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Max", "Min", "Mean", "Sum", "Where", "Equal", "Greater",
             "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Mod"}


def tile_name(tensor: str, device: str, start: int, stop: int, cols: tuple[int, int] | None = None) -> str:
    """Store name of rows [start, stop) (and, for a 2-D tile, columns cols) of graph tensor `tensor`
    held by `device`: `t@dev[a:b]`, or `t@dev[a:b,c:d]`.

    The same name always means the same rows on the same device, so a piece that is exactly what a
    fragment needs is used as is; graph names never contain "@...[a:b]" in practice (checked in emit)."""
    span = f"{start}:{stop}" if cols is None else f"{start}:{stop},{cols[0]}:{cols[1]}"
    return f"{tensor}@{device}[{span}]"


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
    in_cols: tuple[int, int] | None = None  # a 2-D tile's columns (axis 3); None: all of them
    out_cols: tuple[int, int] | None = None

    @property
    def fid(self) -> str:
        return f"f{self.stage}s{self.segment}t{self.index}"

    @property
    def in_name(self) -> str:
        return tile_name(self.input, self.device, *self.in_rows, self.in_cols)

    @property
    def out_name(self) -> str:
        return tile_name(self.output, self.device, *self.out_rows, self.out_cols)

    @property
    def axes(self) -> tuple[int, ...]:
        return (self.axis,) if self.out_cols is None else (2, 3)

    @property
    def in_box(self) -> tuple[tuple[int, int], ...]:
        """The input's range on each of `axes`."""
        return (self.in_rows,) if self.in_cols is None else (self.in_rows, self.in_cols)

    @property
    def out_box(self) -> tuple[tuple[int, int], ...]:
        return (self.out_rows,) if self.out_cols is None else (self.out_rows, self.out_cols)


def stage_layout(graph: LayerGraph, stage: Stage, k: int) -> list[tuple[SegmentMaps, list[tuple[TileSpec, Geometry]]]]:
    """Per segment of spatial stage k: its row maps (along the group's axis) and each tile's spec and
    geometry (one (maps, region) pair per tiled axis; a grid tile adds the width's).

    Consecutive segments must chain (segment j's input is segment j-1's output): the emitter moves only
    that one tensor between segments."""
    out = []
    prev = None
    for j, seg in enumerate(stage.spatial.segments):
        maps = segment_maps(graph, seg.lo, seg.hi, stage.spatial.axis)
        cross = segment_maps(graph, seg.lo, seg.hi, 3) if stage.spatial.grid else None
        if prev is not None and maps.input != prev:
            raise ValueError(f"segment {seg.lo}-{seg.hi} reads {maps.input}, not the previous segment's {prev}")
        tiles = []
        for i, t in enumerate(seg.tiles):
            geo = ((maps, segment_region(maps, t.start, t.stop)),)
            if cross is not None:
                geo += ((cross, segment_region(cross, *t.cols)),)
            in_cols = geo[1][1].rows[maps.input] if cross is not None else None
            spec = TileSpec(k, j, i, t.device, seg.lo, seg.hi, maps.axis, maps.input, geo[0][1].rows[maps.input],
                            maps.output, (t.start, t.stop), in_cols, t.cols)
            tiles.append((spec, geo))
        out.append((maps, tiles))
        prev = maps.output
    return out


class _Builder:
    """Accumulates one tile's nodes and initializers; hands out names no other tensor of it uses."""

    def __init__(self, model: onnx.ModelProto, graph: LayerGraph, geo: Geometry):
        self.model, self.graph, self.geo = model, graph, geo
        self.maps = geo[0][0]  # layers, input and output: the same on every axis
        self.inits = {i.name: i for i in model.graph.initializer}
        self.taken = set(self.inits) | {o for n in model.graph.node for o in n.output} | set(graph.tensors)
        self.nodes: list[onnx.NodeProto] = []
        self.new_inits: dict[str, onnx.TensorProto] = {}
        self.slices: dict[tuple, str] = {}
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)

    def fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}~{n}"
        self.taken.add(name)
        return name

    def slice(self, src: str, tensor: str, cut: tuple[tuple[int, int, int], ...], label: str) -> str:
        """The ranges `cut` ((axis, start, stop), relative to what `src` holds) of an activation, one
        Slice node per distinct cut; `label` names the ranges ("a:b" or "a:b,c:d")."""
        key = (src, cut)
        if key not in self.slices:
            out = self.fresh(f"{tensor}@slice[{label}]")
            self.nodes.append(self._slice_node(src, out, cut))
            self.slices[key] = out
        return self.slices[key]

    def _slice_node(self, src: str, out: str, cut: tuple[tuple[int, int, int], ...]) -> onnx.NodeProto:
        axes, starts, ends = ([c[j] for c in cut] for j in range(3))
        if self.opset < 10:  # Slice-1 takes its ranges as attributes
            return helper.make_node("Slice", [src], [out], starts=starts, ends=ends, axes=axes, name=out)
        names = []
        for what, v in (("starts", starts), ("ends", ends), ("axes", axes)):
            name = self.fresh(f"{out}:{what}")
            self.new_inits[name] = numpy_helper.from_array(np.array(v, dtype=np.int64), name)
            names.append(name)
        return helper.make_node("Slice", [src, *names], [out], name=out)

    def init_rows(self, name: str, layer: int) -> str:
        """An initializer that spans a tiled axis (a pointwise operand of the full plane): its tile's rows
        (and columns)."""
        init = self.inits[name]
        arr, label = None, []
        for maps, reg in self.geo:
            out = maps.out_of[layer]
            size, (r0, r1) = maps.size[out], reg.rows[out]
            label.append(f"{r0}:{r1}")
            at = maps.axis - (4 - len(init.dims))  # numpy broadcasting aligns trailing axes
            if at < 0 or init.dims[at] == 1 or (r0, r1) == (0, size):
                continue
            if init.dims[at] != size:
                raise ValueError(f"initializer {name} {list(init.dims)} does not broadcast over {out}")
            arr = np.take(numpy_helper.to_array(init) if arr is None else arr, range(r0, r1), axis=at)
        if arr is None:
            return name
        sliced = self.fresh(f"{name}@rows[{','.join(label)}]")
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
    """Copy the segment's nodes in order, reading each layer's inputs at exactly the rows (and columns)
    it needs."""
    maps, graph = b.maps, b.graph
    held = {maps.input: in_name}  # graph tensor -> name of the rows this tile holds
    for i in range(maps.lo, maps.hi):
        layer = graph.layers[i]
        feed = {}
        for t in layer.inputs:
            # per tiled axis: the rows read, relative to the rows held
            rel = [(m.axis, reg.reads[i][0] - reg.rows[t][0], reg.reads[i][1] - reg.rows[t][0]) for m, reg in b.geo]
            cut = tuple(c for c, (_, reg) in zip(rel, b.geo) if reg.rows[t] != reg.reads[i])
            src = held.get(t, t)
            feed[t] = b.slice(src, t, cut, ",".join(f"{s}:{e}" for _, s, e in rel)) if cut else src
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
                _set_pads(node, _pads(win, b.geo, i))
            b.nodes.append(node)
        held[layer.outputs[0]] = layer.outputs[0] if layer.outputs[0] != maps.output else out_name


def _pads(win, geo: Geometry, i: int) -> tuple[int, ...]:
    """Layer i's window pads with every tiled axis's border padding put in (the others kept)."""
    for maps, reg in geo:
        win = replace(win, pads=tile_pads(win, maps.axis, *reg.pads[i]))
    return win.pads


def _value_info(graph: LayerGraph, tensor: str, name: str, box: list[tuple[int, int, int]]) -> onnx.ValueInfoProto:
    """A tile tensor's type: the graph tensor's with each (axis, start, stop) of box as the extent."""
    info = graph.tensors[tensor]
    shape = list(info.shape)
    for axis, start, stop in box:
        shape[axis] = stop - start
    return value_info(name, info, tuple(shape))


def build_tile_model(model: onnx.ModelProto, graph: LayerGraph, geo: Geometry, in_name: str, out_name: str,
                     name: str) -> EncodedModel:
    """ONNX model computing the tile [reg.start, reg.stop) on each axis of `geo` of the segment output as
    `out_name` from the rows reg.rows[input] of the segment input fed as `in_name`; checked, holding only
    the weights it uses."""
    maps = geo[0][0]
    b = _Builder(model, graph, geo)
    b.taken |= {in_name, out_name}
    _tile_nodes(b, in_name, out_name)
    used = {x for n in b.nodes for x in node_inputs(n)}
    inits = [i for i in model.graph.initializer if i.name in used] + [v for k, v in b.new_inits.items() if k in used]
    in_box = [(m.axis, *reg.rows[maps.input]) for m, reg in geo]
    out_box = [(m.axis, reg.start, reg.stop) for m, reg in geo]
    return assemble(model, b.nodes, [_value_info(graph, maps.input, in_name, in_box)],
                    [_value_info(graph, maps.output, out_name, out_box)], inits, name)
