"""Tile cost model: per-device compute of tiles, halo/scatter/gather transfers, and a spatial stage's timeline.

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
(runtime/replay.py) counts a manifest's concat steps as free, so pricing it here alone would part the
prediction from the replay.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
from dataclasses import dataclass, field

import numpy as np

from ..graph import LayerGraph
from ..plan_types import Stage
from ..spatial.regions import SegmentMaps, segment_maps
from .table import CostTable, TileCurve, efficiency

__all__ = ["overhead_ms", "tile_ms", "efficiency", "Relayout", "SegmentCost", "Step", "StepModel", "row_bytes",
           "predict_stage", "group_param_bytes", "StageWork", "run_stage", "copy_ms", "assembly_cells"]

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


# ------------------------------------------------------------------------------------------------
# The search's step score: ADaPS Eq. 4-11 made exact per device


@dataclass(frozen=True)
class Step:
    """One segment after a known partition: who holds its input rows, and list views of its costs."""

    sc: SegmentCost
    holders: list  # (device index, first row, end row) of the segment input, in row order
    starts: list
    sender: list  # per device position: its index among the holders, or -1
    overhead: list
    hi: list
    lo: list
    need_first: list
    need_end: list
    terms: dict = field(default_factory=dict)  # (position, a, b) -> (messages, compute ms), see StepModel.term
    tables: dict = field(default_factory=dict)  # device index -> SegmentCost.table, where time is not linear
    mate_ms: tuple | None = None  # per device position: CostTable.shared_weights of the segment; None: all 0


class StepModel:
    """Score of a segment step over devices in axis order (`devs`, CostTable indices).

    All devices start the step together. Holders send each device the input rows it needs and does
    not hold, in tile order, one message after another (on a shared medium all messages queue on one
    channel). A device computes its tile (recomputed halo rows included, and first the copy that
    assembles rows from several holders, `copy_ms`) once its rows have arrived and its own sends are
    done; the step costs the slowest device. This replaces ADaPS's t_comp + t_data + t_ov (Eq. 4-11),
    which adds the worst compute to every transfer, by the time the slowest device actually needs under
    the same link and tile model as `predict_stage`.
    """

    def __init__(self, cost: CostTable, devs: list[int]):
        n, net = len(cost.devices), cost.network
        self.devs, self.shared, self.cost = devs, net.shared, cost
        self.run_ms = cost.run_ms
        self.mates = bool(host_mates(cost, devs))  # some of devs share a host (CostTable.shared_weights)
        self.bw = [[float("inf")] * n for _ in range(n)]  # bytes per ms
        self.lat = [[0.0] * n for _ in range(n)]
        for a in range(n):
            for b in range(n):
                if a != b:
                    self.bw[a][b] = net.bytes_per_ms(cost.devices[a], cost.devices[b])
                    self.lat[a][b] = net.latency_ms(cost.devices[a], cost.devices[b])

    def context(self, sc: SegmentCost, holders: list) -> Step:
        sender = {h[0]: e for e, h in enumerate(holders)}
        tables = {d: t for d in self.devs if (t := sc.table(d)) is not None}
        mate_ms = None
        if self.mates:
            mate_ms = tuple(self.cost.shared_weights(sc.maps.lo, sc.maps.hi, d) for d in self.devs)
            mate_ms = mate_ms if any(mate_ms) else None
        return Step(sc, holders, [h[1] for h in holders], [sender.get(d, -1) for d in self.devs], *sc.lists,
                    tables=tables, mate_ms=mate_ms)

    def term(self, cx: Step, pos: int, a: int, b: int, sent: tuple, chan: float):
        """Device `pos` computing rows [a, b) (b > a): (rows arrived at, compute ms, each holder's
        sends done at, channel free at)."""
        got = cx.terms.get((pos, a, b))
        if got is None:
            got = cx.terms[pos, a, b] = self._messages(cx, pos, a, b)
        msgs, comp = got
        if not msgs:
            return 0.0, comp, sent, chan
        ready, sent = 0.0, list(sent)
        if self.shared:  # every message queues on the one channel
            for e, ms in msgs:
                chan += ms
                sent[e] = chan
            return chan, comp, tuple(sent), chan
        for e, ms in msgs:  # each holder sends on its own link; `chan` ends as the last message's end
            chan = sent[e] + ms
            sent[e] = chan
            if chan > ready:
                ready = chan
        return ready, comp, tuple(sent), chan

    def _messages(self, cx: Step, pos: int, a: int, b: int) -> tuple[tuple, float]:
        """The messages device `pos` receives for rows [a, b) as (holder index, ms), in holder order,
        and its compute ms: what `term` needs that does not depend on when the holders are free."""
        d = self.devs[pos]
        n0, n1 = cx.need_first[a], cx.need_end[b]
        msgs, parts = [], 0
        for e in range(max(0, bisect.bisect_right(cx.starts, n0) - 1), bisect.bisect_left(cx.starts, n1)):
            hd, s0, s1 = cx.holders[e]
            rows = min(s1, n1) - max(s0, n0)
            parts += rows > 0
            if rows > 0 and hd != d:
                msgs.append((e, rows * cx.sc.in_bytes / self.bw[hd][d] + self.lat[hd][d]))
        # rows from several holders are assembled before the tile runs, as predict_stage prices it
        copy = copy_ms(self.cost, d, (n1 - n0) * cx.sc.in_bytes) if parts > 1 else 0.0
        run = self.run_ms[d]  # the tile is a fragment run (StageWork adds it last too)
        table = cx.tables.get(d)
        if table is not None:
            return tuple(msgs), cx.overhead[d] + float(table[a, b]) + copy + run
        return tuple(msgs), cx.overhead[d] + cx.hi[d][b] - cx.lo[d][a] + copy + run

    def finish(self, cx: Step, done, sent) -> float:
        """The step's time from (position, arrived, compute) of every busy device and final sends. A busy
        device that shares its host with another busy one also streams its weights beside it
        (`Step.mate_ms`): added here, once the busy devices are known, so every partial time before is a
        lower bound."""
        if cx.mate_ms is not None:
            mates = host_mates(self.cost, [self.devs[p] for p, _, _ in done])
            done = [(p, r, c + cx.mate_ms[p] if self.devs[p] in mates else c) for p, r, c in done]
        return max((max(r, sent[cx.sender[p]] if cx.sender[p] >= 0 else 0.0) + c for p, r, c in done), default=0.0)

    def score(self, cx: Step, part) -> float:
        """Step time of partition `part` (row boundaries per device position)."""
        sent, chan, done = (0.0,) * len(cx.holders), 0.0, []
        for pos in range(len(self.devs)):
            if part[pos + 1] > part[pos]:
                r, c, sent, chan = self.term(cx, pos, part[pos], part[pos + 1], sent, chan)
                done.append((pos, r, c))
        return self.finish(cx, done, sent)

    def gather(self, sc: SegmentCost, holders: list, g: int) -> float:
        """Every tile sent to device g (in parallel on a switched network, one after another if shared)."""
        ms = [(b - a) * sc.out_bytes / self.bw[d][g] + self.lat[d][g] for d, a, b in holders if d != g]
        return sum(ms) if self.shared else max(ms, default=0.0)


# ------------------------------------------------------------------------------------------------
# Event timeline of one spatial stage


Box = tuple[tuple[int, int], ...]  # a tile's [start, stop) on each tiled axis


@dataclass
class _Timeline:
    cost: CostTable
    clock: dict[str, float]
    channel: float = 0.0
    transfers: list = field(default_factory=list)
    events: list = field(default_factory=list)

    def exchange(self, tensor: str, per_cell: float, holders, needs, order=None) -> dict[str, float]:
        """Every holder (device, box) sends each receiver (device, box) the part of its box that receiver
        needs, one message after another, starting when the holder has finished computing; on a shared
        medium all messages queue for one channel, the holders' bursts in the order they are ready.
        `per_cell` is the bytes of one row (one row and column of a 2-D box). `order`: per holder (in
        `holders` order) the needs' indices in the order it sends to them (order.py); None: need order.
        Returns when each receiver has all its pieces."""
        shared = self.cost.cluster.medium == "shared"
        ready: dict[str, float] = {}
        ranked = sorted(enumerate(holders), key=lambda eh: (self.clock[eh[1][0]], eh[1][1]))
        for e, (src, have) in ranked:
            for n in (range(len(needs)) if order is None else order[e]):
                dst, need = needs[n]
                part = _overlap(have, need)
                if dst == src or any(b <= a for a, b in part):
                    continue
                nbytes = int(round(math.prod(b - a for a, b in part) * per_cell))
                ms = self.cost.transfer_ms(nbytes, src, dst)
                start = max(self.clock[src], self.channel) if shared else self.clock[src]
                self.clock[src] = start + ms
                self.channel = self.clock[src] if shared else self.channel
                ready[dst] = max(ready.get(dst, 0.0), self.clock[src])
                self.transfers.append((tensor, src, dst, nbytes, ms))
                self.events.append((src, "transfer", f"{tensor}[{_label(part)}] -> {dst}", start, self.clock[src]))
        return ready

    def copy(self) -> "_Timeline":
        """A timeline to try an exchange on: its own clocks and channel, no transfers or events."""
        return _Timeline(self.cost, dict(self.clock), self.channel)

    def run(self, device: str, what: str, ready: float, ms: float) -> None:
        start = max(self.clock[device], ready)
        self.clock[device] = start + ms
        self.events.append((device, "compute", what, start, start + ms))


def _label(box: Box) -> str:
    return ",".join(f"{a}:{b}" for a, b in box)


def _grid_tile_ms(graph: LayerGraph, cost: CostTable, rows: SegmentMaps, cols: SegmentMaps, d: int, box: Box) -> float:
    """A 2-D tile's compute on device d: each layer's share is its rows x columns (recomputed halo rows
    and columns included) over its whole plane, plus its operator overhead (see tile_ms)."""
    (a, b), (c, e) = box
    return sum(tile_ms(graph, cost, i, d, int(rows.layer_rows(i, a, b)) * int(cols.layer_rows(i, c, e)),
                       rows.size[rows.out_of[i]] * cols.size[cols.out_of[i]]) for i in range(rows.lo, rows.hi))


def _segment_tiles(graph: LayerGraph, cost: CostTable, group, seg) -> tuple[SegmentMaps, float, float, list]:
    """(maps along the group axis, input and output bytes per cell, [(device, input box, output box, compute
    ms)] per tile) of one segment; 1-D tiles priced by SegmentCost, grid tiles per axis pair."""
    if not group.grid:
        sc = SegmentCost.build(graph, cost, seg.lo, seg.hi, group.axis)
        tiles = [(t.device, (sc.need(t.start, t.stop),), ((t.start, t.stop),),
                  sc.comp(cost.index(t.device), t.start, t.stop)) for t in seg.tiles]
        return sc.maps, sc.in_bytes, sc.out_bytes, tiles
    rows, cols = segment_maps(graph, seg.lo, seg.hi, 2), segment_maps(graph, seg.lo, seg.hi, 3)
    relayout = Relayout.build(graph, cost, (rows, cols))
    tiles = []
    for t in seg.tiles:
        box = ((t.start, t.stop), t.cols)
        need = tuple((int(m.first[m.input][a]), int(m.end[m.input][b])) for m, (a, b) in zip((rows, cols), box))
        d = cost.index(t.device)
        ms = _grid_tile_ms(graph, cost, rows, cols, d, box)
        if relayout.any(d):
            ms += float(relayout.ms(d, (box[0][0], box[1][0]), (box[0][1], box[1][1])))
        tiles.append((t.device, need, box, ms))
    return rows, _cell_bytes(graph, rows.input), _cell_bytes(graph, rows.output), tiles


def _cell_bytes(graph: LayerGraph, tensor: str) -> float:
    info = graph.tensors[tensor]
    return info.nbytes / (info.shape[2] * info.shape[3])


def _spans(events: list, stage_device: str, latency: float) -> dict[str, float]:
    """How long the stage holds each device per input, which bounds how fast inputs can stream through it.

    A device runs its steps for one input before the next input's, so it is held from its first step to its
    last one that waits: the stage's device from the scatter to the end of the gather (the whole stage);
    a tile device from its first tile to the end of its last, its halo sends and its waits for halo rows in
    between (its sends after its last tile leave while it goes on: ZeroMQ queues them, and their wire
    time is the link's to bear)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for device, kind, _, t0, t1 in events:
        if kind == "compute":
            first[device] = min(first.get(device, t0), t0)
            last[device] = max(last.get(device, t1), t1)
    spans = {d: last[d] - first[d] for d in first}
    spans[stage_device] = latency
    return spans


@dataclass(frozen=True)
class StageWork:
    """What a spatial stage's timeline is made of, whatever the send order: per segment its input tensor,
    bytes per input cell and tiles (device, input box, output box, compute ms); the last segment's output
    tensor and bytes per output cell (the gather)."""

    segments: tuple[tuple[str, float, tuple], ...]
    output: str
    out_bytes: float

    @classmethod
    def build(cls, stage: Stage, graph: LayerGraph, cost: CostTable) -> "StageWork":
        """Each tile's compute ms includes the copy assembling its input (`copy_ms`) from the boxes the
        previous segment's tiles hold (the first segment's: the stage input whole, one part), the runtime's
        cost of a fragment run (CostTable.run_ms), then, where another tile of the segment runs on its host,
        its weights' streaming beside that one (CostTable.shared_weights), in StepModel's order."""
        segs, have = [], None
        for seg in stage.spatial.segments:
            maps, in_bytes, out_bytes, tiles = _segment_tiles(graph, cost, stage.spatial, seg)
            if have is not None:
                tiles = [(d, need, box, ms + copy_ms(cost, cost.index(d), assembly_cells(have, need) * in_bytes))
                         for d, need, box, ms in tiles]
            mates = host_mates(cost, [cost.index(d) for d, _, _, _ in tiles])
            tiles = [(d, need, box, ms + cost.run_ms[cost.index(d)]
                      + (cost.shared_weights(seg.lo, seg.hi, cost.index(d)) if cost.index(d) in mates else 0.0))
                     for d, need, box, ms in tiles]
            have = [box for _, _, box, _ in tiles]
            segs.append((maps.input, in_bytes, tuple(tiles)))
        return cls(tuple(segs), maps.output, out_bytes)


def assembly_cells(have: list[Box], need: Box) -> int:
    """Cells (rows, or rows x columns) the concatenations that assemble box `need` from the parts of the
    boxes `have` (which tile the tensor) write, as compiler/emit/schedule.py _assemble writes them: none
    from one part; along the axis in 1-D; for a grid, each band of equal rows made of several parts, then
    the whole need when it has several bands."""
    parts = sorted(p for p in (_overlap(h, need) for h in have) if all(b > a for a, b in p))
    if len(parts) <= 1:
        return 0
    if len(need) == 1:
        return _cells(need)
    bands = [list(band) for _, band in itertools.groupby(parts, key=lambda p: p[0])]
    cells = sum(_cells((band[0][0], (band[0][1][0], band[-1][1][1]))) for band in bands if len(band) > 1)
    return cells + (_cells(need) if len(bands) > 1 else 0)


def _overlap(have: Box, need: Box) -> Box:
    """The part of box `have` inside box `need` (empty where an axis has stop <= start)."""
    return tuple((max(s0, n0), min(s1, n1)) for (s0, s1), (n0, n1) in zip(have, need))


def _cells(box: Box) -> int:
    return math.prod(b - a for a, b in box)


def predict_stage(stage: Stage, graph: LayerGraph, cost: CostTable, order=None) -> dict:
    """Timeline of a spatial stage, from its input being complete on `stage.device` (which scatters
    input rows to the tiles) to the last segment's output gathered on `stage.device`.

    Each device runs its segments in order; before a segment it waits for the rows it needs (halo rows
    from neighbours, sent by each holder as soon as it has finished the previous segment). `order`: per
    exchange (before each segment, then the gather) the holders' send orders (`_Timeline.exchange`; chosen
    by order.py), or None for need order. Returns latency_ms, compute_ms per device, transfers as (tensor,
    src, dst, bytes, ms), events as (device, kind, what, start_ms, end_ms), tile_ms {(segment, tile):
    compute ms}, span_ms per device (how long the stage holds it, `_spans`) and bytes. A grid's tiles are
    boxes of rows and columns; everything else is the same.
    """
    work = StageWork.build(stage, graph, cost)
    return run_stage(stage, graph, cost, work, (lambda j, tl, holders, needs: None if order is None else order[j]))


def run_stage(stage: Stage, graph: LayerGraph, cost: CostTable, work: StageWork, choose) -> dict:
    """predict_stage's timeline of `work`, where `choose(j, timeline, holders, needs)` gives exchange j's
    send order (see _Timeline.exchange) when the timeline has reached it."""
    devices = {stage.device, *stage.spatial.devices}
    tl = _Timeline(cost, {d: 0.0 for d in devices})
    compute = {d: 0.0 for d in devices}
    per_tile = {}

    def whole(tensor: str) -> Box:
        return tuple((0, graph.tensors[tensor].shape[ax]) for ax in stage.spatial.axes)

    holders = [(stage.device, whole(work.segments[0][0]))]
    for k, (seg, (tensor, in_bytes, tiles)) in enumerate(zip(stage.spatial.segments, work.segments)):
        needs = [(d, need) for d, need, _, _ in tiles]
        ready = tl.exchange(tensor, in_bytes, holders, needs, choose(k, tl, holders, needs))
        for n, (d, _, box, ms) in enumerate(tiles):
            per_tile[k, n] = ms
            compute[d] += ms
            what = f"rows {box[0][0]}:{box[0][1]}" + (f" cols {box[1][0]}:{box[1][1]}" if len(box) > 1 else "")
            tl.run(d, f"layers {seg.lo}-{seg.hi - 1} {what}", ready.get(d, 0.0), ms)
        holders = [(d, box) for d, _, box, _ in tiles]
    needs = [(stage.device, whole(work.output))]
    ready = tl.exchange(work.output, work.out_bytes, holders, needs, choose(len(work.segments), tl, holders, needs))
    latency = max(tl.clock[stage.device], ready.get(stage.device, 0.0))
    return {
        "latency_ms": latency,
        "compute_ms": compute,
        "span_ms": _spans(tl.events, stage.device, latency),
        "tile_ms": per_tile,
        "transfers": tl.transfers,
        "events": tl.events,
        "bytes": sum(t[3] for t in tl.transfers),
    }
