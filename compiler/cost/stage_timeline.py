"""A spatial stage's event timeline: its tiles on their devices, with the scatter, halo and gather
transfers between them, priced by the tile cost model (tiles.py) and the network model; `predict_stage`
is what `evaluate` charges a spatial stage, `run_stage` the same for a given send order (order.py)."""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field

from ..graph import LayerGraph
from ..plan_types import Stage
from ..spatial.regions import SegmentMaps, segment_maps
from .quota_burst import Burst
from .table import CostTable
from .tiles import Relayout, SegmentCost, copy_ms, host_mates, tile_ms

__all__ = ["predict_stage", "StageWork", "run_stage", "assembly_cells"]

logger = logging.getLogger(__name__)


Box = tuple[tuple[int, int], ...]  # a tile's [start, stop) on each tiled axis


@dataclass
class _Timeline:
    cost: CostTable
    clock: dict[str, float]
    channel: float = 0.0
    transfers: list = field(default_factory=list)
    events: list = field(default_factory=list)
    burst: Burst | None = None  # a lone request's: compute on bursting devices spends their bursts
    lone: bool = False  # messages at a lone request's figures (CostTable.lone_network)

    def exchange(self, tensor: str, per_cell: float, holders, needs, order=None) -> dict[str, float]:
        """Every holder (device, box) sends each receiver (device, box) the part of its box that receiver
        needs, one message after another, starting when the holder has finished computing; on a shared
        medium all messages queue for one channel, the holders' bursts in the order they are ready.
        `per_cell` is the bytes of one row (one row and column of a 2-D box). `order`: per holder (in
        `holders` order) the needs' indices in the order it sends to them (order.py); None: need order.
        Returns when each receiver has all its pieces."""
        shared = self.cost.cluster.medium == "shared"
        net = self.cost.lone_network if self.lone else self.cost.network
        ready: dict[str, float] = {}
        ranked = sorted(enumerate(holders), key=lambda eh: (self.clock[eh[1][0]], eh[1][1]))
        for e, (src, have) in ranked:
            for n in (range(len(needs)) if order is None else order[e]):
                dst, need = needs[n]
                part = _overlap(have, need)
                if dst == src or any(b <= a for a, b in part):
                    continue
                nbytes = int(round(math.prod(b - a for a, b in part) * per_cell))
                ms = net.transfer_ms(nbytes, src, dst)
                start = max(self.clock[src], self.channel) if shared else self.clock[src]
                self.clock[src] = start + ms
                self.channel = self.clock[src] if shared else self.channel
                ready[dst] = max(ready.get(dst, 0.0), self.clock[src])
                self.transfers.append((tensor, src, dst, nbytes, ms))
                self.events.append((src, "transfer", f"{tensor}[{_label(part)}] -> {dst}", start, self.clock[src]))
        return ready

    def copy(self) -> "_Timeline":
        """A timeline to try an exchange on: its own clocks and channel, no transfers or events."""
        return _Timeline(self.cost, dict(self.clock), self.channel, lone=self.lone)

    def run(self, device: str, what: str, ready: float, ms: float) -> None:
        if self.burst is not None:
            ms = self.burst.spend(device, ms)
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


def run_stage(stage: Stage, graph: LayerGraph, cost: CostTable, work: StageWork, choose,
              burst: Burst | None = None) -> dict:
    """predict_stage's timeline of `work`, where `choose(j, timeline, holders, needs)` gives exchange j's
    send order (see _Timeline.exchange) when the timeline has reached it.  With `burst`, as a lone request
    meets it (quota_burst.py): each tile on a bursting device spends its burst, and messages go at the lone
    request's figures; its compute_ms and tile_ms stay the tiles' prices."""
    devices = {stage.device, *stage.spatial.devices}
    tl = _Timeline(cost, {d: 0.0 for d in devices}, burst=burst, lone=burst is not None)
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
