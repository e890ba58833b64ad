"""Tile cost model: what one tile costs on a device (compute, the copy assembling its input, layout
conversions), and a segment's tiles (`SegmentCost`). The search's step score is tile_steps.py; a spatial
stage's event timeline, with its halo, scatter and gather transfers, is stage_timeline.py.

A tile computing `rows` of layer i's `total` output rows (recomputed halo rows included) on device d costs

    tile_ms = oh + (layer_ms - oh) * rows / total                              (no efficiency curve)
    tile_ms = oh + ((layer_ms - oh - priced) * eff(E) / eff(E * rows / total) + priced) * rows / total

oh: what every tile pays again (CostTable.overhead_ms): the layer's per-operator overhead and, where the
figures measured weight_gbps, reading all of the layer's weights in (a tile needs every weight); priced:
the op-table share of layer_ms (priced per output element, so linear in a tile's elements); eff: the
device figures' efficiency curve for the layer's class (cost/table.py CURVE_OF_CLASS: for a conv its
`conv_positions` curve, else its `conv` one; a depthwise conv's own, else conv's; gemm for gemm),
piecewise linear in log(E) between its points and flat beyond them; E: the layer's size as that curve
counts it, its output positions (height x width) for `conv_positions`, else its output elements.  A
whole-layer tile costs exactly layer_ms.

A tile whose input is assembled from more than one part (its own rows and halo rows from neighbours:
wherever the emitter writes a `concat` step, compiler/emit/schedule.py _assemble) first copies those
parts into one tensor, every byte read once and written once, at the device's memory bandwidth:

    copy_ms = 2 * assembled_bytes / (memory_gbps * 1e6)

assembled_bytes is the tile's input box (halo included); for a grid, each band of several boxes is
assembled along the width, then the bands along the height, and each of those concatenations counts.
The copy is part of the tile's time (`tile_ms` of predict_stage, hence the tile fragment's predicted_ms,
which simulate replays and the emulator pads to), and StepModel prices it the same way.  So is the
runtime's cost of running a fragment in a plan (CostTable.run_ms, the profile's `runtime.run_ms`): every
tile is one fragment run, which runs slower than the profile's hot timings after the runtime's work
between runs; it is added after the copy, in both places.  Last comes, where another device of the same
machine (the cluster's `hosts:`) runs a tile of the same segment, its weights' streaming beside that one
(CostTable.shared_weights): in predict_stage per segment, in StepModel.finish once the busy devices are known.  A first
segment's tiles read one holder's tensor (the scatter) and copy nothing.  The gather's concatenation
of the tiles' outputs on the stage's device is not priced: no fragment run carries it, and simulate
(runtime/manifest/replay.py) counts a manifest's concat steps as free, so pricing it here alone would part the
prediction from the replay.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from ..graph import LayerGraph
from ..spatial.regions import SegmentMaps, segment_maps
from .table import CostTable, TileCurve, efficiency

__all__ = ["host_mates", "overhead_ms", "tile_ms", "efficiency", "Relayout", "SegmentCost", "row_bytes", "group_param_bytes",
           "copy_ms", "BLOCKED_CLASSES"]

logger = logging.getLogger(__name__)


def host_mates(cost: CostTable, devices) -> set[int]:
    """The device indices among `devices` (those computing tiles of one segment at once) that share a host
    with another of them: their tiles stream their weights side by side (CostTable.shared_weights)."""
    seen: dict[str, set[int]] = {}
    for d in devices:
        if cost.hosts[d] is not None:
            seen.setdefault(cost.hosts[d], set()).add(d)
    return {d for group in seen.values() if len(group) > 1 for d in group}


def overhead_ms(graph: LayerGraph, cost: CostTable, i: int, d: int) -> float:
    """What every tile of layer i on device d pays, however small: per-operator dispatch and the weights'
    streaming (CostTable.overhead_ms)."""
    return float(cost.overhead_ms[i, d])


def _curve(graph: LayerGraph, cost: CostTable, i: int, d: int) -> TileCurve | None:
    return cost.curves[d].get(graph.layers[i].cost_class)


def _scaled_share(scalable: float, priced: float, size: float, curve: tuple, frac) -> np.ndarray:
    """What a tile of `frac` of the layer's output (of `size`, as the curve counts it) adds beyond overhead,
    with the efficiency curve."""
    ratio = efficiency(curve, size) / efficiency(curve, size * frac)
    return (scalable * ratio + priced) * frac


def tile_ms(graph: LayerGraph, cost: CostTable, i: int, d: int, rows: int, total: int) -> float:
    """Layer i on device d computing `rows` of its `total` output rows (recomputed halo rows included):
    see the module docstring; a whole-tensor tile costs exactly layer_ms."""
    if rows <= 0:
        return 0.0
    oh = overhead_ms(graph, cost, i, d)
    curve = _curve(graph, cost, i, d)
    if curve is None:
        return oh + (float(cost.layer_ms[i, d]) - oh) * rows / total
    full = float(cost.layer_ms[i, d])
    if rows >= total:
        return full
    priced = float(cost.priced_ms[i, d])
    return oh + float(_scaled_share(full - oh - priced, priced, cost.curve_size(i, curve), curve.points, rows / total))


def _share_by_rows(graph: LayerGraph, cost: CostTable, i: int, d: int, total: int) -> np.ndarray:
    """share[r]: tile_ms of layer i on device d at r rows (0..total) less its overhead."""
    oh, full = float(cost.overhead_ms[i, d]), float(cost.layer_ms[i, d])
    r = np.arange(total + 1, dtype=np.float64)
    curve = _curve(graph, cost, i, d)
    if curve is None:
        return (full - oh) * r / total
    priced = float(cost.priced_ms[i, d])
    share = _scaled_share(full - oh - priced, priced, cost.curve_size(i, curve), curve.points, r / total)
    share[0], share[total] = 0.0, full - oh
    return share


def copy_ms(cost: CostTable, d: int, nbytes: float) -> float:
    """Assembling `nbytes` of a tile's input from its parts on device d: read and write each byte once."""
    return 2.0 * nbytes / cost.memory_bytes_per_ms[d] if nbytes > 0 else 0.0


def row_bytes(graph: LayerGraph, tensor: str, axis: int) -> float:
    info = graph.tensors[tensor]
    return info.nbytes / info.shape[axis]


def group_param_bytes(graph: LayerGraph, lo: int, hi: int) -> int:
    """Weights every tile device of layers [lo, hi) holds (each computes every layer on its rows)."""
    return sum(graph.layers[i].param_bytes for i in range(lo, hi))


# Layers onnxruntime's CPU provider runs in its blocked (NCHWc) layout, where it does (x86): a fragment made
# of them converts its input into that layout and its output out of it, and a crop between two of them
# converts around the Slice.  A profile says whether the runtime converts (`layout_conversions`).
BLOCKED_CLASSES = ("conv", "depthwise_conv")


@dataclass(frozen=True, eq=False)
class Relayout:
    """What a tile fragment of one segment pays for being a fragment, beyond its layers' compute.  A
    conversion into or out of the blocked layout, on a device whose runtime converts, is a read and a write
    of every byte at its memory_gbps (CostTable.conversion_ms_per_byte; the timed difference of one- and
    two-fragment runs read 0.08-0.17 ms per MB crossing a boundary here, two conversions at ~36 GB/s 0.11).

    - Boundary: where the segment holds a convolution, its fragment converts its input in and its output
      out: one conversion of the input box and one of the output box.
    - Crops: every Slice the emitter writes inside the fragment (compiler/emit/tiles.py `_tile_nodes`),
      where a layer reads fewer rows of an activation than the tile holds (a residual shortcut cropped to
      the rows its Add keeps), one per distinct (tensor, rows read).  A crop of an activation the fragment
      computed converts it out and back in around the Slice: two conversions of the bytes held
      (onnxruntime's profiler put ResNet-50's at 0.11 ms per MB held).  A crop of the fragment's input (it
      arrives in the plain layout), and any crop where the runtime converts nothing, is a copy of the rows
      kept (`copy_ms`).  A tile pays a crop only where it holds more rows than the layer reads (never a tile
      of the whole plane).
    The maps are one per tiled axis (rows; rows and columns for a grid); `ms` takes per-axis tile bounds
    that may be numpy arrays, so one call prices every tile [a, b) of a segment at once.
    """

    maps: tuple  # SegmentMaps per tiled axis
    boundary: bool  # the segment holds a layer of BLOCKED_CLASSES
    crops: tuple  # (tensor, layer reading it, bytes per cell of the tensor, is the segment input)
    in_cell: float  # bytes per cell (row, or row x column) of the segment input, and of its output
    out_cell: float
    convert_pb: tuple  # per device: ms per byte converted (0: its runtime converts nothing)
    copy_pb: tuple  # per device: ms per byte copied (read and written once)

    @classmethod
    def build(cls, graph: LayerGraph, cost: CostTable, maps: tuple) -> "Relayout":
        m0 = maps[0]
        cells = lambda t: math.prod(graph.tensors[t].shape[m.axis] for m in maps)  # noqa: E731
        crops, seen = [], set()
        for i in range(m0.lo, m0.hi):
            for t in dict.fromkeys(graph.layers[i].inputs):
                if t not in m0.first:
                    continue  # a weight or a constant: no rows
                key = (t, *(m.in_first[i].tobytes() + m.in_end[i].tobytes() for m in maps))
                if key in seen or not any(_differs(m, t, i) for m in maps):
                    continue
                seen.add(key)
                crops.append((t, i, graph.tensors[t].nbytes / cells(t), t == m0.input))
        boundary = any(graph.layers[i].cost_class in BLOCKED_CLASSES for i in range(m0.lo, m0.hi))
        return cls(tuple(maps), boundary, tuple(crops),
                   graph.tensors[m0.input].nbytes / cells(m0.input), graph.tensors[m0.output].nbytes / cells(m0.output),
                   cost.conversion_ms_per_byte, tuple(2.0 / bpm for bpm in cost.memory_bytes_per_ms))

    def any(self, d: int) -> bool:
        return bool(self.crops) or (self.boundary and self.convert_pb[d] > 0)

    def prices(self, d: int) -> tuple:
        return self.convert_pb[d], self.copy_pb[d]

    def ms(self, d: int, a: tuple, b: tuple):
        """The tile with bounds [a[k], b[k]) along each map's axis k, on device d (arrays broadcast)."""
        maps, convert = self.maps, self.convert_pb[d]
        total = 0.0
        if self.boundary and convert > 0:
            m0 = maps[0]
            total = convert * (self.in_cell * _box(maps, m0.input, a, b)
                               + self.out_cell * _box(maps, m0.output, a, b))
        for t, i, cell, is_input in self.crops:
            if is_input or convert == 0:
                kept = 1
                for m, ak, bk in zip(maps, a, b):
                    kept = kept * np.maximum(m.in_end[i][bk] - m.in_first[i][ak], 0)
                price = self.copy_pb[d] * cell * kept
            else:
                price = 2 * convert * cell * _box(maps, t, a, b)
            total = total + np.where(self._cut(t, i, a, b), price, 0.0)
        return total

    def _cut(self, t: str, i: int, a: tuple, b: tuple):
        """Whether the tile with bounds (a, b) holds rows of t that layer i does not read."""
        cut = False
        for m, ak, bk in zip(self.maps, a, b):
            cut = cut | (m.first[t][ak] != m.in_first[i][ak]) | (m.end[t][bk] != m.in_end[i][bk])
        return cut

    def crops_in(self, a: tuple, b: tuple) -> list[tuple[str, int]]:
        """(tensor, layer) of every crop the tile with bounds (a, b) per axis pays (ints)."""
        return [(t, i) for t, i, _, _ in self.crops if bool(self._cut(t, i, a, b))]


def _differs(m: SegmentMaps, t: str, i: int) -> bool:
    """Some tile holds rows of t that layer i does not read (so the emitter slices them off)."""
    return bool(np.any(m.first[t] != m.in_first[i]) or np.any(m.end[t] != m.in_end[i]))


def _box(maps: tuple, t: str, a: tuple, b: tuple):
    """Cells of tensor t a tile with bounds (a, b) per axis holds."""
    out = 1
    for m, ak, bk in zip(maps, a, b):
        out = out * np.maximum(m.end[t][bk] - m.first[t][ak], 0)
    return out


@dataclass(eq=False)
class SegmentCost:
    """O(1) compute time of any tile [a, b) of a segment's output on any device.

    Rows computed by layer i are end_i[b] - first_i[a] (separable, see SegmentMaps), so the segment's
    time on device d is overhead_d + hi_d[b] - lo_d[a] with hi_d = sum_i w_id * end_i and
    lo_d = sum_i w_id * first_i, w_id = (layer_ms - overhead) / total rows of layer i.

    On a device whose figures have an efficiency curve for one of the segment's layers, a layer's time is
    not linear in its rows: there the segment's time is overhead_d + table_d[a, b], a table of every tile
    built on first use (`shares[d]`: per layer, its tile time beyond overhead by rows computed).
    """

    maps: SegmentMaps
    overhead: np.ndarray  # [D]
    hi: np.ndarray  # [D, M+1]
    lo: np.ndarray  # [D, M+1]
    in_bytes: float  # bytes per row of the segment input
    out_bytes: float  # bytes per row of the segment output
    _cache: dict = field(default_factory=dict)  # floors (by device weights), need floor, list views, tables
    shares: tuple = ()  # per device: None (linear), or per layer share[rows] (see _share_by_rows)
    relayout: Relayout | None = None  # crops and layout conversions every tile pays (see Relayout)

    @classmethod
    def build(cls, graph: LayerGraph, cost: CostTable, lo: int, hi: int, axis: int) -> "SegmentCost":
        maps = segment_maps(graph, lo, hi, axis)
        n_dev = len(cost.devices)
        oh = np.array([[overhead_ms(graph, cost, i, d) for d in range(n_dev)] for i in range(lo, hi)])
        total = np.array([maps.size[maps.out_of[i]] for i in range(lo, hi)], dtype=float)
        w = (cost.layer_ms[lo:hi] - oh) / total[:, None]  # [layers, D]
        ends = np.stack([maps.end[maps.out_of[i]] for i in range(lo, hi)])  # [layers, M+1]
        firsts = np.stack([maps.first[maps.out_of[i]] for i in range(lo, hi)])
        shares = tuple(
            tuple(_share_by_rows(graph, cost, i, d, maps.size[maps.out_of[i]]) for i in range(lo, hi))
            if any(_curve(graph, cost, i, d) is not None for i in range(lo, hi)) else None
            for d in range(n_dev))
        return cls(maps, oh.sum(axis=0), w.T @ ends, w.T @ firsts,
                   row_bytes(graph, maps.input, axis), row_bytes(graph, maps.output, axis), shares=shares,
                   relayout=Relayout.build(graph, cost, (maps,)))

    @property
    def rows(self) -> int:
        return self.maps.rows

    def comp(self, d: int, a: int, b: int) -> float:
        if b <= a:
            return 0.0
        table = self.table(d)
        if table is not None:
            return float(self.overhead[d] + table[a, b])
        return float(self.overhead[d] + self.hi[d, b] - self.lo[d, a])

    def table(self, d: int) -> np.ndarray | None:
        """table[a, b]: tile [a, b) on device d beyond its overhead (b > a), or None where time is linear
        in rows (no efficiency curve, and nothing to crop or convert).  Devices with the same per-layer
        shares and relayout prices share one table."""
        curved = d < len(self.shares) and self.shares[d] is not None
        relayout = self.relayout if self.relayout is not None and self.relayout.any(d) else None
        if not curved and relayout is None:
            return None
        mine = ("table of", d)
        if mine not in self._cache:
            compute = (b"".join(s.tobytes() for s in self.shares[d]) if curved
                       else self.hi[d].tobytes() + self.lo[d].tobytes())
            key = ("table", compute, None if relayout is None else relayout.prices(d))
            if key not in self._cache:
                m = self.maps
                if curved:
                    t = np.zeros((m.rows + 1, m.rows + 1))
                    for i, share in zip(range(m.lo, m.hi), self.shares[d]):
                        rows = m.end[m.out_of[i]][None, :] - m.first[m.out_of[i]][:, None]
                        t += share[np.maximum(rows, 0)]
                else:
                    t = self.hi[d][None, :] - self.lo[d][:, None]
                if relayout is not None:
                    idx = np.arange(m.rows + 1)
                    t = t + relayout.ms(d, (idx[:, None],), (idx[None, :],))
                self._cache[key] = t
            self._cache[mine] = self._cache[key]
        return self._cache[mine]

    def need(self, a: int, b: int) -> tuple[int, int]:
        """Rows of the segment input tile [a, b) reads."""
        return int(self.maps.first[self.maps.input][a]), int(self.maps.end[self.maps.input][b])

    @property
    def lists(self) -> tuple[list, list, list, list, list]:
        """(overhead, hi, lo, need first, need end) as Python lists: the search's inner loop indexes
        them millions of times, where numpy scalars are slow."""
        if "lists" not in self._cache:
            m = self.maps
            self._cache["lists"] = (self.overhead.tolist(), self.hi.tolist(), self.lo.tolist(),
                                    m.first[m.input].tolist(), m.end[m.input].tolist())
        return self._cache["lists"]

    def need_floor(self) -> list[int]:
        """need_floor[r]: fewest input rows any r-row tile reads. One numpy pass per r: the table is
        quadratic in the rows, which in Python loops took minutes for a 20,000-row map."""
        if "need" not in self._cache:
            m, maps = self.rows, self.maps
            first, end = maps.first[maps.input][: m + 1], maps.end[maps.input][: m + 1]
            self._cache["need"] = [0] + [int(np.min(end[r:] - first[: m + 1 - r])) for r in range(1, m + 1)]
        return self._cache["need"]

    def floor(self, d: int) -> list[float]:
        """floor[r]: least time of any tile of r rows or more on device d (a lower bound for the search;
        nondecreasing in r)."""
        table = self.table(d)
        if table is not None:
            return self._table_floor(d, table)
        key = (self.hi[d].tobytes(), self.lo[d].tobytes(), float(self.overhead[d]))
        if key not in self._cache:
            m = self.rows
            f = np.zeros(m + 1)
            for r in range(1, m + 1):
                f[r] = self.overhead[d] + np.min(self.hi[d, r:] - self.lo[d, : m + 1 - r])
            self._cache[key] = np.maximum.accumulate(f).tolist()  # linear time grows with rows
        return self._cache[key]

    def _table_floor(self, d: int, table: np.ndarray) -> list[float]:
        """floor from the table: a tile's time need not grow with its rows (a larger tile may run at a
        better efficiency), so floor[r] is the least over every size from r rows up."""
        key = ("table floor", id(table), float(self.overhead[d]))
        if key not in self._cache:
            m = self.rows
            f = np.zeros(m + 1)
            for r in range(1, m + 1):
                f[r] = self.overhead[d] + np.min(np.diagonal(table, offset=r))
            f[1:] = np.minimum.accumulate(f[1:][::-1])[::-1]
            self._cache[key] = f.tolist()
        return self._cache[key]
