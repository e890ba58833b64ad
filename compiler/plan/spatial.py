"""Spatial planners: a tiled prefix across devices (`plan_spatial`) or followed by pipeline stages (`plan_hybrid`).

Both run spatial_search.SpatialSearch for every gather device class (and, for hybrid, every device
group of spatial_groups.groups), bound each search by the best total found so far, and re-score the best
candidates with the cost model's event simulation (compiler.cost.evaluate): the best predicted plan that
fits memory wins. The searches of one planner run share a budget of partition-tree nodes
(PlanOptions.search_nodes, planner.SEARCH_NODES by default): when it is spent they keep the best plans
found, and `--json` says they were truncated, with the bound of what they left unsearched (`_report`).

Peak memory: the segment costs of each tiled region, shared by a lane's searches (at most J x MAX_SPAN
segments over J block cuts, O(D M) floats each for M output rows, and an O(M^2) tile table per class of
devices with an efficiency curve); one search at a time (spatial_search.py); a hybrid plan's pipeline tails,
the exact DP's (pipeline_dp.py). The node budget caps the work, not these.

`plan_spatial` and `plan_hybrid` are planners, (graph, cost, objective, options) -> [Plan];
`plan_jointly` runs both from shared searches (as auto does); `search_spatial` and `search_hybrid` are
the searches themselves, with every knob and the search statistics.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict

from ..cost import CostTable, evaluate
from ..cost.memory import device_memory_bytes
from ..graph import LayerGraph
from ..plan_types import Plan, Stage
from ..spatial.regions import spatial_cuts
from ..units import MB
from .lanes import run_lanes
from .pipeline import PipelineTail
from .planner import SEARCH_NODES, Dominated, InfeasibleError, PlanOptions
from .spatial_groups import class_ids, device_classes, groups
from .spatial_search import INF, SearchStats, SpatialSearch, build_segments
from .stats import count as count_work, detail, suspended

__all__ = ["plan_spatial", "plan_hybrid", "plan_jointly", "search_spatial", "search_hybrid", "plan_searches", "fits",
           "overflow", "best_plan", "best_of_phases", "device_classes", "regions", "SearchStats"]

logger = logging.getLogger(__name__)


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


def _search(graph, cost, axis, order, cuts, rest, opts: dict, cache: dict, incumbent,
            exact_rest=None, entries=None, slack: float | None = None,
            nodes_left: int | None = None) -> tuple[SpatialSearch, dict]:
    """One search for a tuple of tails: {end: (cost before the tail, path)} (SpatialSearch.run_tails), within
    `nodes_left` partition-tree nodes (None: no limit; 0 or less: skipped, only its bound recorded)."""
    s = SpatialSearch(graph, cost, axis, order, cuts, rest, opts["threshold"], opts["budget"], cache, exact_rest=exact_rest,
                      entries=entries, nodes_left=nodes_left)
    t0 = time.perf_counter()
    if nodes_left is not None and nodes_left <= 0:
        s.skip(incumbent)
        return s, {}
    ends = s.run_tails(opts["beam"], opts["branch"], incumbent, slack)
    s.stats.seconds = time.perf_counter() - t0
    s.stats.search_space_log10 = s.space_log10()
    s.stats.searches = 1
    return s, ends


def fits(plan: Plan, graph: LayerGraph, cost: CostTable) -> bool:
    """Every device holds what `device_memory_bytes` says it needs."""
    return overflow(plan, graph, cost) is None


def overflow(plan: Plan, graph: LayerGraph, cost: CostTable) -> str | None:
    """None when the plan fits; else which device it overfills most, as "device D needs N MB but offers M MB"."""
    over = max(((n - cost.cluster.device(d).usable_bytes, d, n) for d, n in device_memory_bytes(plan, graph).items()),
               default=None)
    if over is None or over[0] <= 0:
        return None
    _, name, need = over
    return f"device {name} needs {need / MB:.1f} MB but offers {cost.cluster.device(name).usable_bytes / MB:.1f} MB"


def best_plan(cands: list[tuple[float, Plan]], graph: LayerGraph, cost: CostTable, objective: str, top: int = 6,
              incumbent: float = INF) -> Plan:
    """Re-score the best few by the search's total with the event simulation; keep the best that fits."""
    return _scored_best(cands, graph, cost, objective, top, incumbent)[1]


def _scored_best(cands, graph: LayerGraph, cost: CostTable, objective: str, top: int = 6,
                 incumbent: float = INF) -> tuple[tuple[float, float], Plan]:
    if not cands:
        if _bound(objective, incumbent) < INF:
            raise Dominated(f"no plan predicted within {BOUND_SLACK:.0%} of {incumbent:.4g} ms, the best plan of "
                            "another planner")
        raise InfeasibleError("no tileable region spreads over two or more devices")
    scored, overfilled = [], []
    for total, plan in sorted(cands, key=lambda c: c[0])[:top]:
        plan.ensures(graph)
        too_big = overflow(plan, graph, cost)
        if too_big is None:
            count_work("plans", 1)
            p = evaluate(plan, graph, cost)
            scored.append(((p.latency_ms, p.bottleneck_ms) if objective == "latency" else (p.bottleneck_ms, p.latency_ms), plan))
        else:
            overfilled.append(too_big)
    if not scored:
        raise InfeasibleError("no spatial plan fits the devices' memory"
                              + (f" (in the best one, {overfilled[0]})" if overfilled else ""))
    return min(scored, key=lambda s: s[0])


def best_of_phases(phases: list[list[tuple[float, Plan]]], graph: LayerGraph, cost: CostTable, objective: str,
                   incumbent: float = INF) -> Plan:
    """best_plan of each phase's candidates (`_search_family`: regions from the model input, then regions
    after a stem), the best by the event simulation, an earlier phase on ties: a later phase's candidates
    never push a plan of an earlier phase out of its re-scored few, so they only ever improve the plan."""
    found, failed = [], []
    for cands in phases:
        if cands:
            try:
                found.append(_scored_best(cands, graph, cost, objective, incumbent=incumbent))
            except InfeasibleError as exc:
                failed.append(exc)
    if found:
        return min(found, key=lambda s: s[0])[1]
    if failed:
        raise failed[0]
    return best_plan([], graph, cost, objective, incumbent=incumbent)


def _cuts(graph: LayerGraph, axis: int) -> tuple[int, ...]:
    """The tileable prefix from the model input (the spatial baselines tile only that)."""
    cuts = spatial_cuts(graph, axis)
    if len(cuts) < 2:
        raise InfeasibleError(f"no layer at the start of the model can be tiled along axis {axis}")
    return cuts


def regions(graph: LayerGraph, axis: int) -> tuple[tuple[int, ...] | None, list[tuple[int, ...]]]:
    """(the tileable prefix from the model input, or None; the later tileable runs), each as its block
    cuts (`spatial_cuts`). A later run starts at the first block cut after an untileable stretch from which
    a block is tileable, and a group may enter it at any of its cuts but the last, after a stem."""
    first = spatial_cuts(graph, axis)
    prefix = first if len(first) > 1 else None
    later, pos = [], first[-1]
    for lo, _ in graph.blocks:
        if lo < pos or lo == 0:  # inside a run already found (a run may start where one ended)
            continue
        run = spatial_cuts(graph, axis, lo)
        if len(run) > 1:
            later.append(run)
            pos = run[-1]
    return prefix, later


def search_spatial(graph: LayerGraph, cost: CostTable, objective: str = "latency", threshold: float = 0.1,
                   devices=None, *, beam: int | None = 6, branch: int | None = 3, budget: int | None = 1000,
                   axis: int | None = None, incumbent: float = INF, workers: int | None = None,
                   nodes: int | None = SEARCH_NODES) -> tuple[Plan, SearchStats]:
    """Tile a tileable region across `devices` (all by default): the prefix from the model input, or a
    run after an untileable stem (which runs as one stage first); the rest runs on the gather device.

    >>> plan, stats = search_spatial(graph, cost)                     # doctest: +SKIP
    >>> plan.stages[0].spatial.segments[0].tiles                      # doctest: +SKIP
    (Tile(device='pi5', start=0, stop=130), Tile(device='pi4', start=130, stop=224))
    """
    opts = {"threshold": threshold, "beam": beam, "branch": branch, "budget": budget, "nodes": nodes}
    cands, stats = _search_family(graph, cost, objective, ("spatial",), opts, incumbent, list(devices or cost.devices), axis,
                                  workers)
    return _best_or_why("spatial", cands, stats, nodes, graph, cost, objective, incumbent), stats


# The search's totals are estimates: the event simulation that finally ranks plans may find a plan up to
# several percent faster than its search total (measured: up to ~8% on the benchmark models). A search
# bounded by another planner's simulated latency keeps candidates up to this much above it.
BOUND_SLACK = 0.15


def _bound(objective: str, incumbent: float) -> float:
    """The search minimises latency: a plan to beat bounds it only under the latency objective."""
    return incumbent * (1.0 + BOUND_SLACK) if objective == "latency" else INF


def _shared(best: dict, objective: str) -> dict:
    """Each kind's bound when the kinds compete (auto runs them together and keeps the best plan): its
    own best total, or another kind's best total with BOUND_SLACK, whichever is lower. Under the
    throughput objective the search's totals (latencies) bound nothing."""
    if objective != "latency" or len(best) < 2:
        return dict(best)
    return {k: min([v, *(w * (1.0 + BOUND_SLACK) for o, w in best.items() if o != k)]) for k, v in best.items()}


def _distributed(path) -> bool:
    return any(sum(b > a for a, b in zip(part, part[1:])) > 1 for _, part in path)


def _subsets(cost: CostTable) -> list[list[str]]:
    """Device groups worth tiling over (spatial_groups.groups)."""
    return groups(cost).groups


def search_hybrid(graph: LayerGraph, cost: CostTable, objective: str = "latency", threshold: float = 0.1, *,
                  beam: int | None = 6, branch: int | None = 3, budget: int | None = 1000,
                  incumbent: float = INF, workers: int | None = None,
                  nodes: int | None = SEARCH_NODES) -> tuple[Plan, SearchStats]:
    """A spatial group over a tileable region (after a stem stage, if the model input is not tileable), on
    a subset of the devices chosen by search, gathered on one of them; the remaining layers as pipeline
    stages over all devices (exact pipeline DP)."""
    opts = {"threshold": threshold, "beam": beam, "branch": branch, "budget": budget, "nodes": nodes}
    cands, stats = _search_family(graph, cost, objective, ("hybrid",), opts, incumbent, workers=workers)
    return _best_or_why("hybrid", cands, stats, nodes, graph, cost, objective, incumbent), stats


def plan_searches(graph: LayerGraph, cost: CostTable, objective: str, kinds, threshold: float = 0.1, *,
                  beam: int | None = 6, branch: int | None = 3, budget: int | None = 1000,
                  incumbent: float = INF, workers: int | None = None,
                  nodes: int | None = SEARCH_NODES) -> tuple[dict, SearchStats]:
    """`spatial` and `hybrid` from shared searches: {kind: Plan, or the InfeasibleError (Dominated) it
    ends with}. Both tile a prefix and differ only after the gather (the rest on the gather device, or
    pipeline stages), so one search per (axis, device group, gather device) serves both: each kind keeps
    its own bound, a state is dropped only when neither can use it, and each kind adds its own tail to
    the best prefix of every end. Under the latency objective the kinds compete (`_shared`): a kind left
    without candidates by the other's plans ends Dominated."""
    opts = {"threshold": threshold, "beam": beam, "branch": branch, "budget": budget, "nodes": nodes}
    try:
        cands, stats = _search_family(graph, cost, objective, tuple(kinds), opts, incumbent, workers=workers)
    except InfeasibleError as exc:  # nothing to tile: every kind ends the same way
        return {kind: exc for kind in kinds}, SearchStats()
    out: dict = {}
    for kind in kinds:
        try:
            out[kind] = best_of_phases(cands[kind], graph, cost, objective, incumbent=incumbent)
        except InfeasibleError as exc:
            out[kind] = _outcompeted(kind, cands, objective, incumbent) or _spent(kind, cands, stats, nodes) or exc
    return out, stats


def _best_or_why(kind: str, cands: dict, stats: SearchStats, nodes: int | None, graph, cost, objective,
                 incumbent: float) -> Plan:
    """best_of_phases of `kind`'s candidates; when it has none because the node budget ran out, an
    InfeasibleError that says so (`_spent`)."""
    try:
        return best_of_phases(cands[kind], graph, cost, objective, incumbent=incumbent)
    except InfeasibleError as exc:
        raise (_spent(kind, cands, stats, nodes) or exc) from None


def _spent(kind: str, cands: dict, stats: SearchStats, nodes: int | None) -> InfeasibleError | None:
    """Why `kind` has no candidates when the node budget stopped searches that might have found one."""
    if not stats.truncated or any(cands[kind]):
        return None
    return InfeasibleError(f"the search budget of {nodes:,} partition-tree nodes ran out before a plan was found "
                           f"(none left unsearched is predicted under {stats.unsearched_ms:.4g} ms)")


def _outcompeted(kind: str, cands: dict, objective: str, incumbent: float) -> Dominated | None:
    """Why `kind` has no candidates when another kind's plan bounded its searches tighter than the
    incumbent did (`_shared`); None when that is not so (the usual message says why)."""
    if objective != "latency" or any(cands[kind]):
        return None
    found = [(total, other) for other, phases in cands.items() if other != kind for c in phases for total, _ in c]
    if not found or min(found)[0] * (1.0 + BOUND_SLACK) >= _bound(objective, incumbent):
        return None
    total, other = min(found)
    return Dominated(f"no plan predicted within {BOUND_SLACK:.0%} of {total:.4g} ms, the best plan of another planner "
                     f"({other})")


def plan_jointly(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions,
                 kinds=("spatial", "hybrid")) -> dict:
    """The planners of `kinds` (spatial, hybrid or both) from shared searches (`plan_searches`), bounded by
    `options.incumbent`: {kind: [Plan], or the InfeasibleError (Dominated) it ends with, its message
    naming the planner}."""
    found, stats = plan_searches(graph, cost, objective, kinds, options.search_threshold, incumbent=options.incumbent,
                                 workers=options.jobs, nodes=options.search_nodes)
    _report(stats)
    return {kind: type(got)(f"{kind}: {got}") if isinstance(got, InfeasibleError) else [got]
            for kind, got in found.items()}


def _report(stats: SearchStats) -> None:
    """The searches' figures, summed over every search (stats.py)."""
    count_work("nodes", stats.nodes_visited)
    count_work("states", stats.states)
    log10 = stats.search_space_log10
    detail(searches=stats.searches, pruned=stats.pruned, memo_hits=stats.memo_hits, exact=stats.exact,
           search_seconds=round(stats.seconds, 4),
           search_space_log10=round(log10, 3) if math.isfinite(log10) else None)
    if stats.groups:  # not every mix of device classes was searched
        detail(truncated=True, groups=stats.groups)
    if stats.truncated:  # the node budget stopped searches that might have found a better plan
        detail(truncated=True, truncated_searches=stats.truncated, unsearched_bound_ms=round(stats.unsearched_ms, 4))


def plan_spatial(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner of `search_spatial` over all devices (as `plan_jointly` runs it)."""
    return _one(plan_jointly(graph, cost, objective, options, ("spatial",))["spatial"])


def plan_hybrid(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner of `search_hybrid` (as `plan_jointly` runs it)."""
    return _one(plan_jointly(graph, cost, objective, options, ("hybrid",))["hybrid"])


def _one(got):
    if isinstance(got, InfeasibleError):
        raise got
    return got


LANES = 2  # the searches split into this many fixed lanes (lanes.py): the plan never depends on the cores


def _search_family(graph: LayerGraph, cost: CostTable, objective: str, kinds: tuple, opts: dict, incumbent: float,
                   devices: list[str] | None = None, axis: int | None = None,
                   workers: int | None = None) -> tuple[dict, SearchStats]:
    """Candidates per kind, as two phases of (search total, plan) lists: groups over the tileable prefix
    from the model input, then groups over a later tileable run, entered at any of its cuts after a stem
    (see `regions`; a second round of searches, bounded by the first's best). `spatial` tiles over
    `devices` (all by default) and keeps the rest on the gather device; `hybrid` tiles over every group
    of `_subsets` and runs the rest as pipeline stages (exact pipeline DP) from the gather device.

    One search per (axis, region, device group, gather device), each bounded by the best plan of another
    planner and the best plans of the searches before it in its lane. Bounded by another planner (auto,
    latency) and with at least two searches per lane, the searches split into LANES fixed lanes that run
    side by side in `workers` processes (default: as many as this machine has cores for); the plans do
    not depend on `workers`."""
    names = list(devices or cost.devices)
    ids = class_ids(cost)
    chosen = groups(cost, ids) if "hybrid" in kinds else None
    over = chosen.groups if chosen is not None else [names]
    if "spatial" in kinds and not any(set(gr) == set(names) for gr in over):
        over.append(names)
    axes = _axes(graph, axis)
    first, later = {}, {}
    for ax in axes:
        prefix, runs = regions(graph, ax)
        if prefix is not None:
            first[(ax, 0)] = (prefix, (0,))
        later.update({(ax, k): (run, tuple(range(len(run) - 1))) for k, run in enumerate(runs, start=1)})
    if not first and not later:
        raise InfeasibleError(f"no layer of the model can be tiled along axis {' or '.join(map(str, axes))}")
    bound = {k: _bound(objective, incumbent) for k in kinds}
    stats = SearchStats(search_space_log10=-INF, groups="" if chosen is None or chosen.every_mix else chosen.rule)
    phases: dict = {k: [] for k in kinds}
    tail = PipelineTail(graph, cost) if "hybrid" in kinds else None  # both phases reuse its pipeline DPs
    for found in (first, later):
        left = None if opts["nodes"] is None else opts["nodes"] - stats.nodes_visited
        cands = _run_phase(graph, cost, objective, kinds, opts, bound, names, found, over, ids, left, workers, stats,
                           tail)
        for kind in kinds:
            phases[kind].append(cands[kind])
            bound[kind] = min([bound[kind], *(total for total, _ in cands[kind])])
    return phases, stats


def _run_phase(graph, cost, objective, kinds, opts, bound: dict, names, found: dict, over, ids: dict,
               nodes: int | None, workers, stats: SearchStats, tail: PipelineTail | None) -> dict:
    """The searches of one phase over the regions `found` ({(axis, k): (cuts, entry cut indices)}) and the
    device groups `over` (`ids`: their classes), within `nodes` partition-tree nodes (None: no limit), with
    `tail` pricing hybrid's pipeline stages; adds their statistics to `stats`."""
    jobs = [(key, group, g) for key in found for group in over for g in device_classes(cost, group, ids)]
    if not jobs:
        return {k: [] for k in kinds}
    # lanes cost the bounds one lane's searches would give another's: worth it only when another planner's
    # plan bounds every lane from the start, and each lane has at least two searches
    lanes = LANES if max(bound.values()) < INF and len(jobs) >= 2 * LANES else 1
    lane = _Lane(graph, cost, objective, kinds, opts, bound, names, found, tail,
                 None if nodes is None else nodes // lanes)
    split = _split([len(group) ** 2 for _, group, _ in jobs], lanes)
    if len(split) > 1:  # every search prices every segment of its region: build them once, before forking
        for key, (cuts, _) in found.items():
            build_segments(graph, cost, key[0], cuts, lane.caches[key])
    results = run_lanes(lane.run, [[(i, jobs[i]) for i in idx] for idx in split], workers)
    cands: dict = {k: [] for k in kinds}
    for _, kind, total, plan in sorted((c for r in results for c in r["cands"]), key=lambda c: c[0]):
        cands[kind].append((total, Plan.from_dict(plan)))
    for r in results:
        stats.add(SearchStats(**r["stats"]))
    return cands


def _split(weights: list[int], n: int) -> list[list[int]]:
    """Job indices in `n` lanes: the heaviest first, each to the lightest lane (ties: the first)."""
    lanes, load = [[] for _ in range(n)], [0] * n
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        k = load.index(min(load))
        lanes[k].append(i)
        load[k] += weights[i]
    return [sorted(lane) for lane in lanes if lane]


class _Lane:
    """The searches of one lane, run in order, each bounded by the best plan of another planner or of an
    earlier search of the lane (of either kind, when they compete: `_shared`). Returns plain data
    (msgpack): candidates and summed statistics."""

    def __init__(self, graph: LayerGraph, cost: CostTable, objective: str, kinds: tuple, opts: dict, bound: dict,
                 names: list[str], found: dict, rest_plan: PipelineTail | None, nodes: int | None = None):
        self.graph, self.cost, self.objective, self.kinds, self.opts = graph, cost, objective, kinds, opts
        self.nodes = nodes  # partition-tree nodes for the lane's searches (None: no limit)
        self.bound, self.names, self.found = bound, names, found
        self.rest_plan = rest_plan
        # the kinds compete in auto (latency): one kind's plans bound the others' (`_shared`)
        self.slack = BOUND_SLACK if objective == "latency" and len(kinds) > 1 else None
        self.caches: dict = {key: {} for key in found}  # segment costs and bounds, shared by the lane's searches

    def stem(self, cut: int, g: str) -> tuple[float, str]:
        """(ms, device) of the layers before `cut` as one stage whose output reaches g soonest: the
        untileable stem before a group (a stem is short, and one device runs it at least as fast as a
        pipeline would for one input; ties go to g, which then scatters without a transfer first)."""
        cost, nbytes = self.cost, self.graph.cut_bytes(cut)
        return min(((float(cost.layer_ms[:cut, cost.index(d)].sum()) + cost.transfer_ms(nbytes, d, g), d)
                    for d in dict.fromkeys([g, *self.names])), key=lambda x: x[0])

    def run(self, jobs: list) -> dict:
        with suspended():  # a lane reports its figures in its result, wherever it runs (lanes.py)
            return self._run(jobs)

    def _run(self, jobs: list) -> dict:
        graph, cost, n = self.graph, self.cost, len(self.graph.layers)
        stats = SearchStats(search_space_log10=-INF)
        best = dict(self.bound)
        out, left = [], self.nodes
        for index, (key, group, g) in jobs:
            (cuts, entry_idx), rest_plan = self.found[key], self.rest_plan
            stems = {j: self.stem(cuts[j], g) if cuts[j] > 0 else (0.0, g) for j in entry_idx}
            tails = {}  # kind -> (lower bound per cut, exact tail of cut index i: (ms, stages))
            if "spatial" in self.kinds and set(group) == set(self.names):
                stay = [float(cost.layer_ms[c:, cost.index(g)].sum()) for c in cuts]
                tails["spatial"] = (stay, lambda i, g=g, stay=stay, cuts=cuts: (stay[i], (Stage(g, cuts[i], n),) if cuts[i] < n else ()))
            if rest_plan is not None:  # pipeline DPs only for the ends the search reaches
                tails["hybrid"] = ([rest_plan.lower(c) for c in cuts], lambda i, g=g, cuts=cuts: rest_plan.best(cuts[i], g))
            kinds_here = list(tails)

            def exact(i, t, tails=tails, kinds_here=kinds_here):
                return tails[kinds_here[t]][1](i)[0]

            s, ends = _search(graph, cost, key[0], _order(cost, g, group), cuts, tuple(tails[k][0] for k in kinds_here),
                              self.opts, self.caches[key], tuple(_shared(best, self.objective)[k] for k in kinds_here), exact,
                              {j: ms for j, (ms, _) in stems.items()}, self.slack, left)
            stats.add(s.stats)
            left = None if left is None else left - s.stats.nodes_visited
            for end, (prefix, path) in ends.items():
                if not _distributed(path):
                    continue  # every tile on one device: that is the single-device plan, not a spatial one
                entry = s.entry_of[end]
                head = (Stage(stems[entry][1], 0, cuts[entry]),) if cuts[entry] > 0 else ()
                for kind, (lower, tail) in tails.items():
                    if prefix + lower[end] >= self.bound[kind]:
                        continue  # cannot beat the other planners' plan: not worth its exact tail
                    ms, stages = tail(end)
                    if ms < INF and prefix + ms < self.bound[kind]:
                        plan = Plan(kind, self.objective, head + s.to_stages(path, end, g, entry) + stages)
                        out.append((index, kind, prefix + ms, plan.to_dict()))
                        best[kind] = min(best[kind], prefix + ms)
        return {"cands": out, "stats": asdict(stats)}
