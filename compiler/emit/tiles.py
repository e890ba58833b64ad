"""Tile fragments: a segment's ONNX nodes restricted to the rows one tile computes (pads and slices rewritten)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import LayerGraph, Window
from ..layers import node_inputs
from ..names import fresh
from ..spatial.ops import SliceWindow, Transposed, Upsample, transposed_attrs
from ..spatial.regions import tile_pads, window_position
from ..spatial.tiles import Geometry
from .encode import EncodedModel, assemble, value_info

__all__ = ["build_tile_model"]

# Operators whose operands broadcast numpy-style: a constant operand may span the tiled axis. Others
# (BatchNormalization's per-channel vectors, Clip's bounds, ...) never index rows.
BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Max", "Min", "Mean", "Sum", "Where", "Equal", "Greater",
             "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Mod"}


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
        return fresh(base, self.taken, "~")

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
    _set_ints(node, "pads", pads)


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
        at = window_position(layer)
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
            crop = _rewrite(b, node, win, i) if pos == at and win is not None else ()
            b.nodes.append(node)
            if crop:
                _crop_output(b, node, crop)
        held[layer.outputs[0]] = layer.outputs[0] if layer.outputs[0] != maps.output else out_name


def _rewrite(b: _Builder, node: onnx.NodeProto, win: Window, i: int) -> tuple[tuple[int, int, int], ...]:
    """Rewrite layer i's leading operator for the tile's rows; returns the output rows to keep, per tiled axis
    (axis, start, stop relative to what the operator computes), where it computes more than the tile holds."""
    if isinstance(win, SliceWindow):
        _rewrite_slice(b, node, i)
    elif isinstance(win, Transposed):
        _rewrite_transposed(b, node, win, i)
    elif isinstance(win, Upsample):
        return _rewrite_upsample(b, node, win, i)
    elif win.op_type in ("Conv", "MaxPool", "AveragePool", "QLinearConv"):
        _set_pads(node, _pads(win, b.geo, i))
    return ()


def _rewrite_slice(b: _Builder, node: onnx.NodeProto, i: int) -> None:
    """The tile feeds exactly the rows the slice reads (start on its first row): slice [0, rows) at the
    model's step on each tiled axis the node slices."""
    tiled = {m.axis: reg.reads[i][1] - reg.reads[i][0] for m, reg in b.geo}
    if len(node.input) == 1:  # Slice-1: attributes
        axes = list(_attr(node, "axes", range(len(_attr(node, "starts")))))
        starts, ends = list(_attr(node, "starts")), list(_attr(node, "ends"))
    else:
        starts, ends = (numpy_helper.to_array(b.inits[node.input[k]]).tolist() for k in (1, 2))
        axes = numpy_helper.to_array(b.inits[node.input[3]]).tolist() if len(node.input) > 3 and node.input[3] \
            else list(range(len(starts)))
    for j, ax in enumerate(axes):
        if ax % 4 in tiled:
            starts[j], ends[j] = 0, tiled[ax % 4]
    if len(node.input) == 1:
        _set_ints(node, "starts", starts)
        _set_ints(node, "ends", ends)
        return
    for k, values, what in ((1, starts, "starts"), (2, ends, "ends")):
        name = b.fresh(f"{node.output[0]}:{what}")
        b.new_inits[name] = numpy_helper.from_array(np.array(values, dtype=np.int64), name)
        node.input[k] = name


def _rewrite_transposed(b: _Builder, node: onnx.NodeProto, win: Transposed, i: int) -> None:
    pads, out_pad = list(win.pads), list(win.output_padding)
    for m, reg in b.geo:
        (lo, hi), (a, e) = reg.reads[i], reg.rows[m.out_of[i]]
        pads[m.axis - 2], pads[m.axis], out_pad[m.axis - 2] = transposed_attrs(win, m.axis, lo, hi, a, e)
    _set_ints(node, "pads", pads)
    _set_ints(node, "output_padding", out_pad)


def _rewrite_upsample(b: _Builder, node: onnx.NodeProto, win: Upsample, i: int) -> tuple[tuple[int, int, int], ...]:
    """A Resize given sizes gets the tile's (its scales are the model's); the tile keeps the rows it holds
    of what it computes (all of it inside a segment, [a, b) as the segment output)."""
    crop = []
    for m, reg in b.geo:
        (lo, hi), held = reg.reads[i], reg.rows[m.out_of[i]]
        a, e = m.computed(b.graph, i, (lo, hi), held)
        if (a, e) != held:
            crop.append((m.axis, held[0] - a, held[1] - a))
    if node.op_type == "Resize" and len(node.input) > 3 and node.input[3]:
        sizes = numpy_helper.to_array(b.inits[node.input[3]]).tolist()
        axes = [a % 4 for a in _attr(node, "axes", range(4))]
        for m, reg in b.geo:
            lo, hi = reg.reads[i]
            sizes[axes.index(m.axis)] = (hi - lo) * win.factors[m.axis - 2]
        name = b.fresh(f"{node.output[0]}:sizes")
        b.new_inits[name] = numpy_helper.from_array(np.array(sizes, dtype=np.int64), name)
        node.input[3] = name
    return tuple(crop)


def _crop_output(b: _Builder, node: onnx.NodeProto, crop: tuple[tuple[int, int, int], ...]) -> None:
    """Route the operator's output through a Slice keeping `crop` (its followers read the kept rows)."""
    kept = node.output[0]
    full = b.fresh(f"{kept}@computed")
    node.output[0] = full
    b.nodes.append(b._slice_node(full, kept, crop))


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _set_ints(node: onnx.NodeProto, name: str, values) -> None:
    for a in node.attribute:
        if a.name == name:
            del a.ints[:]
            a.ints.extend(int(v) for v in values)
            return
    node.attribute.append(helper.make_attribute(name, [int(v) for v in values]))


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
