"""Spatial baselines as real planners returning Plans: BBGraP, EdgeFlow and DeepThings (as ADaPS compares them).

- `bbgrap`: every block split equally across all devices, results gathered on one device and
  re-scattered after every block (a spatial stage per block), or (sync="halo") halo rows exchanged
  directly between blocks: fixed partitions, no device model.
- `edgeflow`: one stage, a segment per block (no fusion across blocks, halo exchange between them),
  each block's split chosen against the previous block's only, around the speed-proportional split.
- `deepthings`: a fixed N x M grid of equal fused tiles over the first layers, one tile per device,
  then a gather (N x 1 and 1 x M grids are plain height or width tiles; others cut both axes).

`plan_bbgrap`, `plan_edgeflow` and `plan_deepthings` are the planners, (graph, cost, objective, options)
-> [Plan]: the plan over all devices, checked against the devices' memory.

Peak memory: one plan: bbgrap and edgeflow O(D) tiles per block; edgeflow's partition searches (at most
1,000 nodes each, spatial_partitions.py) and its segment costs, O(D M) for M rows; deepthings one tile per
grid cell.

A block is the finest segment a Plan allows (segments end on serial-block cuts), so inside an Inception
or residual block every baseline fuses. All run their Type-3 remainder on the gather device.
"""

from __future__ import annotations

import logging

from ..cost import CostTable
from ..graph import LayerGraph
from ..plan_types import Plan, Segment, SpatialGroup, Stage, Tile
from .planner import InfeasibleError, PlanOptions
from .spatial import _cuts, _order, best_plan, overflow
from .spatial_search import INF, SpatialSearch
from .stats import count as count_work

__all__ = ["plan_bbgrap", "plan_edgeflow", "plan_deepthings", "bbgrap", "edgeflow", "deepthings", "equal_tiles",
           "grid_tiles"]

logger = logging.getLogger(__name__)


def equal_tiles(rows: int, devices: list[str]) -> tuple[Tile, ...]:
    """Near-equal contiguous tiles (the first rows % n get one more row); fewer tiles if rows < n."""
    n = min(len(devices), rows)
    edges = [k * rows // n for k in range(n + 1)]
    return tuple(Tile(d, a, b) for d, a, b in zip(devices, edges, edges[1:]))


def _gather_device(cost: CostTable, names: list[str]) -> str:
    """The fastest device: it gathers and runs the Type-3 layers."""
    total = cost.layer_ms.sum(axis=0)
    return min(names, key=lambda n: total[cost.index(n)])


def _tail(graph: LayerGraph, g: str, end: int) -> tuple[Stage, ...]:
    n = len(graph.layers)
    return (Stage(g, end, n),) if end < n else ()


def _rows(graph: LayerGraph, cut: int, axis: int) -> int:
    return graph.tensors[graph.live_across(cut)[0] if cut < len(graph.layers) else graph.layers[-1].outputs[0]].shape[axis]


def bbgrap(graph: LayerGraph, cost: CostTable, objective: str = "latency", devices=None, axis: int = 2,
           sync: str = "gather") -> Plan:
    """Equal split of every block over all devices, no device model. sync="gather": each block's output
    is gathered on the first device and re-scattered (a spatial stage per block); sync="halo": one
    stage whose blocks exchange halo rows directly (decentralised, as ADaPS's Table 1 describes it)."""
    names = list(devices or cost.devices)
    g = names[0]  # device-agnostic: the first device coordinates
    cuts = _cuts(graph, axis)
    segs = [Segment(a, b, equal_tiles(_rows(graph, b, axis), names)) for a, b in zip(cuts, cuts[1:])]
    if sync == "gather":
        stages = tuple(Stage(g, s.lo, s.hi, SpatialGroup(axis, (s,))) for s in segs)
    elif sync == "halo":
        stages = (Stage(g, cuts[0], cuts[-1], SpatialGroup(axis, tuple(segs))),)
    else:
        raise ValueError(f"sync must be 'gather' or 'halo', got {sync!r}")
    count_work("plans", 1)
    return Plan("bbgrap", objective, stages + _tail(graph, g, cuts[-1])).ensures(graph)


def edgeflow(graph: LayerGraph, cost: CostTable, objective: str = "latency", devices=None, axis: int = 2,
             threshold: float = 0.1) -> Plan:
    names = list(devices or cost.devices)
    g = _gather_device(cost, names)
    cuts = _cuts(graph, axis)
    s = SpatialSearch(graph, cost, axis, _order(cost, g, names), cuts, [0.0] * len(cuts), threshold)
    path, part = [], None
    for j in range(1, len(cuts)):  # greedy: each block against the previous block only
        found = s.transition(j - 1, part, j, INF, 1)
        if not found:
            raise InfeasibleError("edgeflow: no partition within the bounds")
        part = found[0][1]
        path.append((j, part))
    count_work("nodes", s.stats.nodes_visited)
    return Plan("edgeflow", objective, s.to_stages(path, len(cuts) - 1, g) + _tail(graph, g, cuts[-1])).ensures(graph)


def deepthings(graph: LayerGraph, cost: CostTable, objective: str = "latency", devices=None,
               grid: tuple[int, int] | None = None, layers: int | None = None) -> Plan:
    """Fused tile partitioning: an N x M grid of equal tiles (N along height, M along width) over the
    first `layers` layers (rounded down to a block cut), one tile per device in row-major order starting
    with the fastest device, which gathers. N x 1 and 1 x M grids are height or width tiles; others cut
    both axes (the prefix then ends on a cut tileable along both). With layers=None every block cut is
    tried and the best predicted one kept (DeepThings tunes it by hand)."""
    names = list(devices or cost.devices)
    n, m = grid or (len(names), 1)
    if n < 1 or m < 1 or n * m > len(names):
        raise ValueError(f"grid {n}x{m} has {n * m} tiles, more than the {len(names)} devices (one tile each)")
    g = _gather_device(cost, names)
    tiles_on = [g, *[d for d in names if d != g]][: n * m]
    grid2d = n > 1 and m > 1
    axis = 2 if m == 1 or grid2d else 3
    cuts = [c for c in _cuts(graph, 2) if c in set(_cuts(graph, 3))] if grid2d else list(_cuts(graph, axis))

    def tiles(end: int) -> tuple[Tile, ...]:
        if grid2d:
            return grid_tiles(_rows(graph, end, 2), _rows(graph, end, 3), n, m, tiles_on)
        return equal_tiles(_rows(graph, end, axis), tiles_on)

    enough = [c for c in cuts[1:] if (_rows(graph, c, 2) >= n and _rows(graph, c, 3) >= m if grid2d
                                      else _rows(graph, c, axis) >= n * m)]
    ends = enough if layers is None else [c for c in enough if c <= max(layers, cuts[1])][-1:]
    if not ends:
        raise InfeasibleError(f"no fused prefix has at least {n} rows and {m} columns for a {n}x{m} grid")
    cands = []
    for end in ends:
        stages = (Stage(g, cuts[0], end, SpatialGroup(axis, (Segment(0, end, tiles(end)),))),) + _tail(graph, g, end)
        cands.append((0.0, Plan("deepthings", objective, stages)))
    return best_plan(cands, graph, cost, objective, top=len(cands))


def grid_tiles(rows: int, cols: int, n: int, m: int, devices: list[str]) -> tuple[Tile, ...]:
    """An n x m grid of near-equal tiles in row-major order (devices[i * m + j] holds band i, column j).

    >>> [(t.device, t.start, t.stop, t.cols) for t in grid_tiles(5, 4, 2, 2, ["a", "b", "c", "d"])]
    [('a', 0, 2, (0, 2)), ('b', 0, 2, (2, 4)), ('c', 2, 5, (0, 2)), ('d', 2, 5, (2, 4))]
    """
    bands, parts = equal_tiles(rows, ["-"] * n), equal_tiles(cols, ["-"] * m)
    return tuple(Tile(devices[i * m + j], b.start, b.stop, (c.start, c.stop))
                 for i, b in enumerate(bands) for j, c in enumerate(parts))


def _checked(name: str, make, graph: LayerGraph, cost: CostTable) -> list[Plan]:
    """[the plan `make()` builds], or InfeasibleError naming the planner (also when it does not fit memory)."""
    try:
        plan = make()
    except InfeasibleError as exc:
        raise type(exc)(f"{name}: {exc}") from None
    plan.ensures(graph)
    too_big = overflow(plan, graph, cost)
    if too_big is not None:
        raise InfeasibleError(f"{name}: the plan does not fit the devices' memory ({too_big})")
    return [plan]


def plan_bbgrap(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner of `bbgrap` (gathers after every block)."""
    return _checked("bbgrap", lambda: bbgrap(graph, cost, objective), graph, cost)


def plan_edgeflow(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner of `edgeflow`, its partitions within the search threshold."""
    return _checked("edgeflow", lambda: edgeflow(graph, cost, objective, threshold=options.search_threshold),
                    graph, cost)


def plan_deepthings(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner of `deepthings`, with the options' grid and fused depth."""
    return _checked("deepthings", lambda: deepthings(graph, cost, objective, grid=options.deepthings_grid,
                                                     layers=options.deepthings_layers), graph, cost)
