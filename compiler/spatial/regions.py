"""Row-range algebra for spatial tiles: which rows of every tensor a tile of a segment needs (no ONNX)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..graph import Layer, LayerGraph, Window
from .ops import Refused, Transposed, Upsample, transposed_need, transposed_rows, upsample_need, upsample_rows

__all__ = [
    "AXES", "Need", "TileRegion", "SegmentMaps", "NotTileable", "window_need", "tile_pads", "tileable",
    "segment_io", "segment_maps", "segment_region", "spatial_cuts", "window_rows", "window_position",
]

logger = logging.getLogger(__name__)

AXES = (2, 3)  # NCHW height, width
WINDOW_OPS = ("Conv", "MaxPool", "AveragePool", "SpaceToDepth", "Slice", "DepthToSpace", "Resize", "Upsample",
              "ConvTranspose", "QLinearConv")
# Pointwise by ONNX semantics per channel, but statistics over the whole plane: never tiled.
PLANE_GLOBAL = {"InstanceNormalization", "GroupNormalization", "LayerNormalization", "LpNormalization"}


class NotTileable(ValueError):
    """A layer range that cannot run as one spatial segment (the message says why)."""


@dataclass(frozen=True)
class Need:
    """Input rows [lo, hi) (clipped to the tensor) for some output rows, and the image-border padding
    the tile still applies before lo and after hi (0 inside the image: a neighbour's rows are real)."""

    lo: int
    hi: int
    pad_lo: int
    pad_hi: int


def _geometry(win: Window, axis: int) -> tuple[int, int, int, int]:
    """(effective kernel, stride, pad before, pad after) of a window along axis 2 or 3."""
    j = axis - 2
    eff = (win.kernel[j] - 1) * win.dilations[j] + 1
    return eff, win.strides[j], win.pads[j], win.pads[j + 2]


def _need_lo(win: Window, axis: int, a, in_size: int):
    """First input row (and top padding) for output rows starting at a; works on numpy arrays.

    Output row o reads padded rows [o*s, o*s + eff), i.e. input rows [o*s - pb, o*s - pb + eff) (a Slice's
    start is a negative pb). Upsampling and ConvTranspose have their own algebra and no border padding."""
    if isinstance(win, (Upsample, Transposed)):
        lo = _other_need(win, axis, a, a, in_size)[0]
        return lo, np.zeros_like(lo)
    _, s, pb, _ = _geometry(win, axis)
    start = np.asarray(a) * s - pb
    lo = np.clip(start, 0, in_size)
    return lo, lo - start


def _need_hi(win: Window, axis: int, b, in_size: int):
    """End input row (and bottom padding) for output rows ending at b (exclusive).

    Past the real rows the tile pads; a ceil_mode window may overhang even the model's pad_end, and
    the tile keeps ceil_mode with pad_end, which reproduces the model's output count exactly. A Slice's
    pad after is its end less the size (<= 0): it never pads."""
    if isinstance(win, (Upsample, Transposed)):
        hi = _other_need(win, axis, b, b, in_size)[1]
        return hi, np.zeros_like(hi)
    eff, s, pb, pe = _geometry(win, axis)
    end = (np.asarray(b) - 1) * s - pb + eff
    hi = np.clip(end, 0, in_size)
    return hi, np.minimum(end - hi, max(pe, 0))


def _other_need(win: Window, axis: int, a, b, in_size: int):
    need = upsample_need if isinstance(win, Upsample) else transposed_need
    return need(win, axis, a, b, in_size)


def window_rows(win: Window, axis: int, in_size: int) -> int:
    """Output rows onnxruntime produces: with ceil_mode, a last window starting in the end padding is
    dropped (ONNX shape inference may still count it; such layers are refused by `tileable`)."""
    if isinstance(win, Upsample):
        return in_size * win.factors[axis - 2]
    if isinstance(win, Transposed):
        return transposed_rows(win, axis, in_size)
    eff, s, pb, pe = _geometry(win, axis)
    n = in_size + pb + pe - eff
    out = (-(-n // s) if win.ceil_mode else n // s) + 1
    if win.ceil_mode and (out - 1) * s >= in_size + pb:
        out -= 1
    return out


def window_need(win: Window, axis: int, a: int, b: int, in_size: int) -> Need:
    """Input rows and border padding to compute output rows [a, b) of a Type-1 window.

    >>> from compiler.graph import Window
    >>> w = Window("Conv", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1))
    >>> window_need(w, 2, 0, 2, 7)   # rows 0-1 of a 3x3/2 conv over 7 rows
    Need(lo=0, hi=4, pad_lo=1, pad_hi=0)
    >>> window_need(w, 2, 2, 4, 7)
    Need(lo=3, hi=7, pad_lo=0, pad_hi=1)
    """
    lo, pl = _need_lo(win, axis, a, in_size)
    hi, ph = _need_hi(win, axis, b, in_size)
    return Need(int(lo), int(hi), int(pl), int(ph))


def tile_pads(win: Window, axis: int, pad_lo: int, pad_hi: int) -> tuple[int, int, int, int]:
    """The tile operator's ONNX pads: the model's pads with the tiled axis replaced (ceil_mode kept)."""
    pads = list(win.pads)
    pads[axis - 2], pads[axis] = pad_lo, pad_hi
    return tuple(pads)


def window_position(layer: Layer) -> int:
    """Where the layer's window operator is among its nodes: first, or after a Q/DQ unit's DequantizeLinear
    nodes (of its input and weights), which map each element alone."""
    return next((k for k, op in enumerate(layer.op_types) if op != "DequantizeLinear"), 0)


def tileable(graph: LayerGraph, i: int, axis: int) -> str | None:
    """None if layer i can be computed on row tiles of its NCHW output along axis, else the reason."""
    layer = graph.layers[i]
    if isinstance(layer.window, Refused):
        return f"{layer.name}: {layer.window.why}"
    if layer.spatial_type == 3:
        if "DynamicQuantizeLinear" in layer.op_types:
            return (f"{layer.name}: a dynamically quantized unit (DynamicQuantizeLinear computes its scale over the "
                    "whole tensor, so a tile would quantize with another scale)")
        return f"{layer.name}: Type-3 operator {layer.op_types[0]}"
    if PLANE_GLOBAL & set(layer.op_types):
        return f"{layer.name}: normalises over the whole plane"
    if len(layer.outputs) != 1:
        return f"{layer.name}: {len(layer.outputs)} outputs"
    shapes = [graph.tensors.get(t) for t in (*layer.inputs, *layer.outputs)]
    if any(s is None or len(s.shape) != 4 for s in shapes):
        return f"{layer.name}: not all activations are 4-D NCHW"
    out = graph.tensors[layer.outputs[0]].shape[axis]
    if layer.spatial_type == 2:
        if any(graph.tensors[t].shape[axis] != out for t in layer.inputs):
            return f"{layer.name}: inputs broadcast along axis {axis}"
        return None
    win = layer.window
    if win is None or win.op_type not in WINDOW_OPS or layer.op_types[window_position(layer)] != win.op_type:
        return f"{layer.name}: no 2-D window (Conv, pool, strided Slice, SpaceToDepth, DepthToSpace, Resize, ConvTranspose)"
    if len(layer.inputs) != 1:
        return f"{layer.name}: {len(layer.inputs)} activation inputs to a window"
    eff, _, pb, pe = _geometry(win, axis)
    padded = type(win) is Window and win.op_type != "SpaceToDepth"
    if padded and (pb >= eff or pe >= eff):  # a window entirely in padding would read no real row
        return f"{layer.name}: padding wider than the window"
    src, dst = graph.tensors[layer.inputs[0]].shape, graph.tensors[layer.outputs[0]].shape
    for ax in AXES:  # both: a wrong shape on the other axis would mislead the emitter as much
        if window_rows(win, ax, src[ax]) != dst[ax]:
            return f"{layer.name}: the graph says {dst[ax]} on axis {ax}, onnxruntime computes {window_rows(win, ax, src[ax])}"
    return None


def segment_io(graph: LayerGraph, lo: int, hi: int) -> tuple[str, str]:
    """(input, output) tensor of layers [lo, hi) as one segment; NotTileable if not single-in/single-out."""
    produced = {t for i in range(lo, hi) for t in graph.layers[i].outputs}
    external = list(dict.fromkeys(t for i in range(lo, hi) for t in graph.layers[i].inputs if t not in produced))
    outs = graph.live_across(hi) if hi < len(graph.layers) else graph.layers[hi - 1].outputs
    stray = [t for t in graph.outputs if t in produced and t not in outs]
    if len(external) != 1 or len(outs) != 1 or outs[0] not in produced or stray:
        raise NotTileable(f"layers {lo}-{hi}: inputs {external}, outputs {list(outs)}, other graph outputs {stray}")
    return external[0], outs[0]


@dataclass(frozen=True, eq=False)
class SegmentMaps:
    """Tile geometry of segment [lo, hi) along axis, for every tile [a, b) of its output at once.

    Need ranges are separable: the first row of every tensor depends only on a, the end row only on b.
    `first[t][a]` / `end[t][b]` are the rows [first, end) of tensor t a tile [a, b) holds (its consumers'
    union), `in_first[i][a]` / `in_end[i][b]` the rows of layer i's input it reads, and `pad_lo[i][a]` /
    `pad_hi[i][b]` the border padding of layer i's window. Arrays have length size(output) + 1.
    An upsampling layer (DepthToSpace, Resize) computes whole input rows' worth of output: inside the
    segment the tile holds all of it; as the segment output, the tile keeps only [a, b) (`computed`).
    """

    lo: int
    hi: int
    axis: int
    input: str
    output: str
    size: dict[str, int]
    first: dict[str, np.ndarray]
    end: dict[str, np.ndarray]
    in_first: dict[int, np.ndarray]
    in_end: dict[int, np.ndarray]
    pad_lo: dict[int, np.ndarray]
    pad_hi: dict[int, np.ndarray]
    out_of: dict[int, str]  # layer -> its output tensor

    @property
    def rows(self) -> int:
        return self.size[self.output]

    def layer_rows(self, i: int, a, b):
        """Rows of layer i's output computed by tile(s) [a, b) (recomputed halo included)."""
        out = self.out_of[i]
        return self.end[out][b] - self.first[out][a]

    def computed(self, graph: LayerGraph, i: int, reads: tuple[int, int], held: tuple[int, int]) -> tuple[int, int]:
        """Rows of layer i's output its operator computes from input rows `reads` when the tile holds
        `held` of that output: more than held only for upsampling as the segment output."""
        win = graph.layers[i].window
        if isinstance(win, Upsample):
            a, b = upsample_rows(win, self.axis, *reads)
            return int(a), int(b)
        return held


def segment_maps(graph: LayerGraph, lo: int, hi: int, axis: int) -> SegmentMaps:
    """Propagate tile ranges backwards through layers [lo, hi), which may branch and merge inside."""
    if axis not in AXES:
        raise NotTileable(f"axis {axis} is neither height (2) nor width (3)")
    for i in range(lo, hi):
        why = tileable(graph, i, axis)
        if why:
            raise NotTileable(why)
    src, dst = segment_io(graph, lo, hi)
    size = {t: graph.tensors[t].shape[axis] for i in range(lo, hi) for t in (*graph.layers[i].inputs, *graph.layers[i].outputs)}
    idx = np.arange(size[dst] + 1)
    first, end = {dst: idx.copy()}, {dst: idx.copy()}
    in_first, in_end, pad_lo, pad_hi = {}, {}, {}, {}
    for i in range(hi - 1, lo - 1, -1):
        layer = graph.layers[i]
        out = layer.outputs[0]
        if out not in first:
            raise NotTileable(f"{layer.name}: its output is not used inside layers {lo}-{hi}")
        f, e = first[out], end[out]
        if layer.spatial_type == 1:
            n = size[layer.inputs[0]]
            f, pad_lo[i] = _need_lo(layer.window, axis, f, n)
            e, pad_hi[i] = _need_hi(layer.window, axis, e, n)
            if isinstance(layer.window, Upsample) and out != dst:
                # the tile holds all it computes (whole input rows' worth); its consumers read their part
                first[out], end[out] = upsample_rows(layer.window, axis, f, e)
        in_first[i], in_end[i] = f, e
        for t in layer.inputs:
            first[t] = np.minimum(first[t], f) if t in first else f
            end[t] = np.maximum(end[t], e) if t in end else e
    outs = {i: graph.layers[i].outputs[0] for i in range(lo, hi)}
    return SegmentMaps(lo, hi, axis, src, dst, size, first, end, in_first, in_end, pad_lo, pad_hi, outs)


@dataclass(frozen=True)
class TileRegion:
    """What one tile [start, stop) of a segment's output computes.

    rows: tensor -> [lo, hi) it holds (segment input: rows to receive; others: rows computed);
    reads: layer -> [lo, hi) of its input(s) it reads (a sub-range of the input's rows: slice off the
    rest); pads: Type-1 layer -> (pad_lo, pad_hi) border padding on the tiled axis."""

    start: int
    stop: int
    rows: dict[str, tuple[int, int]]
    reads: dict[int, tuple[int, int]]
    pads: dict[int, tuple[int, int]]


def segment_region(maps: SegmentMaps, start: int, stop: int) -> TileRegion:
    if not 0 <= start < stop <= maps.rows:
        raise ValueError(f"tile [{start}, {stop}) is not inside the {maps.rows} rows of {maps.output}")
    rows = {t: (int(maps.first[t][start]), int(maps.end[t][stop])) for t in maps.first}
    reads = {i: (int(maps.in_first[i][start]), int(maps.in_end[i][stop])) for i in maps.in_first}
    pads = {i: (int(maps.pad_lo[i][start]), int(maps.pad_hi[i][stop])) for i in maps.pad_lo}
    return TileRegion(start, stop, rows, reads, pads)


def spatial_cuts(graph: LayerGraph, axis: int, start: int = 0) -> tuple[int, ...]:
    """Block boundaries from `start` through the longest prefix of blocks tileable along axis.

    Consecutive entries delimit single-entry/single-exit blocks; any run of them is a valid segment.
    Returns (start,) when not even the first block can be tiled. A block cut whose tensor is also a
    graph output ends the prefix (fusing across it would lose that output). A cut that leaves the next
    block with two inputs (a skip from a graph input, which block cuts do not see) is dropped: the
    blocks on either side merge."""
    cuts = [start]
    for lo, hi in graph.blocks:
        if lo < start:
            continue
        why = next((w for i in range(lo, hi) if (w := tileable(graph, i, axis))), None)
        if why:
            logger.debug("spatial prefix ends at layer %d: %s", lo, why)
            break
        back = next((j for j in range(len(cuts) - 1, -1, -1) if _single_io(graph, cuts[j], hi)), None)
        if back is None:
            continue
        del cuts[back + 1:]
        cuts.append(hi)
        if segment_io(graph, cuts[-2], hi)[1] in graph.outputs:
            break
    return tuple(cuts)


def _single_io(graph: LayerGraph, lo: int, hi: int) -> bool:
    try:
        segment_io(graph, lo, hi)
    except NotTileable:
        return False
    return True
