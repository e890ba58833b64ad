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
no transfers) reaches the incumbent. The partition of one cut is found by spatial_partitions'
PartitionSearch: a level search for a good first answer, then branch and bound over tile sizes with
water-filling bounds, scatter bounds and sub-tree reuse (nodes whose remaining problem is no better than k
seen ones are skipped). The two meet at one call (`transition`): this module owns the states, the
incumbent and the completion bounds, and passes the partition search only a bound and a k.

Exact when unbounded (beam=None, branch=None, budget=None: tests compare with `exhaustive`); by default
the DP keeps `beam` states per cut, `branch` partitions per transition, and each partition search stops
after `budget` nodes with the best partitions found so far (SearchStats.exact says whether any limit bit).

Peak memory of a search over G devices and J cuts: its states (at most `beam` per cut) and its memo, at most
J x beam x MAX_SPAN transitions of `branch` partitions (G + 1 row offsets each); a partition search holds its
k best and at most 32 labels per (position, rows), O(G M) for M rows. The segment costs are the caller's.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass

import numpy as np

from ..cost import CostTable
from ..cost.tile_steps import StepModel
from ..cost.tiles import SegmentCost
from ..graph import LayerGraph
from ..plan_types import Segment, SpatialGroup, Stage, Tile
from .spatial_partitions import INF, PartitionSearch, has_room, has_room_receiving, windows

__all__ = ["SearchStats", "SpatialSearch", "build_segments", "INF", "MAX_SPAN"]

logger = logging.getLogger(__name__)
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
    truncated: int = 0  # searches a node budget cut short or skipped
    unsearched_ms: float = INF  # no plan those searches left unfound totals less (their completion bounds)
    groups: str = ""  # how the device groups were drawn when not every mix of classes (spatial_groups.py)

    def add(self, other: "SearchStats") -> None:
        self.search_space_log10 = _log10_add(self.search_space_log10, other.search_space_log10)
        for f in ("nodes_visited", "states", "memo_hits", "pruned", "seconds", "searches", "truncated"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.exact &= other.exact
        self.unsearched_ms = min(self.unsearched_ms, other.unsearched_ms)
        self.groups = self.groups or other.groups


def _log10_add(x: float, y: float) -> float:
    if x == -INF or y == -INF:
        return max(x, y)
    hi, lo = max(x, y), min(x, y)
    return hi + math.log10(1.0 + 10 ** (lo - hi))


class SpatialSearch:
    """Search over one device order (axis order; devs[0] is the gather device) and one axis."""

    def __init__(self, graph: LayerGraph, cost: CostTable, axis: int, devices: list[str], cuts: tuple[int, ...],
                 rest: list[float], threshold: float = 0.1, budget: int | None = 1000, seg_cache: dict | None = None,
                 max_span: int | None = MAX_SPAN, exact_rest=None, entries: dict[int, float] | None = None,
                 nodes_left: int | None = None):
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
        # partition-tree nodes this search may still expand in all (None: no limit); when they run out the
        # search stops with the ends found so far and the bound of the states it did not expand (run_tails)
        self.nodes_left = nodes_left
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
            shared = ("lb", frozenset(self.devs), j, j2)  # the same for any order of the same devices
            # each device's floor, when needed: a search over devices another search bounded already
            # needs them only for the scatter
            floors = [sc.floor(d) for d in self.devs] if shared not in self._seg or j == 0 else None
            if shared not in self._seg:
                halo = self._halo(j, j2) if j > 0 else None
                a, b = 0.0, max(f[-1] for f in floors) + (max(halo[1]) if halo else 0.0) + 1.0
                for _ in range(12):  # `a` never has room: a lower bound however early the bisection stops
                    mid = (a + b) / 2
                    room = has_room(floors, mid, 0, lo, hi, sc.rows) if halo is None else has_room_receiving(floors, mid, lo, hi, sc.rows, *halo)
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
        budget, before = self.budget, self.stats.nodes_visited
        if self.nodes_left is not None:
            budget = self.nodes_left if budget is None else min(budget, self.nodes_left)
        res, complete = PartitionSearch(self.model, cx, self.window(j2), floors, bound, k, budget, self.stats,
                                    floor).run()
        if self.nodes_left is not None:
            self.nodes_left -= self.stats.nodes_visited - before
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
                if self.nodes_left is not None and self.nodes_left <= 0:
                    self._truncate(states, j, lbs, inc)
                    return ends
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
                    if self.nodes_left is not None and self.nodes_left <= 0:
                        break  # out of nodes: _truncate below bounds what this state's later transitions left
                    found = self.transition(j, part, j2, max(inc[t] - v - lbs[t][j2] for t in tails), branch)
                    if branch is not None and len(found) >= branch:
                        self.stats.exact = False
                    for c, part2 in found:
                        if v + c < states[j2].get(part2, (INF,))[0]:
                            states[j2][part2] = (v + c, (j, part))
                if self.nodes_left is not None and self.nodes_left <= 0:  # this state's transitions ran out
                    self._truncate(states, j, lbs, inc)
                    return ends
        return ends

    def _truncate(self, states: list[dict], j: int, lbs: list[list[float]], inc: list[float]) -> None:
        """Out of nodes at cut j: no plan through a state at cut j or later totals less than its cost plus
        its completion bound (the states at j already expanded included, as their last transition may
        have been cut short). Counted as truncated only when such a bound is below its tail's incumbent
        (else every state left would have been pruned)."""
        self.stats.exact = False
        self._unsearched([(v, j2) for j2 in range(j, len(self.cuts)) for v, _ in states[j2].values()], lbs, inc)

    def skip(self, incumbent=INF) -> None:
        """Record this search as skipped (its budget spent before it started), with the bound no plan of it
        beats: its entries' costs plus their completion bounds (`_truncate`)."""
        lbs = [self.completion_lb(t) for t in range(len(self.rests))]
        inc = list(incumbent) if isinstance(incumbent, (list, tuple)) else [incumbent] * len(self.rests)
        self.stats.exact = False
        self._unsearched([(base, j) for j, base in self.entries.items()], lbs, inc)

    def _unsearched(self, states: list[tuple[float, int]], lbs, inc) -> None:
        bound = min([INF, *(v + lb[j] for v, j in states for lb, b in zip(lbs, inc) if v + lb[j] < b)])
        if bound < INF:
            self.stats.truncated += 1
            self.stats.unsearched_ms = min(self.stats.unsearched_ms, bound)

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
