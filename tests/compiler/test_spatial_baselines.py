"""Spatial baselines: BBGraP, EdgeFlow and DeepThings plans are valid, behave as described, and run."""

from __future__ import annotations

from dataclasses import replace

import pytest
from onnx import shape_inference

from edgec.compiler.cluster import ClusterModel, DeviceSpec, load_profile
from edgec.compiler.cost import build_cost_table
from edgec.compiler.layers import build_layer_graph
from edgec.compiler.plan.planner import InfeasibleError, PlanOptions
from edgec.compiler.plan.registry import PLANNERS
from edgec.compiler.plan.spatial import fits
from edgec.compiler.plan.spatial_baselines import bbgrap, deepthings, edgeflow, equal_tiles, grid_tiles
from edgec.compiler.plan_types import Plan, PlanError, Tile
from edgec.compiler.cost import evaluate
from edgec.compiler.spatial import spatial_cuts
from tests.conftest import conv_chain_model, residual_model

PROFILES = {n: load_profile(n) for n in ("rpi5", "rpi4")}


def cluster(kinds, mbps=100.0) -> ClusterModel:
    devs = tuple(DeviceSpec(f"{k}-{i}", PROFILES[k], PROFILES[k].memory_mb, None) for i, k in enumerate(kinds))
    return ClusterModel(devs, mbps, 1.0, "switched", {}, "test")


@pytest.fixture(scope="module")
def chain():
    graph = build_layer_graph(shape_inference.infer_shapes(conv_chain_model(n=4, channels=16, size=30)))
    return graph, build_cost_table(graph, cluster(("rpi5", "rpi4", "rpi4")))


def _check(plan: Plan, graph, cost) -> None:
    plan.ensures(graph)
    assert Plan.from_dict(plan.to_dict()) == plan
    assert fits(plan, graph, cost)
    assert evaluate(plan, graph, cost).latency_ms > 0


def test_equal_tiles_split_uneven_rows():
    assert equal_tiles(7, ["a", "b", "c"]) == (Tile("a", 0, 2), Tile("b", 2, 4), Tile("c", 4, 7))
    assert equal_tiles(2, ["a", "b", "c"]) == (Tile("a", 0, 1), Tile("b", 1, 2))


def test_bbgrap_gathers_after_every_block(chain):
    graph, cost = chain
    plan = bbgrap(graph, cost)
    _check(plan, graph, cost)
    cuts = spatial_cuts(graph, 2)
    spatial = [s for s in plan.stages if s.spatial]
    assert [(s.lo, s.hi) for s in spatial] == list(zip(cuts, cuts[1:]))
    for s in spatial:
        sizes = [t.stop - t.start for t in s.spatial.segments[0].tiles]
        assert max(sizes) - min(sizes) <= 1 and len(sizes) == 3  # equal, device-agnostic
    halo = bbgrap(graph, cost, sync="halo")
    _check(halo, graph, cost)
    assert len(halo.stages[0].spatial.segments) == len(cuts) - 1
    # same tiles, but neighbours exchange halo rows instead of gathering whole tensors
    assert evaluate(halo, graph, cost).bytes_transferred < evaluate(plan, graph, cost).bytes_transferred


def test_edgeflow_is_a_segment_per_block_split_by_speed(chain):
    graph, cost = chain
    plan = edgeflow(graph, cost)
    _check(plan, graph, cost)
    cuts = spatial_cuts(graph, 2)
    segs = plan.stages[0].spatial.segments
    assert [(s.lo, s.hi) for s in segs] == list(zip(cuts, cuts[1:]))  # no fusion across blocks
    for seg in segs:
        rows = {t.device: t.stop - t.start for t in seg.tiles}
        assert rows["rpi5-0"] > max(rows["rpi4-1"], rows["rpi4-2"])


def test_deepthings_fuses_a_fixed_grid(chain):
    graph, cost = chain
    plan = deepthings(graph, cost, grid=(3, 1), layers=2)
    _check(plan, graph, cost)
    group = plan.stages[0].spatial
    assert group.axis == 2 and len(group.segments) == 1 and group.segments[0].hi == 2
    assert [t.stop - t.start for t in group.segments[0].tiles] == [10, 10, 10]
    wide = deepthings(graph, cost, grid=(1, 2))
    assert wide.stages[0].spatial.axis == 3 and len(wide.stages[0].spatial.segments[0].tiles) == 2
    with pytest.raises(ValueError, match="more than the 3 devices"):
        deepthings(graph, cost, grid=(2, 2))
    with pytest.raises(ValueError):
        deepthings(graph, cost, grid=(4, 1))


@pytest.fixture(scope="module")
def chain6():
    graph = build_layer_graph(shape_inference.infer_shapes(conv_chain_model(n=4, channels=8, size=29)))
    return graph, build_cost_table(graph, cluster(("rpi5", "rpi4", "rpi4", "rpi5", "rpi4", "rpi4")))


def test_grid_tiles_are_row_major_and_near_equal():
    got = grid_tiles(7, 5, 3, 2, list("abcdef"))
    assert [(t.device, t.start, t.stop, t.cols) for t in got] == [
        ("a", 0, 2, (0, 2)), ("b", 0, 2, (2, 5)), ("c", 2, 4, (0, 2)), ("d", 2, 4, (2, 5)),
        ("e", 4, 7, (0, 2)), ("f", 4, 7, (2, 5))]


@pytest.mark.parametrize("grid", [(2, 2), (3, 2), (2, 3)])
def test_deepthings_two_dimensional_grid(chain6, grid):
    graph, cost = chain6
    n, m = grid
    plan = deepthings(graph, cost, grid=grid, layers=3)
    _check(plan, graph, cost)
    group = plan.stages[0].spatial
    assert group.grid and group.axes == (2, 3) and len(group.segments) == 1 and group.segments[0].hi == 3
    tiles = group.segments[0].tiles
    assert len(tiles) == n * m and len(set(t.device for t in tiles)) == n * m
    assert tiles[0].device == plan.stages[0].device  # the gather device computes the top-left tile
    assert len({(t.start, t.stop) for t in tiles}) == n and len({t.cols for t in tiles}) == m
    pred = evaluate(plan, graph, cost)
    assert set(pred.busy_ms) >= {t.device for t in tiles} and pred.bytes_transferred > 0
    # a tile's compute is about its share of the plane: no tile is priced like the whole prefix
    whole = float(cost.layer_ms[:3, cost.index(tiles[0].device)].sum())
    assert pred.tile_ms[0, 0, 0] < whole


def test_deepthings_grid_needs_rows_and_columns(chain6):
    graph, cost = chain6
    small = build_layer_graph(shape_inference.infer_shapes(conv_chain_model(n=2, channels=4, size=1)))
    with pytest.raises(InfeasibleError, match="2 rows and 2 columns"):
        deepthings(small, build_cost_table(small, cluster(("rpi5", "rpi4", "rpi4", "rpi4"))), grid=(2, 2))
    with pytest.raises(ValueError, match="7 tiles"):
        deepthings(graph, cost, grid=(7, 1))


def test_plan_checks_grids(chain6):
    graph, cost = chain6
    plan = deepthings(graph, cost, grid=(2, 2), layers=3)
    stage = plan.stages[0]
    seg = stage.spatial.segments[0]
    a, b, c, d = seg.tiles
    broken = [
        (a, b, c, Tile(d.device, d.start, d.stop, (d.cols[0], d.cols[1] - 1))),  # a band misses a column
        (a, b, c, Tile(d.device, d.start, d.stop)),  # a grid tile without columns
        (a, c, b, d),  # not row-major
    ]
    for tiles in broken:
        bad = replace(plan, stages=(replace(stage, spatial=replace(stage.spatial, segments=(replace(seg, tiles=tiles),))),
                                    *plan.stages[1:]))
        with pytest.raises(PlanError):
            bad.ensures(graph)
    width = replace(stage.spatial, axis=3)
    with pytest.raises(PlanError, match="axis is height"):
        replace(plan, stages=(replace(stage, spatial=width), *plan.stages[1:])).ensures(graph)


def test_deepthings_refuses_a_grid_finer_than_the_tensor():
    graph = build_layer_graph(shape_inference.infer_shapes(residual_model()))
    cost = build_cost_table(graph, cluster(("rpi5", "rpi4")))
    assert deepthings(graph, cost).stages[0].spatial is not None
    small = build_layer_graph(shape_inference.infer_shapes(conv_chain_model(n=2, channels=4, size=1)))
    with pytest.raises(InfeasibleError):
        deepthings(small, build_cost_table(small, cluster(("rpi5", "rpi4"))))


def test_registry_runs_every_strategy(chain):
    graph, cost = chain
    for name, planner in PLANNERS.items():
        plans = planner(graph, cost, "latency", PlanOptions())
        assert plans
        for plan in plans:
            _check(plan, graph, cost)
            assert plan.strategy == name
