"""The spatial search's step score (ADaPS Eq. 4-11 made exact per device): what choosing one segment's
partition adds to the stage, priced with the tile cost model (tiles.py) as predict_stage prices it."""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

from .table import CostTable
from .tiles import SegmentCost, copy_ms, host_mates

__all__ = ["Step", "StepModel"]

logger = logging.getLogger(__name__)


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
