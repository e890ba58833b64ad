"""Spatial planner: tile boundaries and layer fusion by ADaPS-style branch-and-bound search, plus hybrid plans.

Search model (the "step" score, ADaPS Eq. 4-11 made exact per device). A spatial group is a chain of
segments; segment k runs layers [cut_i, cut_j) fused on every tile. All devices start a segment together;
device d first receives the input rows its tile needs that it does not hold (each sender sends its
messages one after another in tile order; on a shared medium all messages queue on one channel), then
computes its tile (recomputed halo rows included, see spatial_cost.SegmentCost). The step costs the
slowest device. The group starts with the input on the gather device (a scatter), ends with a gather
(every tile sent to the gather device), and the layers after it cost `rest` (Type-3 layers on the gather
device, or a pipeline in `plan_hybrid`). Total = sum of steps + gather + rest.

Search space: per cut, tile sizes within ADaPS's bounds (Eq. 1-3: a window around the speed-proportional
share, width threshold * (max size - share)); any subset of block cuts as segment boundaries; any end.
Search: a forward dynamic program over (cut, partition) states (memoisation: a state's best prefix is
kept once, and the k best next partitions of a (state, next cut) pair are cached and reused: sub-tree
reuse), with alpha-beta style pruning: a state is dropped when its cost plus a lower bound of any
completion reaches the incumbent, and the partition tree (one level per device, sizes ordered outward
from the proportional share) is cut when a partial max or a water-filling bound on the remaining devices
reaches the k-th best. With beam=None and branch=None it is exact (tests compare it with `exhaustive`);
the defaults keep `beam` states per cut and `branch` children per transition. Final candidates are
re-scored with the event simulation (compiler.simulate) and the best predicted plan wins.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from ..cost import CostTable
from ..graph import LayerGraph
from ..spatial.regions import spatial_cuts
from .problem import InfeasibleError
from .spatial_cost import SegmentCost, Step, StepModel, group_param_bytes
from .types import Plan, Segment, SpatialGroup, Stage, Tile

__all__ = ["SearchStats", "SpatialSearch", "plan_spatial", "plan_hybrid", "device_classes"]

logger = logging.getLogger(__name__)
INF = float("inf")


@dataclass
class SearchStats:
    search_space_log10: float = 0.0  # partitions x segmentations x ends within the threshold bounds
    nodes_visited: int = 0  # partition-tree nodes expanded
    states: int = 0  # (cut, partition) states expanded
    memo_hits: int = 0
    pruned: int = 0
    seconds: float = 0.0
    exact: bool = True  # False when a beam/branch limit dropped candidates

    def add(self, other: "SearchStats") -> None:
        self.search_space_log10 = _log10_add(self.search_space_log10, other.search_space_log10)
        for f in ("nodes_visited", "states", "memo_hits", "pruned", "seconds"):
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


def _room(floors, level: float, pos: int, lo, hi, rows: int) -> bool:
    """Can devices pos.. share `rows` rows with every compute < level (water-filling bound)?"""
    total = 0
    for p in range(pos, len(floors)):
        cap = min(hi[p], bisect.bisect_left(floors[p], level) - 1)
        if cap < lo[p]:
            return False
        total += cap
    return total >= rows


class _Budget(Exception):
    """A partition search ran out of nodes; it keeps the best partitions found so far."""


class _Partitions:
    """The k cheapest partitions of one segment output after a known state, with step < bound.

    First a level search (bisect a time level; left to right every device takes the most rows that keep
    it below the level) finds a good partition in O(D log rows) steps; then a branch and bound over tile
    sizes (one tree level per device, sizes outward from the share; cut when a device or a
    water-filling bound of the rest reaches the k-th best) proves it or improves on it. The tree search
    stops after `budget` nodes (None: never, exact)."""

    def __init__(self, model: StepModel, cx: Step, win, floors, bound: float, k: int | None, budget, stats):
        self.model, self.cx, self.floors, self.bound, self.k, self.stats = model, cx, floors, bound, k, stats
        self.lo, self.hi, self.order = win
        self.centre = [o[0] for o in self.order]
        self.n, self.m = len(model.devs), cx.sc.rows
        self.min_rest = [sum(self.lo[p:]) for p in range(self.n + 1)]
        self.max_rest = [sum(self.hi[p:]) for p in range(self.n + 1)]
        self.heap: list = []  # max-heap (-cost, partition) of the k best
        self.nodes, self.budget = 0, budget

    def limit(self) -> float:
        full = self.k is not None and len(self.heap) >= self.k
        return min(self.bound, -self.heap[0][0]) if full else self.bound

    def offer(self, total: float, part: tuple) -> None:
        if total < self.limit() and all(p != part for _, p in self.heap):
            heapq.heappush(self.heap, (-total, part))
            if self.k is not None and len(self.heap) > self.k:
                heapq.heappop(self.heap)

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
        for pos in range(self.n):
            first, last = self._span(pos, a)
            if first > last:
                return None

            def fits(b):
                return b == a or sum(model.term(cx, pos, a, b, sent, chan)[:2]) < level

            if not fits(first):
                return None
            while first < last:  # largest b that fits: a device's time only grows with its rows
                mid = (first + last + 1) // 2
                first, last = (mid, last) if fits(mid) else (first, mid - 1)
            if first > a:
                r, c, sent, chan = model.term(cx, pos, a, first, sent, chan)
                done.append((pos, r, c))
            a = first
            part.append(a)
        return model.finish(cx, done, sent), tuple(part)

    def seed(self, iters: int = 20) -> None:
        top = self.greedy(INF)
        if top is None:
            return
        self.offer(*top)
        low, high = 0.0, top[0]
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
        lim = self.limit()
        if max(cur, t) >= lim:  # a device's time only grows with its rows
            self.stats.pruned += 1
            return -1 if t >= lim else 0
        if pos == self.n - 1:
            self.offer(self.model.finish(self.cx, done, sent), bounds + (b,))
        elif not _room(self.floors, lim, pos + 1, self.lo, self.hi, self.m - b):  # the rest gets more below
            self.stats.pruned += 1
            return 1
        else:
            self.dfs(pos + 1, b, sent, chan, max(cur, t), done, bounds + (b,))
        return 0

    def dfs(self, pos, a, sent, chan, cur, done, bounds) -> None:
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
            if size >= c and up or size < c and down:
                verdict = self.visit(pos, a, a + size, sent, chan, cur, done, bounds)
                up &= not (verdict < 0 and size >= c)
                down &= not (verdict > 0 and size < c)
                if not (up or down):
                    break


class SpatialSearch:
    """Search over one device order (axis order; devs[0] is the gather device) and one axis."""

    def __init__(self, graph: LayerGraph, cost: CostTable, axis: int, devices: list[str], cuts: tuple[int, ...],
                 rest: list[float], threshold: float = 0.1, budget: int | None = 2000, seg_cache: dict | None = None):
        self.graph, self.cost, self.axis, self.cuts, self.rest, self.thr = graph, cost, axis, cuts, rest, threshold
        self.devs = [cost.index(d) for d in devices]
        self.g, self.budget = self.devs[0], budget
        self.model = StepModel(cost, self.devs)
        prefix = cost.layer_ms[cuts[0]:cuts[-1]].sum(axis=0)
        self.speed = np.array([1.0 / max(prefix[d], 1e-9) for d in self.devs])
        self.stats = SearchStats()
        self._seg = {} if seg_cache is None else seg_cache  # segment costs do not depend on device order
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
        if part is None:  # the group input, whole, on the gather device
            maps = self.seg(0, 1).maps
            return [(self.g, 0, maps.size[maps.input])]
        return [(d, a, b) for d, a, b in zip(self.devs, part, part[1:]) if b > a]

    def step(self, j: int, part, j2: int, part2) -> float:
        return self.model.score(self.model.context(self.seg(j, j2), self.holders(j, part)), part2)

    def gather(self, j: int, part) -> float:
        return self.model.gather(self.seg(j - 1, j), self.holders(j, part), self.g)

    # -- bounds ----------------------------------------------------------------------------------

    def seg_lb(self, j: int, j2: int) -> float:
        """Least possible step time of segment (j, j2) (no transfers, best-placed tiles)."""
        if (j, j2) not in self._lb:
            sc, (lo, hi, _) = self.seg(j, j2), self.window(j2)
            floors = [sc.floor(d) for d in self.devs]
            a, b = 0.0, max(f[-1] for f in floors) + 1.0
            for _ in range(40):
                mid = (a + b) / 2
                a, b = (a, mid) if _room(floors, mid, 0, lo, hi, sc.rows) else (mid, b)
            self._lb[j, j2] = a
        return self._lb[j, j2]

    def completion_lb(self) -> list[float]:
        n = len(self.cuts)
        lb = [INF] * n
        for j in range(n - 1, 0, -1):
            lb[j] = min([self.rest[j], *[self.seg_lb(j, j2) + lb[j2] for j2 in range(j + 1, n)]])
        lb[0] = min(self.seg_lb(0, j2) + lb[j2] for j2 in range(1, n))
        return lb

    # -- search ----------------------------------------------------------------------------------

    def transition(self, j: int, part, j2: int, bound: float, k: int | None) -> list[tuple[float, tuple]]:
        """The k cheapest partitions of cut j2 after state (j, part) with step < bound (memoised)."""
        key = (j, part, j2)
        if key in self._memo:
            b0, k0, res = self._memo[key]
            if bound <= b0 and (k0 is None or (k is not None and k <= k0)):
                self.stats.memo_hits += 1
                return [r for r in res if r[0] < bound][:k]
        sc = self.seg(j, j2)
        cx = self.model.context(sc, self.holders(j, part))
        floors = [sc.floor(d) for d in self.devs]
        res, complete = _Partitions(self.model, cx, self.window(j2), floors, bound, k, self.budget, self.stats).run()
        self.stats.exact &= complete
        self._memo[key] = (bound, k, res)
        return res

    def run(self, beam: int | None = 6, branch: int | None = 3, incumbent: float = INF) -> dict[int, tuple]:
        """Forward DP over cuts. Returns {end cut index: (total, path)}; path = [(cut index, partition)]."""
        n = len(self.cuts)
        lb = self.completion_lb()
        states: list[dict] = [dict() for _ in range(n)]
        states[0][None] = (0.0, None)
        ends: dict[int, tuple] = {}
        for j in range(n):
            items = sorted(states[j].items(), key=lambda kv: kv[1][0])
            if beam is not None and len(items) > beam:
                items, self.stats.exact = items[:beam], False
            for part, (v, _) in items:
                if v + lb[j] >= incumbent:
                    self.stats.pruned += 1
                    continue
                self.stats.states += 1
                if j > 0:
                    total = v + self.gather(j, part) + self.rest[j]
                    if total < ends.get(j, (INF,))[0]:
                        ends[j] = (total, self._path(states, j, part))
                    incumbent = min(incumbent, total)
                for j2 in range(j + 1, n):
                    found = self.transition(j, part, j2, incumbent - v - lb[j2], branch)
                    if branch is not None and len(found) >= branch:
                        self.stats.exact = False
                    for c, part2 in found:
                        if v + c < states[j2].get(part2, (INF,))[0]:
                            states[j2][part2] = (v + c, (j, part))
        return ends

    @staticmethod
    def _path(states, j, part) -> list[tuple[int, tuple]]:
        path = []
        while j > 0:
            path.append((j, part))
            j, part = states[j][part][1]
        return path[::-1]

    def exhaustive(self) -> tuple[float, list]:
        """Reference: every segmentation, end and partition sequence in the search space (tiny cases)."""
        best = (INF, [])

        def go(j, part, v, path):
            nonlocal best
            if j > 0:
                best = min(best, (v + self.gather(j, part) + self.rest[j], path), key=lambda x: x[0])
            for j2 in range(j + 1, len(self.cuts)):
                for p2 in self.partitions(j2):
                    go(j2, p2, v + self.step(j, part, j2, p2), path + [(j2, p2)])

        go(0, None, 0.0, [])
        return best

    def partitions(self, j: int):
        lo, hi, _ = self.window(j)
        m = self.seg(j - 1, j).rows
        for sizes in itertools.product(*[range(l, h + 1) for l, h in zip(lo, hi)]):
            if sum(sizes) == m:
                yield (0, *itertools.accumulate(sizes))

    def space_log10(self) -> float:
        """log10 of the number of (end, segmentation, partition per segment) choices searched over."""
        logn = [0.0]
        for j in range(1, len(self.cuts)):
            lo, hi, _ = self.window(j)
            ways = np.zeros(self.seg(j - 1, j).rows + 1)
            ways[0] = 1.0
            for l, h in zip(lo, hi):
                c = np.concatenate([[0.0], np.cumsum(ways)])
                ways = np.array([c[max(0, r - l + 1)] - c[max(0, r - h)] for r in range(len(ways))])
            logn.append(math.log10(ways[-1]) if ways[-1] > 0 else -INF)
        paths = [0.0] + [-INF] * (len(self.cuts) - 1)
        for j in range(1, len(self.cuts)):
            for i in range(j):
                paths[j] = _log10_add(paths[j], paths[i] + logn[j])
        return _sum_log(paths[1:])

    def to_stages(self, path, end: int, strategy_device: str) -> tuple[Stage, ...]:
        segs, prev = [], 0
        for j, part in path:
            tiles = tuple(Tile(self.cost.devices[d], a, b) for d, a, b in zip(self.devs, part, part[1:]) if b > a)
            segs.append(Segment(self.cuts[prev], self.cuts[j], tiles))
            prev = j
        return (Stage(strategy_device, self.cuts[0], self.cuts[end], SpatialGroup(self.axis, tuple(segs))),)


def _sum_log(xs: list[float]) -> float:
    out = -INF
    for x in xs:
        out = _log10_add(out, x)
    return out


# ------------------------------------------------------------------------------------------------
# Planners


def device_classes(cost: CostTable, names) -> list[str]:
    """One device per interchangeable class (same profile and memory, no per-link overrides)."""
    if cost.cluster.links:
        return list(names)
    seen: dict = {}
    for n in names:
        dev = cost.cluster.device(n)
        seen.setdefault((dev.profile.name, dev.memory_mb), n)
    return list(seen.values())


def _axes(graph: LayerGraph, axis: int | None) -> tuple[int, ...]:
    """Height, and width too unless every tensor and window is square (then both cost the same)."""
    if axis is not None:
        return (axis,)
    square = all(len(t.shape) != 4 or t.shape[2] == t.shape[3] for t in graph.tensors.values())
    square &= all(l.window is None or (l.window.kernel[0] == l.window.kernel[1] and l.window.strides[0] == l.window.strides[1]
                  and l.window.pads[0] == l.window.pads[1] and l.window.pads[2] == l.window.pads[3]) for l in graph.layers)
    return (2,) if square else (2, 3)


def _order(cost: CostTable, g: str, names) -> list[str]:
    """Axis order: the gather device first, then the others fastest first."""
    total = cost.layer_ms.sum(axis=0)
    return [g, *sorted((n for n in names if n != g), key=lambda n: total[cost.index(n)])]


def _search(graph, cost, axis, order, cuts, rest, opts: dict, cache: dict, incumbent: float) -> tuple[SpatialSearch, dict]:
    s = SpatialSearch(graph, cost, axis, order, cuts, rest, opts["threshold"], opts["budget"], cache)
    t0 = time.perf_counter()
    ends = s.run(opts["beam"], opts["branch"], incumbent)
    s.stats.seconds = time.perf_counter() - t0
    s.stats.search_space_log10 = s.space_log10()
    return s, ends


def fits(plan: Plan, graph: LayerGraph, cost: CostTable) -> bool:
    """Every device holds the weights of all layers it computes plus the activations of its stages."""
    need: dict[str, int] = {}
    for st in plan.stages:
        devs = st.spatial.devices if st.spatial else (st.device,)
        for d in {*devs, st.device}:
            need[d] = need.get(d, 0) + group_param_bytes(graph, st.lo, st.hi) + graph.peak_activation_bytes(st.lo, st.hi)
    return all(n <= cost.cluster.device(d).usable_bytes for d, n in need.items())


def best_plan(cands: list[tuple[float, Plan]], graph: LayerGraph, cost: CostTable, objective: str, top: int = 6) -> Plan:
    """Re-score the best few by the search's total with the event simulation; keep the best that fits."""
    from ..simulate import simulate  # deferred: simulate imports the spatial cost model

    scored = []
    for total, plan in sorted(cands, key=lambda c: c[0])[:top]:
        plan.ensures(graph)
        if fits(plan, graph, cost):
            p = simulate(plan, graph, cost)
            scored.append(((p.latency_ms, p.bottleneck_ms) if objective == "latency" else (p.bottleneck_ms, p.latency_ms), plan))
    if not scored:
        raise InfeasibleError("no spatial plan fits the devices' memory")
    return min(scored, key=lambda s: s[0])[1]


def _cuts(graph: LayerGraph, axis: int) -> tuple[int, ...]:
    cuts = spatial_cuts(graph, axis)
    if len(cuts) < 2:
        raise InfeasibleError(f"no layer at the start of the model can be tiled along axis {axis}")
    return cuts


def plan_spatial(graph: LayerGraph, cost: CostTable, objective: str = "latency", threshold: float = 0.1,
                 devices=None, *, beam: int | None = 6, branch: int | None = 3, budget: int | None = 2000,
                 axis: int | None = None) -> tuple[Plan, SearchStats]:
    """Tile the longest tileable prefix across `devices` (all by default); the rest runs on the gather device.

    >>> plan, stats = plan_spatial(graph, cost)                       # doctest: +SKIP
    >>> plan.stages[0].spatial.segments[0].tiles                      # doctest: +SKIP
    (Tile(device='pi5', start=0, stop=130), Tile(device='pi4', start=130, stop=224))
    """
    names = list(devices or cost.devices)
    opts = {"threshold": threshold, "beam": beam, "branch": branch, "budget": budget}
    stats, cands, n = SearchStats(search_space_log10=-INF), [], len(graph.layers)
    for ax in _axes(graph, axis):
        cuts, cache = _cuts(graph, ax), {}
        for g in device_classes(cost, names):
            rest = [float(cost.layer_ms[c:, cost.index(g)].sum()) for c in cuts]
            best = min((c[0] for c in cands), default=INF)  # an earlier search's best bounds this one
            s, ends = _search(graph, cost, ax, _order(cost, g, names), cuts, rest, opts, cache, best)
            stats.add(s.stats)
            for end, (total, path) in ends.items():
                if not _distributed(path):
                    continue  # every tile on one device: that is the single-device plan, not a spatial one
                tail = (Stage(g, cuts[end], n),) if cuts[end] < n else ()
                cands.append((total, Plan("spatial", objective, s.to_stages(path, end, g) + tail)))
    return best_plan(cands, graph, cost, objective), stats


def _distributed(path) -> bool:
    return any(sum(b > a for a, b in zip(part, part[1:])) > 1 for _, part in path)


class _PipelineRest:
    """The layers after a spatial prefix as pipeline stages (compiler.plan.pipeline), from gather device g."""

    def __init__(self, graph: LayerGraph, cost: CostTable):
        from ..cost import pipeline_problem

        self.graph, self.cost, self.problem = graph, cost, pipeline_problem(graph, cost)
        self._sols: dict = {}

    def _solutions(self, cut: int):
        if cut not in self._sols:
            from dataclasses import replace

            from .pipeline import plan_pipeline

            bi = next(i for i, (lo, _) in enumerate(self.graph.blocks) if lo == cut)
            p = self.problem
            sub = replace(p, block_ms=p.block_ms[bi:], block_param_bytes=p.block_param_bytes[bi:],
                          block_peak_act_bytes=p.block_peak_act_bytes[bi:], cut_bytes=p.cut_bytes[bi:])
            try:
                self._sols[cut] = (bi, plan_pipeline(sub, "latency", top_k=3))
            except InfeasibleError:
                self._sols[cut] = (bi, [])
        return self._sols[cut]

    def best(self, cut: int, g: str) -> tuple[float, tuple[Stage, ...]]:
        n = len(self.graph.layers)
        if cut >= n:
            return 0.0, ()
        bi, sols = self._solutions(cut)
        nbytes = self.graph.cut_bytes(cut)
        best = (INF, ())
        for sol in sols:
            first = self.problem.devices[sol.stages[0].device]
            total = self.cost.transfer_ms(nbytes, g, first) + sol.latency_ms
            blocks = self.graph.blocks
            stages = tuple(Stage(self.problem.devices[s.device], blocks[bi + s.lo][0], blocks[bi + s.hi - 1][1]) for s in sol.stages)
            best = min(best, (total, stages), key=lambda x: x[0])
        return best


def _subsets(cost: CostTable) -> list[list[str]]:
    """Device groups worth tiling over: every mix of class counts (>= 2 devices), or fastest-first
    prefixes when that would be too many."""
    names = list(cost.devices)
    classes = [c for c in device_classes(cost, names)]
    members = {c: [n for n in names if device_classes(cost, [c, n]) == [c]] for c in classes}
    combos = [cnt for cnt in itertools.product(*[range(len(members[c]) + 1) for c in classes]) if sum(cnt) >= 2]
    if len(combos) <= 16:
        return [[n for c, k in zip(classes, cnt) for n in members[c][:k]] for cnt in combos]
    order = _order(cost, names[0], names)
    order = sorted(order, key=lambda n: cost.layer_ms[:, cost.index(n)].sum())
    return [order[:k] for k in range(2, len(order) + 1)]


def plan_hybrid(graph: LayerGraph, cost: CostTable, objective: str = "latency", threshold: float = 0.1, *,
                beam: int | None = 6, branch: int | None = 3, budget: int | None = 2000) -> tuple[Plan, SearchStats]:
    """A spatial group over a prefix, on a subset of the devices chosen by search, gathered on one of
    them; the remaining layers as pipeline stages over all devices (exact pipeline DP)."""
    rest_plan = _PipelineRest(graph, cost)
    opts = {"threshold": threshold, "beam": beam, "branch": branch, "budget": budget}
    stats, cands = SearchStats(search_space_log10=-INF), []
    for ax in _axes(graph, None):
        cuts, cache = _cuts(graph, ax), {}
        for subset in _subsets(cost):
            for g in device_classes(cost, subset):
                tails = [rest_plan.best(c, g) for c in cuts]
                best = min((c[0] for c in cands), default=INF)
                s, ends = _search(graph, cost, ax, _order(cost, g, subset), cuts, [t[0] for t in tails], opts, cache, best)
                stats.add(s.stats)
                for end, (total, path) in ends.items():
                    if tails[end][0] < INF and _distributed(path):
                        cands.append((total, Plan("hybrid", objective, s.to_stages(path, end, g) + tails[end][1])))
    return best_plan(cands, graph, cost, objective), stats
