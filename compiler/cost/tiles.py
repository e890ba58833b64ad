"""Tile cost model: per-device compute of tiles, halo/scatter/gather transfers, and a spatial stage's timeline."""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass, field

import numpy as np

from ..graph import LayerGraph
from ..plan_types import Stage
from ..spatial.regions import SegmentMaps, segment_maps
from .table import CostTable

__all__ = ["overhead_ms", "tile_ms", "SegmentCost", "Step", "StepModel", "row_bytes", "predict_stage", "group_param_bytes"]

logger = logging.getLogger(__name__)


def overhead_ms(graph: LayerGraph, cost: CostTable, i: int, d: int) -> float:
    """Per-operator dispatch overhead of layer i on device d: paid by every tile, however small."""
    prof = cost.cluster.device(cost.devices[d]).profile
    return min(len(graph.layers[i].op_types) * prof.op_overhead_us / 1000.0, float(cost.layer_ms[i, d]))


def tile_ms(graph: LayerGraph, cost: CostTable, i: int, d: int, rows: int, total: int) -> float:
    """Layer i on device d computing `rows` of its `total` output rows (recomputed halo rows included):
    overhead + (layer_ms - overhead) * rows / total, so a whole-tensor tile costs exactly layer_ms."""
    if rows <= 0:
        return 0.0
    oh = overhead_ms(graph, cost, i, d)
    return oh + (float(cost.layer_ms[i, d]) - oh) * rows / total


def row_bytes(graph: LayerGraph, tensor: str, axis: int) -> float:
    info = graph.tensors[tensor]
    return info.nbytes / info.shape[axis]


def group_param_bytes(graph: LayerGraph, lo: int, hi: int) -> int:
    """Weights every tile device of layers [lo, hi) holds (each computes every layer on its rows)."""
    return sum(graph.layers[i].param_bytes for i in range(lo, hi))


@dataclass(eq=False)
class SegmentCost:
    """O(1) compute time of any tile [a, b) of a segment's output on any device.

    Rows computed by layer i are end_i[b] - first_i[a] (separable, see SegmentMaps), so the segment's
    time on device d is overhead_d + hi_d[b] - lo_d[a] with hi_d = sum_i w_id * end_i and
    lo_d = sum_i w_id * first_i, w_id = (layer_ms - overhead) / total rows of layer i.
    """

    maps: SegmentMaps
    overhead: np.ndarray  # [D]
    hi: np.ndarray  # [D, M+1]
    lo: np.ndarray  # [D, M+1]
    in_bytes: float  # bytes per row of the segment input
    out_bytes: float  # bytes per row of the segment output
    _cache: dict = field(default_factory=dict)  # floors (by device weights), need floor, list views

    @classmethod
    def build(cls, graph: LayerGraph, cost: CostTable, lo: int, hi: int, axis: int) -> "SegmentCost":
        maps = segment_maps(graph, lo, hi, axis)
        n_dev = len(cost.devices)
        oh = np.array([[overhead_ms(graph, cost, i, d) for d in range(n_dev)] for i in range(lo, hi)])
        total = np.array([maps.size[maps.out_of[i]] for i in range(lo, hi)], dtype=float)
        w = (cost.layer_ms[lo:hi] - oh) / total[:, None]  # [layers, D]
        ends = np.stack([maps.end[maps.out_of[i]] for i in range(lo, hi)])  # [layers, M+1]
        firsts = np.stack([maps.first[maps.out_of[i]] for i in range(lo, hi)])
        return cls(maps, oh.sum(axis=0), w.T @ ends, w.T @ firsts,
                   row_bytes(graph, maps.input, axis), row_bytes(graph, maps.output, axis))

    @property
    def rows(self) -> int:
        return self.maps.rows

    def comp(self, d: int, a: int, b: int) -> float:
        return 0.0 if b <= a else float(self.overhead[d] + self.hi[d, b] - self.lo[d, a])

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
        """need_floor[r]: fewest input rows any r-row tile reads."""
        if "need" not in self._cache:
            m, (_, _, _, first, end) = self.rows, self.lists
            self._cache["need"] = [0] + [min(end[a + r] - first[a] for a in range(m + 1 - r)) for r in range(1, m + 1)]
        return self._cache["need"]

    def floor(self, d: int) -> list[float]:
        """floor[r]: least time of any r-row tile on device d (a lower bound for the search)."""
        key = (self.hi[d].tobytes(), self.lo[d].tobytes(), float(self.overhead[d]))
        if key not in self._cache:
            m = self.rows
            f = np.zeros(m + 1)
            for r in range(1, m + 1):
                f[r] = self.overhead[d] + np.min(self.hi[d, r:] - self.lo[d, : m + 1 - r])
            self._cache[key] = np.maximum.accumulate(f).tolist()
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


class StepModel:
    """Score of a segment step over devices in axis order (`devs`, CostTable indices).

    All devices start the step together. Holders send each device the input rows it needs and does
    not hold, in tile order, one message after another (on a shared medium all messages queue on one
    channel). A device computes its tile (recomputed halo rows included) once its rows have arrived
    and its own sends are done; the step costs the slowest device. This replaces ADaPS's
    t_comp + t_data + t_ov (Eq. 4-11), which adds the worst compute to every transfer, by the time the
    slowest device actually needs under the same link model as `predict_stage`.
    """

    def __init__(self, cost: CostTable, devs: list[int]):
        n, net = len(cost.devices), cost.network
        self.devs, self.shared = devs, net.shared
        self.bw = [[float("inf")] * n for _ in range(n)]  # bytes per ms
        self.lat = [[0.0] * n for _ in range(n)]
        for a in range(n):
            for b in range(n):
                if a != b:
                    self.bw[a][b] = net.bytes_per_ms(cost.devices[a], cost.devices[b])
                    self.lat[a][b] = net.latency_ms(cost.devices[a], cost.devices[b])

    def context(self, sc: SegmentCost, holders: list) -> Step:
        sender = {h[0]: e for e, h in enumerate(holders)}
        return Step(sc, holders, [h[1] for h in holders], [sender.get(d, -1) for d in self.devs], *sc.lists)

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
        msgs = []
        for e in range(max(0, bisect.bisect_right(cx.starts, n0) - 1), bisect.bisect_left(cx.starts, n1)):
            hd, s0, s1 = cx.holders[e]
            rows = min(s1, n1) - max(s0, n0)
            if rows > 0 and hd != d:
                msgs.append((e, rows * cx.sc.in_bytes / self.bw[hd][d] + self.lat[hd][d]))
        return tuple(msgs), cx.overhead[d] + cx.hi[d][b] - cx.lo[d][a]

    @staticmethod
    def finish(cx: Step, done, sent) -> float:
        """The step's time from (position, arrived, compute) of every busy device and final sends."""
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

    def exchange(self, tensor: str, per_cell: float, holders, needs) -> dict[str, float]:
        """Every holder (device, box) sends each receiver (device, box) the part of its box that receiver
        needs, one message after another, starting when the holder has finished computing; on a shared
        medium all messages queue for one channel. `per_cell` is the bytes of one row (one row and
        column of a 2-D box). Returns when each receiver has all its pieces."""
        shared = self.cost.cluster.medium == "shared"
        ready: dict[str, float] = {}
        for src, have in sorted(holders, key=lambda h: (self.clock[h[0]], h[1])):
            for dst, need in needs:
                part = [(max(s0, n0), min(s1, n1)) for (s0, s1), (n0, n1) in zip(have, need)]
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
    tiles = []
    for t in seg.tiles:
        box = ((t.start, t.stop), t.cols)
        need = tuple((int(m.first[m.input][a]), int(m.end[m.input][b])) for m, (a, b) in zip((rows, cols), box))
        tiles.append((t.device, need, box, _grid_tile_ms(graph, cost, rows, cols, cost.index(t.device), box)))
    return rows, _cell_bytes(graph, rows.input), _cell_bytes(graph, rows.output), tiles


def _cell_bytes(graph: LayerGraph, tensor: str) -> float:
    info = graph.tensors[tensor]
    return info.nbytes / (info.shape[2] * info.shape[3])


def predict_stage(stage: Stage, graph: LayerGraph, cost: CostTable) -> dict:
    """Timeline of a spatial stage, from its input being complete on `stage.device` (which scatters
    input rows to the tiles) to the last segment's output gathered on `stage.device`.

    Each device runs its segments in order; before a segment it waits for the rows it needs (halo rows
    from neighbours, sent by each holder as soon as it has finished the previous segment). Returns
    latency_ms, compute_ms per device, transfers as (tensor, src, dst, bytes, ms), events as (device,
    kind, what, start_ms, end_ms), tile_ms {(segment, tile): compute ms} and bytes. A grid's tiles are
    boxes of rows and columns; everything else is the same.
    """
    group = stage.spatial
    devices = {stage.device, *group.devices}
    tl = _Timeline(cost, {d: 0.0 for d in devices})
    compute = {d: 0.0 for d in devices}
    per_tile = {}
    first = segment_maps(graph, group.segments[0].lo, group.segments[0].hi, group.axis)

    def whole(tensor: str) -> Box:
        return tuple((0, graph.tensors[tensor].shape[ax]) for ax in group.axes)

    holders = [(stage.device, whole(first.input))]
    for k, seg in enumerate(group.segments):
        maps, in_bytes, out_bytes, tiles = _segment_tiles(graph, cost, group, seg)
        ready = tl.exchange(maps.input, in_bytes, holders, [(d, need) for d, need, _, _ in tiles])
        for n, (d, _, box, ms) in enumerate(tiles):
            per_tile[k, n] = ms
            compute[d] += ms
            what = f"rows {box[0][0]}:{box[0][1]}" + (f" cols {box[1][0]}:{box[1][1]}" if len(box) > 1 else "")
            tl.run(d, f"layers {seg.lo}-{seg.hi - 1} {what}", ready.get(d, 0.0), ms)
        holders = [(d, box) for d, _, box, _ in tiles]
    ready = tl.exchange(maps.output, out_bytes, holders, [(stage.device, whole(maps.output))])
    latency = max(tl.clock[stage.device], ready.get(stage.device, 0.0))
    return {
        "latency_ms": latency,
        "compute_ms": compute,
        "tile_ms": per_tile,
        "transfers": tl.transfers,
        "events": tl.events,
        "bytes": sum(t[3] for t in tl.transfers),
    }
