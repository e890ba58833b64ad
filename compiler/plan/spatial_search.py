"""ADaPS-style search for spatial plans: tile boundaries per cut and layer fusion, with pruning and reuse.

Search space: per cut, tile sizes within ADaPS's bounds (Eq. 1-3: a window around the speed-proportional
share, width threshold * (max size - share)); any subset of block cuts as segment boundaries; any start
among the planner's entry cuts (the model input, or any cut after a stem the planner prices); any end of
the spatial group. Each choice is scored with the tile cost model's StepModel (compiler.cost.tile_steps): the
group starts with its input on the gather device (a scatter), every segment costs its slowest device
(rows received + tile compute), the group ends with a gather, and the layers after it cost `rest`
(given by the planner).

Search: a forward dynamic program over (cut, partition) states. Memoisation: a state keeps its best
prefix once, and the k best partitions after a (state, next cut) pair are cached and reused. Alpha-beta
style pruning: a state is dropped when its cost plus a lower bound of any completion (balanced compute,
no transfers) reaches the incumbent. The partition of one cut is found by `_Partitions`: a level search
for a good first answer, then branch and bound over tile sizes with water-filling bounds, scatter bounds
and sub-tree reuse (nodes whose remaining problem is no better than k seen ones are skipped).

Exact when unbounded (beam=None, branch=None, budget=None: tests compare with `exhaustive`); by default
the DP keeps `beam` states per cut, `branch` partitions per transition, and each partition search stops
after `budget` nodes with the best partitions found so far (SearchStats.exact says whether any limit bit).

One algorithm, kept whole (over 500 lines): the DP over cuts, the partition search of one transition and
their shared caches and bounds (the incumbent, the lower bounds, the reuse of partitions and sub-trees) work
on one state and read best side by side; split, each half would need the other's invariants restated.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import math
from dataclasses import dataclass

import numpy as np

from ..cost import CostTable
from ..cost.tile_steps import Step, StepModel
from ..cost.tiles import SegmentCost
from ..graph import LayerGraph
from ..plan_types import Segment, SpatialGroup, Stage, Tile

__all__ = ["SearchStats", "SpatialSearch", "windows", "build_segments", "INF"]

logger = logging.getLogger(__name__)
INF = float("inf")
MAX_SPAN = 8  # block cuts one fused segment may span (None: any)


@dataclass
class SearchStats:
    search_space_log10: float = 0.0  # partitions x segmentations x ends within the threshold bounds
    nodes_visited: int = 0  # partition-tree nodes expanded
    states: int = 0  # (cut, partition) states expanded
    memo_hits: int = 0
    pruned: int = 0
    seconds: float = 0.0
    exact: bool = True  # False when a beam/branch limit dropped candidates
    searches: int = 0  # SpatialSearch runs summed here (one per axis, region, device group, gather device)

    def add(self, other: "SearchStats") -> None:
        self.search_space_log10 = _log10_add(self.search_space_log10, other.search_space_log10)
        for f in ("nodes_visited", "states", "memo_hits", "pruned", "seconds", "searches"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.exact &= other.exact


def _log10_add(x: float, y: float) -> float:
    if x == -INF or y == -INF:
        return max(x, y)
    hi, lo = max(x, y), min(x, y)
    return hi + math.log10(1.0 + 10 ** (lo - hi))


def windows(rows: int, speed: np.ndarray, threshold: float) -> tuple[list[int], list[int], list[list[int]]]:
    """Per device (axis order): least and most rows, and the sizes ordered outward from its share.

    ADaPS Eq. 1: share_d = rows * speed_d / sum(speed); Eq. 2: max = rows - (D - 1); Eq. 3: the window
    reaches threshold * (max - share) either side of the share (at least one row), never below 0 rows
    (a device may sit out a segment whose tensor has fewer rows than there are devices)."""
    n = len(speed)
    share = rows * speed / speed.sum()
    biggest = rows - (n - 1) if rows >= n else rows
    base = np.floor(share).astype(int)
    w = np.maximum(1, np.ceil((biggest - base) * threshold)).astype(int)
    lo, hi = np.clip(base - w, 0, biggest), np.clip(base + w, 0, biggest)
    order = [sorted(range(l, h + 1), key=lambda s, c=c: (abs(s - c), s)) for l, h, c in zip(lo, hi, share)]
    return lo.tolist(), hi.tolist(), order


def _room(floors, level: float, pos: int, lo, hi, rows: int, shift=None) -> bool:
    """Can devices pos.. share `rows` rows with each one's floor time (+ shift) < level (water-filling)?"""
    total = 0
    for p in range(pos, len(floors)):
        cap = min(hi[p], max(0, bisect.bisect_left(floors[p], level - (shift[p] if shift else 0.0)) - 1))
        if cap < lo[p]:
            return False
        total += cap
    return total >= rows


def _room_receiving(floors, level: float, lo, hi, rows: int, receivers: int, delay) -> bool:
    """_room when `receivers` of the devices (any, each with at least one row) also wait `delay` before
    computing: they are the devices whose rows below the level shrink least."""
    total, losses = 0, []
    for p in range(len(floors)):
        cap = min(hi[p], max(0, bisect.bisect_left(floors[p], level) - 1))
        if cap < lo[p]:
            return False
        late = min(hi[p], max(0, bisect.bisect_left(floors[p], level - delay[p]) - 1))
        total += cap
        losses.append(cap - late if late >= max(lo[p], 1) else INF)
    return total - sum(sorted(losses)[:receivers]) >= rows


class _Budget(Exception):
    """A partition search ran out of nodes; it keeps the best partitions found so far."""


class _Partitions:
    """The k cheapest partitions of one segment output after a known state, with step < bound.

    First a level search (bisect a time level; left to right every device takes the most rows that keep
    it below the level) finds a good partition in O(D log rows) steps; then a branch and bound over tile
    sizes (one tree level per device, sizes outward from the share; cut when a device or a
    water-filling bound of the rest reaches the k-th best) proves it or improves on it. The tree search
    stops after `budget` nodes (None: never, exact)."""

    def __init__(self, model: StepModel, cx: Step, win, floors, bound: float, k: int | None, budget, stats,
                 floor: float = 0.0):
        self.model, self.cx, self.floors, self.bound, self.k, self.stats = model, cx, floors, bound, k, stats
        self.floor = floor  # a lower bound of any partition's step time
        self.lo, self.hi, self.order = win
        self.centre = [o[0] for o in self.order]
        self.n, self.m = len(model.devs), cx.sc.rows
        self.min_rest = [sum(self.lo[p:]) for p in range(self.n + 1)]
        self.max_rest = [sum(self.hi[p:]) for p in range(self.n + 1)]
        self.heap: list = []  # max-heap (-cost, partition) of the k best
        self.lim = bound  # the bound, or the k-th best once there are k
        self._room_at = None  # the level of the suffix capacities below (rest_has_room)
        self.nodes, self.budget = 0, budget
        self.source = self._scatter_floors() if len(cx.holders) == 1 else None
        self.labels: dict = {}
        devs = model.devs
        self.later = [set(devs[p:]) for p in range(self.n + 1)]

    def _scatter_floors(self) -> list:
        """With one holder (the scatter) every other device also waits for its own message, which
        comes after the holder's earlier messages: add the least message time to its floor."""
        model, cx = self.model, self.cx
        h = cx.holders[0][0]
        rows = cx.sc.need_floor()
        for pos, d in enumerate(model.devs):
            if d != h:
                msg = [0.0] + [r * cx.sc.in_bytes / model.bw[h][d] + model.lat[h][d] for r in rows[1:]]
                self.floors[pos] = [f + t for f, t in zip(self.floors[pos], msg)]
        others = [d for d in model.devs if d != h]
        ratio = min((rows[r] / r for r in range(1, len(rows))), default=0.0)
        extra = min((rows[r] - ratio * r for r in range(1, len(rows))), default=0.0)  # halo rows per message
        fastest = max((model.bw[h][d] for d in others), default=INF)
        lat = min((model.lat[h][d] for d in others), default=0.0)
        self.queue = (ratio * cx.sc.in_bytes / fastest, lat + extra * cx.sc.in_bytes / fastest,
                      model.devs.index(h) if h in model.devs else -1)
        return [d != h for d in model.devs]

    def queued(self, pos: int, b: int, sent, done, lim: float) -> bool:
        """Scatter bound: the holder sends the remaining devices' rows one message after another, so
        the last of them has its rows no sooner than all rows, and the fewest messages that can
        carry them, are sent; and the holder computes its own tile only after that."""
        per_row, per_msg, h = self.queue
        rest = self.m - b - (self.hi[h] if h > pos else 0)
        if rest <= 0:
            return True
        own = next((c for p, _, c in done if p == h), 0.0)
        msgs = 0
        for size in sorted((self.hi[q] for q in range(pos + 1, self.n) if q != h), reverse=True):
            msgs, rest_left = msgs + 1, rest - size
            if rest_left <= 0:
                break
            rest = rest_left
        return sent[0] + (self.m - b - (self.hi[h] if h > pos else 0)) * per_row + msgs * per_msg + own < lim

    def shift(self, sent) -> list | None:
        """Per device: time the single holder is already busy sending (0 for the holder itself)."""
        return [sent[0] if w else 0.0 for w in self.source] if self.source else None

    def offer(self, total: float, part: tuple) -> None:
        if total < self.lim and all(p != part for _, p in self.heap):
            heapq.heappush(self.heap, (-total, part))
            if self.k is not None and len(self.heap) > self.k:
                heapq.heappop(self.heap)
            if self.k is not None and len(self.heap) >= self.k:
                self.lim = min(self.bound, -self.heap[0][0])

    def rest_has_room(self, pos: int, rows: int, lim: float, sent) -> bool:
        """_room for devices pos.. at level lim. Without a scatter's shifts each device's capacity depends
        on the level only: suffix sums, computed once per level, answer in O(1)."""
        if self.source:
            return _room(self.floors, lim, pos, self.lo, self.hi, rows, self.shift(sent))
        if self._room_at != lim:
            n, ok, total = self.n, [True] * (self.n + 1), [0] * (self.n + 1)
            for p in range(n - 1, -1, -1):
                cap = min(self.hi[p], max(0, bisect.bisect_left(self.floors[p], lim) - 1))
                ok[p], total[p] = ok[p + 1] and cap >= self.lo[p], total[p + 1] + cap
            self._room_at, self._ok, self._total = lim, ok, total
        return self._ok[pos] and self._total[pos] >= rows

    def run(self) -> tuple[list[tuple[float, tuple]], bool]:
        self.seed()
        done = True
        try:
            self.dfs(0, 0, (0.0,) * len(self.cx.holders), 0.0, 0.0, (), (0,))
        except _Budget:
            done = False
        return sorted((-c, p) for c, p in self.heap), done

    def _span(self, pos: int, a: int) -> tuple[int, int]:
        """Feasible ends of device pos's tile starting at a (window and what the rest can take)."""
        rest = self.m - a
        return a + max(self.lo[pos], rest - self.max_rest[pos + 1]), a + min(self.hi[pos], rest - self.min_rest[pos + 1])

    def greedy(self, level: float) -> tuple[float, tuple] | None:
        model, cx = self.model, self.cx
        a, sent, chan, done, part = 0, (0.0,) * len(cx.holders), 0.0, [], [0]
        term = model.term
        for pos in range(self.n):
            first, last = self._span(pos, a)
            if first > last:
                return None
            if first > a:
                r, c, _, _ = term(cx, pos, a, first, sent, chan)
                if r + c >= level:
                    return None
            while first < last:  # largest b that fits: a device's time only grows with its rows
                mid = (first + last + 1) // 2
                r, c, _, _ = term(cx, pos, a, mid, sent, chan)  # mid > first >= a
                if r + c < level:
                    first = mid
                else:
                    last = mid - 1
            if first > a:
                r, c, sent, chan = model.term(cx, pos, a, first, sent, chan)
                done.append((pos, r, c))
            a = first
            part.append(a)
        return model.finish(cx, done, sent), tuple(part)

    def seed(self, iters: int = 4) -> None:
        top = self.greedy(INF)
        if top is None:
            return
        self.offer(*top)
        low, high = self.floor, min(top[0], self.bound)
        for _ in range(iters):
            mid = (low + high) / 2
            got = self.greedy(mid)
            if got is not None:
                self.offer(*got)
            low, high = (low, mid) if got is not None and got[0] < mid else (mid, high)

    def visit(self, pos, a, b, sent, chan, cur, done, bounds) -> int:
        """Expand one size; -1: this and every larger size fail, +1: this and every smaller one."""
        if self.m - b < self.min_rest[pos + 1]:
            return -1
        if self.m - b > self.max_rest[pos + 1]:
            return 1
        t = 0.0
        if b > a:
            r, c, sent, chan = self.model.term(self.cx, pos, a, b, sent, chan)
            t, done = r + c, done + ((pos, r, c),)
        lim = self.lim
        if max(cur, t) >= lim:  # a device's time only grows with its rows
            self.stats.pruned += 1
            return -1 if t >= lim else 0
        if pos == self.n - 1:
            self.offer(self.model.finish(self.cx, done, sent), bounds + (b,))
        elif not self.rest_has_room(pos + 1, self.m - b, lim, sent) or (
                self.source and not self.queued(pos, b, sent, done, lim)):  # the rest gets more rows below
            self.stats.pruned += 1
            return 1
        else:
            self.dfs(pos + 1, b, sent, chan, max(cur, t), done, bounds + (b,))
        return 0

    def label(self, pos, a, sent, chan, cur, done) -> tuple:
        """What the rest of the tree depends on at (pos, a), all monotone: the finished devices' time,
        the busy time of holders that may still send or whose device is still to come, the channel,
        and (arrival, compute) of devices waiting on such a holder."""
        cx, first = self.cx, self.cx.need_first[a]
        live = [e for e, (d, _, end) in enumerate(cx.holders) if end > first or d in self.later[pos]]
        pend = {p: (r, c) for p, r, c in done if cx.sender[p] in live}
        fixed = max([cur] + [max(r, sent[cx.sender[p]]) + c for p, r, c in done if p not in pend and cx.sender[p] >= 0])
        return (fixed, chan, *[sent[e] for e in live],
                *[x for p in range(pos) if cx.sender[p] in live for x in pend.get(p, (-INF, -INF))])

    def dominated(self, pos, a, label) -> bool:
        """Sub-tree reuse: skip a node whose label k earlier nodes at (pos, a) match or beat everywhere."""
        seen = self.labels.setdefault((pos, a), [])
        if sum(all(x <= y + 1e-9 for x, y in zip(old, label)) for old in seen) >= self.k:  # sums differ in rounding
            return True
        if len(seen) < 32:
            seen.append(label)
        return False

    def dfs(self, pos, a, sent, chan, cur, done, bounds) -> None:
        # labels pay off in the scatter, where many partitions reach a node with the same sends queued
        if self.source and self.k is not None and pos > 0 and self.dominated(pos, a, self.label(pos, a, sent, chan, cur, done)):
            self.stats.memo_hits += 1
            return
        self.stats.nodes_visited += 1
        self.nodes += 1
        if self.budget is not None and self.nodes > self.budget:
            raise _Budget
        if pos == self.n - 1:
            if self.lo[pos] <= self.m - a <= self.hi[pos]:
                self.visit(pos, a, self.m, sent, chan, cur, done, bounds)
            return
        up = down = True
        c = self.centre[pos]
        for size in self.order[pos]:  # outward from the share, both directions until each fails
            # an idle device sends and receives nothing: size 0 is not bounded by size 1
            if size >= c and up or size < c and down or size == 0:
                verdict = self.visit(pos, a, a + size, sent, chan, cur, done, bounds)
                up &= not (verdict < 0 and size >= c)
                down &= not (verdict > 0 and size < c)
                if not (up or down) and self.lo[pos] > 0:
                    break


class SpatialSearch:
    """Search over one device order (axis order; devs[0] is the gather device) and one axis."""

    def __init__(self, graph: LayerGraph, cost: CostTable, axis: int, devices: list[str], cuts: tuple[int, ...],
                 rest: list[float], threshold: float = 0.1, budget: int | None = 1000, seg_cache: dict | None = None,
                 max_span: int | None = MAX_SPAN, exact_rest=None, entries: dict[int, float] | None = None):
        self.graph, self.cost, self.axis, self.cuts, self.rest, self.thr = graph, cost, axis, cuts, rest, threshold
        # entries[j]: what reaching cut j with its tensor whole on the gather device costs (a stem run
        # before the group); the group may start at any of them with a scatter. Default: the model input.
        self.entries = {0: 0.0} if entries is None else dict(entries)
        self.entry_of: dict[int, int] = {}  # end cut index -> the entry cut index of ends[end]'s path
        # rest[j]: the layers after an end at cut j; exactly, or (with exact_rest(j, tail), called only for
        # the ends the search reaches) a lower bound of it. A tuple of such lists: several tails at once
        # (run_tails), e.g. spatial's (stay on the gather device) and hybrid's (pipeline stages).
        self.rests = tuple(rest) if isinstance(rest, tuple) else (rest,)
        self.rest = self.rests[0]
        self._exact = exact_rest
        self.max_span = max_span
        self.devs = [cost.index(d) for d in devices]
        self.g, self.budget = self.devs[0], budget
        self.model = StepModel(cost, self.devs)
        prefix = cost.layer_ms[cuts[0]:cuts[-1]].sum(axis=0)
        self.speed = np.array([1.0 / max(prefix[d], 1e-9) for d in self.devs])
        self.stats = SearchStats()
        # segment costs, and bounds of a device set, do not depend on device order: searches share them
        self._seg = {} if seg_cache is None else seg_cache
        self._win: dict = {}
        self._memo: dict = {}
        self._lb: dict = {}

    # -- model -----------------------------------------------------------------------------------

    def seg(self, j: int, j2: int) -> SegmentCost:
        if (j, j2) not in self._seg:
            self._seg[j, j2] = SegmentCost.build(self.graph, self.cost, self.cuts[j], self.cuts[j2], self.axis)
        return self._seg[j, j2]

    def window(self, j: int):
        if j not in self._win:
            self._win[j] = windows(self.seg(j - 1, j).rows, self.speed, self.thr)
        return self._win[j]

    def holders(self, j: int, part) -> list[tuple[int, int, int]]:
        if part is None:  # the tensor at entry cut j, whole, on the gather device
            maps = self.seg(j, j + 1).maps
            return [(self.g, 0, maps.size[maps.input])]
        return [(d, a, b) for d, a, b in zip(self.devs, part, part[1:]) if b > a]

    def step(self, j: int, part, j2: int, part2) -> float:
        return self.model.score(self.model.context(self.seg(j, j2), self.holders(j, part)), part2)

    def gather(self, j: int, part) -> float:
        return self.model.gather(self.seg(j - 1, j), self.holders(j, part), self.g)

    # -- bounds ----------------------------------------------------------------------------------

    def seg_lb(self, j: int, j2: int) -> float:
        """Least possible step time of segment (j, j2): best-placed tiles, each device no faster than its
        least time for its rows (water-filling), plus the transfers every partition must make: for the
        first segment the scatter (`_scatter_lb`), for a later one the halo (`_halo`)."""
        if (j, j2) not in self._lb:
            sc, (lo, hi, _) = self.seg(j, j2), self.window(j2)
            floors = [sc.floor(d) for d in self.devs]
            shared = ("lb", frozenset(self.devs), j, j2)  # the same for any order of the same devices
            if shared not in self._seg:
                halo = self._halo(j, j2) if j > 0 else None
                a, b = 0.0, max(f[-1] for f in floors) + (max(halo[1]) if halo else 0.0) + 1.0
                for _ in range(12):  # `a` never has room: a lower bound however early the bisection stops
                    mid = (a + b) / 2
                    room = _room(floors, mid, 0, lo, hi, sc.rows) if halo is None else _room_receiving(floors, mid, lo, hi, sc.rows, *halo)
                    a, b = (a, mid) if room else (mid, b)
                self._seg[shared] = a
            a = self._seg[shared]
            if j == 0:
                a = max(a, self._scatter_lb(sc, lo, hi, floors))
            self._lb[j, j2] = a
        return self._lb[j, j2]

    def _halo(self, j: int, j2: int) -> tuple[int, list[float]] | None:
        """(receivers, per-device delay): the halo every partition of segment (j, j2) must receive.

        Two adjacent tiles both read the `ov` input rows [first[b], end[b]) around their boundary b, and
        the partition at cut j left each such row on one device only (its tiles are disjoint), so one of
        the two receives at least ceil(ov / 2) of them. Over the boundaries of k tiles those receivers
        cover a path of k nodes: at least k // 2 distinct devices, k at least the devices whose window
        floor is above 0. A receiver computes only after its rows arrive, from at most as many holders
        in parallel as a run of that many rows can touch (tiles at cut j hold at least `least` rows)."""
        sc, lo = self.seg(j, j2), self.window(j2)[0]
        receivers = sum(l > 0 for l in lo) // 2
        _, _, _, first, end = sc.lists
        ov = min((end[b] - first[b] for b in range(1, sc.rows)), default=0)
        if receivers == 0 or ov <= 0:
            return None
        r = (ov + 1) // 2
        least = min(max(l, 1) for l in self.window(j)[0])
        holders = min(r, len(self.devs) - 1, 1 + -(-(r - 1) // least))
        rows = -(-r // holders)  # the largest of the messages
        bw, lat = self.model.bw, self.model.lat
        delay = []
        for d in self.devs:
            others = [q for q in self.devs if q != d]
            delay.append(min(lat[q][d] for q in others) + rows * sc.in_bytes / max(bw[q][d] for q in others))
        return receivers, delay

    def _scatter_lb(self, sc: SegmentCost, lo, hi, floors) -> float:
        """Least step time of the first segment, whose input is whole on the gather device (position 0,
        so the other tiles are the contiguous rows after its tile): it sends every other busy device
        its rows, one message after another, and the last of those devices (or the gather device, which
        computes after its sends) then computes at least its least rows."""
        g, bw, lat = self.g, self.model.bw, self.model.lat
        others = [(p, d) for p, d in enumerate(self.devs) if p > 0]
        if not others or sc.rows <= hi[0]:
            return 0.0
        need = sc.need_floor()
        each = sum(need[lo[p]] * sc.in_bytes / bw[g][d] + lat[g][d] for p, d in others if lo[p] > 0)
        msgs = max(1, sum(lo[p] > 0 for p, _ in others))
        whole = msgs * min(lat[g][d] for _, d in others) + need[sc.rows - hi[0]] * sc.in_bytes / max(bw[g][d] for _, d in others)
        last = min(floors[p][max(lo[p], 1)] for p in range(len(self.devs)) if hi[p] > 0)
        return max(each, whole) + last

    def gather_lb(self, j: int) -> float:
        """Least possible gather after cut j: every other device returns at least its smallest tile."""
        sc, (lo, hi, _) = self.seg(j - 1, j), self.window(j)
        bw, lat, g = self.model.bw, self.model.lat, self.g
        ms = [lo[p] * sc.out_bytes / bw[d][g] + lat[d][g] for p, d in enumerate(self.devs) if p > 0 and lo[p] > 0]
        each = sum(ms) if self.model.shared else max(ms, default=0.0)
        others = self.devs[1:]
        if not others or sc.rows <= hi[0]:
            return each
        # the rows after the gather device's tile come back over at most len(others) links in parallel
        spread = (sc.rows - hi[0]) / (1 if self.model.shared else len(others))
        return max(each, min(lat[d][g] for d in others) + spread * sc.out_bytes / max(bw[d][g] for d in others))

    def completion_lb(self, tail: int = 0) -> list[float]:
        """lb[j]: least cost from a state at cut j to the end of the model (any later cuts and end)."""
        n, rest = len(self.cuts), self.rests[tail]
        lb = [INF] * n
        for j in range(n - 1, 0, -1):
            lb[j] = min([rest[j] + self.gather_lb(j), *[self.seg_lb(j, j2) + lb[j2] for j2 in self.nexts(j)]])
        lb[0] = min(self.seg_lb(0, j2) + lb[j2] for j2 in self.nexts(0))
        return lb

    # -- search ----------------------------------------------------------------------------------

    def nexts(self, j: int) -> range:
        """Cuts a segment starting at cut j may end at (`_nexts`)."""
        return _nexts(j, len(self.cuts), self.max_span)

    def transition(self, j: int, part, j2: int, bound: float, k: int | None) -> list[tuple[float, tuple]]:
        """The k cheapest partitions of cut j2 after state (j, part) with step < bound (memoised)."""
        key = (j, part, j2)
        if key in self._memo:
            b0, k0, res = self._memo[key]
            if bound <= b0 and (k0 is None or (k is not None and k <= k0)):
                self.stats.memo_hits += 1
                return [r for r in res if r[0] < bound][:k]
        floor = self.seg_lb(j, j2)
        if floor >= bound:  # no partition of this segment beats the bound: skip the partition search
            self.stats.pruned += 1
            return []
        sc = self.seg(j, j2)
        cx = self.model.context(sc, self.holders(j, part))
        floors = [list(sc.floor(d)) for d in self.devs]
        res, complete = _Partitions(self.model, cx, self.window(j2), floors, bound, k, self.budget, self.stats,
                                    floor).run()
        self.stats.exact &= complete
        self._memo[key] = (bound, k, res)
        return res

    def run(self, beam: int | None = 6, branch: int | None = 3, incumbent: float = INF) -> dict[int, tuple]:
        """Forward DP over cuts. Returns {end cut index: (total, path)}; path = [(cut index, partition)]."""
        return {j: (prefix + self.rest_at(j), path) for j, (prefix, path) in self.run_tails(beam, branch, incumbent).items()}

    def run_tails(self, beam: int | None = 6, branch: int | None = 3, incumbent=INF,
                  slack: float | None = None) -> dict[int, tuple]:
        """run() for every tail at once: {end cut index: (cost before the tail, path)}, the best path to
        each end (the same for every tail). `incumbent`: one bound, or one per tail. A state is pruned
        only when no tail can beat its own incumbent through it, so each tail finds what a search with
        it alone would. With `slack`, the tails compete (only the best plan of any tail matters): a
        total found for one tail also bounds the others, at (1 + slack) times it."""
        n, tails = len(self.cuts), range(len(self.rests))
        lbs = [self.completion_lb(t) for t in tails]
        inc = list(incumbent) if isinstance(incumbent, (list, tuple)) else [incumbent] * len(self.rests)
        states: list[dict] = [dict() for _ in range(n)]
        for j, base in self.entries.items():
            states[j][None] = (base, None)
        ends: dict[int, tuple] = {}
        for j in range(n):
            items = sorted(((p, vp) for p, vp in states[j].items() if p is not None), key=lambda kv: kv[1][0])
            if beam is not None and len(items) > beam:
                items, self.stats.exact = items[:beam], False
            if None in states[j]:  # an entry is never beamed out: it is the only way to start there
                items.insert(0, (None, states[j][None]))
            for part, (v, _) in items:
                if all(v + lbs[t][j] >= inc[t] for t in tails):
                    self.stats.pruned += 1
                    continue
                self.stats.states += 1
                if part is not None:  # an entry state has tiled nothing yet: it cannot end the group
                    prefix = v + self.gather(j, part)
                    if prefix < ends.get(j, (INF,))[0]:
                        self.entry_of[j], path = self._path(states, j, part)
                        ends[j] = (prefix, path)
                    for t in tails:
                        if prefix + self.rests[t][j] < inc[t]:  # else the exact tail cannot lower it
                            inc[t] = min(inc[t], prefix + self.rest_at(j, t))
                            if slack is not None:
                                inc = [min(x, inc[t] * (1.0 + slack)) for x in inc]
                for j2 in self.nexts(j):
                    found = self.transition(j, part, j2, max(inc[t] - v - lbs[t][j2] for t in tails), branch)
                    if branch is not None and len(found) >= branch:
                        self.stats.exact = False
                    for c, part2 in found:
                        if v + c < states[j2].get(part2, (INF,))[0]:
                            states[j2][part2] = (v + c, (j, part))
        return ends

    def rest_at(self, j: int, tail: int = 0) -> float:
        """The exact cost of the layers after an end at cut j."""
        return self.rests[tail][j] if self._exact is None else self._exact(j, tail)

    @staticmethod
    def _path(states, j, part) -> tuple[int, list[tuple[int, tuple]]]:
        """(entry cut index, [(cut index, partition)]) of the best way to state (j, part)."""
        path = []
        while part is not None:
            path.append((j, part))
            j, part = states[j][part][1]
        return j, path[::-1]

    def exhaustive(self) -> tuple[float, list]:
        """Reference: every entry, segmentation, end and partition sequence in the search space (tiny cases)."""
        best = (INF, [])

        def go(j, part, v, path):
            nonlocal best
            if part is not None:
                best = min(best, (v + self.gather(j, part) + self.rest_at(j), path), key=lambda x: x[0])
            for j2 in self.nexts(j):
                for p2 in self.partitions(j2):
                    go(j2, p2, v + self.step(j, part, j2, p2), path + [(j2, p2)])

        for j, base in self.entries.items():
            go(j, None, base, [])
        return best

    def partitions(self, j: int):
        lo, hi, _ = self.window(j)
        m = self.seg(j - 1, j).rows
        for sizes in itertools.product(*[range(l, h + 1) for l, h in zip(lo, hi)]):
            if sum(sizes) == m:
                yield (0, *itertools.accumulate(sizes))

    def space_log10(self) -> float:
        """log10 of the number of (entry, end, segmentation, partition per segment) choices searched over.
        A count of tile sizes within windows that do not depend on the device order: shared by the searches
        over the same devices (seg_cache)."""
        key = ("space", frozenset(self.devs), tuple(sorted(self.entries)), self.thr, self.max_span)
        if key not in self._seg:
            self._seg[key] = self._space_log10()
        return self._seg[key]

    def _space_log10(self) -> float:
        logn = [0.0]
        for j in range(1, len(self.cuts)):
            lo, hi, _ = self.window(j)
            ways = np.zeros(self.seg(j - 1, j).rows + 1)
            ways[0] = 1.0
            for l, h in zip(lo, hi):
                c = np.concatenate([[0.0], np.cumsum(ways)])
                ways = np.array([c[max(0, r - l + 1)] - c[max(0, r - h)] for r in range(len(ways))])
            logn.append(math.log10(ways[-1]) if ways[-1] > 0 else -INF)
        start = [0.0 if i in self.entries else -INF for i in range(len(self.cuts))]
        paths = [-INF] * len(self.cuts)  # log10 of the ways to end a segment at cut j
        for j in range(1, len(self.cuts)):
            for i in range(j):
                if j in self.nexts(i):
                    paths[j] = _log10_add(paths[j], _log10_add(paths[i], start[i]) + logn[j])
        return _sum_log(paths[1:])

    def to_stages(self, path, end: int, strategy_device: str, entry: int = 0) -> tuple[Stage, ...]:
        """The spatial stage of a path from entry cut index `entry` to cut index `end`."""
        segs, prev = [], entry
        for j, part in path:
            tiles = tuple(Tile(self.cost.devices[d], a, b) for d, a, b in zip(self.devs, part, part[1:]) if b > a)
            segs.append(Segment(self.cuts[prev], self.cuts[j], tiles))
            prev = j
        return (Stage(strategy_device, self.cuts[entry], self.cuts[end], SpatialGroup(self.axis, tuple(segs))),)


def _nexts(j: int, n: int, max_span: int | None) -> range:
    """Of n cuts, those a segment starting at cut j may end at: at most `max_span` block cuts on (a deep
    fused segment recomputes a halo that grows with every window; DenseNet has 67 cuts, n^2 transitions)."""
    return range(j + 1, n if max_span is None else min(n, j + 1 + max_span))


def build_segments(graph: LayerGraph, cost: CostTable, axis: int, cuts: tuple[int, ...], cache: dict,
                   max_span: int | None = MAX_SPAN) -> None:
    """Put into `cache` (a `seg_cache` of SpatialSearch) the cost of every segment a search over `cuts`
    may fuse, with each device's floor: its completion bound prices them all. Built once before the
    searches fork (lanes.py), each process inherits them instead of building its own."""
    for j in range(len(cuts) - 1):
        for j2 in _nexts(j, len(cuts), max_span):
            if (j, j2) not in cache:
                cache[j, j2] = SegmentCost.build(graph, cost, cuts[j], cuts[j2], axis)
                for d in range(len(cost.devices)):
                    cache[j, j2].floor(d)


def _sum_log(xs: list[float]) -> float:
    out = -INF
    for x in xs:
        out = _log10_add(out, x)
    return out
