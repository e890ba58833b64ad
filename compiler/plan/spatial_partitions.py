"""The partition search of one transition: the k cheapest tile sizes per device for one segment output.

SpatialSearch (spatial_search.py) asks it, for a known state (the rows each device holds after the
previous cut) and a segment to the next cut, for the k partitions of the segment's output rows whose step
time is below a bound. Candidate sizes per device come from ADaPS's windows (`windows`, Eq. 1-3); the
water-filling capacity tests (`has_room`, `has_room_receiving`) are shared with the search's lower bounds.
Exact when `budget` is None; otherwise it stops after `budget` tree nodes with the best found so far.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from ..cost.tile_steps import Step, StepModel

__all__ = ["PartitionSearch", "windows", "has_room", "has_room_receiving", "INF"]

INF = float("inf")


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


def has_room(floors, level: float, pos: int, lo, hi, rows: int, shift=None) -> bool:
    """Can devices pos.. share `rows` rows with each one's floor time (+ shift) < level (water-filling)?"""
    total = 0
    for p in range(pos, len(floors)):
        cap = min(hi[p], max(0, bisect.bisect_left(floors[p], level - (shift[p] if shift else 0.0)) - 1))
        if cap < lo[p]:
            return False
        total += cap
    return total >= rows


def has_room_receiving(floors, level: float, lo, hi, rows: int, receivers: int, delay) -> bool:
    """has_room when `receivers` of the devices (any, each with at least one row) also wait `delay` before
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


class _OutOfNodes(Exception):
    """A partition search ran out of nodes; it keeps the best partitions found so far."""


class PartitionSearch:
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
        """has_room for devices pos.. at level lim. Without a scatter's shifts each device's capacity depends
        on the level only: suffix sums, computed once per level, answer in O(1)."""
        if self.source:
            return has_room(self.floors, lim, pos, self.lo, self.hi, rows, self.shift(sent))
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
        except _OutOfNodes:
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
            raise _OutOfNodes
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
