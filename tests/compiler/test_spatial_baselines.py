"""Spatial baselines: BBGraP, EdgeFlow and DeepThings plans are valid, behave as described, and run."""

from __future__ import annotations

import pytest
from onnx import shape_inference

from compiler.cluster import Cluster, Device, load_profile
from compiler.cost import build_cost_table
from compiler.layers import build_layer_graph
from compiler.plan.problem import InfeasibleError
from compiler.plan.registry import SPATIAL_PLANNERS
from compiler.plan.spatial import fits
from compiler.plan.spatial_baselines import equal_tiles, plan_bbgrap, plan_deepthings, plan_edgeflow
from compiler.plan.types import Plan, Tile
from compiler.simulate import simulate
from compiler.spatial import spatial_cuts
from tests.conftest import conv_chain_model, residual_model

PROFILES = {n: load_profile(n) for n in ("rpi5", "rpi4")}


def cluster(kinds, mbps=100.0) -> Cluster:
    devs = tuple(Device(f"{k}-{i}", PROFILES[k], PROFILES[k].memory_mb, None) for i, k in enumerate(kinds))
    return Cluster(devs, mbps, 1.0, "switched", {}, "test")


@pytest.fixture(scope="module")
def chain():
    graph = build_layer_graph(shape_inference.infer_shapes(conv_chain_model(n=4, channels=16, size=30)))
    return graph, build_cost_table(graph, cluster(("rpi5", "rpi4", "rpi4")))


def _check(plan: Plan, graph, cost) -> None:
    plan.ensures(graph)
    assert Plan.from_dict(plan.to_dict()) == plan
    assert fits(plan, graph, cost)
    assert simulate(plan, graph, cost).latency_ms > 0


def test_equal_tiles_split_uneven_rows():
    assert equal_tiles(7, ["a", "b", "c"]) == (Tile("a", 0, 2), Tile("b", 2, 4), Tile("c", 4, 7))
    assert equal_tiles(2, ["a", "b", "c"]) == (Tile("a", 0, 1), Tile("b", 1, 2))


def test_bbgrap_gathers_after_every_block(chain):
    graph, cost = chain
    plan = plan_bbgrap(graph, cost)
    _check(plan, graph, cost)
    cuts = spatial_cuts(graph, 2)
    spatial = [s for s in plan.stages if s.spatial]
    assert [(s.lo, s.hi) for s in spatial] == list(zip(cuts, cuts[1:]))
    for s in spatial:
        sizes = [t.stop - t.start for t in s.spatial.segments[0].tiles]
        assert max(sizes) - min(sizes) <= 1 and len(sizes) == 3  # equal, device-agnostic
    halo = plan_bbgrap(graph, cost, sync="halo")
    _check(halo, graph, cost)
    assert len(halo.stages[0].spatial.segments) == len(cuts) - 1
    # same tiles, but neighbours exchange halo rows instead of gathering whole tensors
    assert simulate(halo, graph, cost).bytes_transferred < simulate(plan, graph, cost).bytes_transferred


def test_edgeflow_is_a_segment_per_block_split_by_speed(chain):
    graph, cost = chain
    plan = plan_edgeflow(graph, cost)
    _check(plan, graph, cost)
    cuts = spatial_cuts(graph, 2)
    segs = plan.stages[0].spatial.segments
    assert [(s.lo, s.hi) for s in segs] == list(zip(cuts, cuts[1:]))  # no fusion across blocks
    for seg in segs:
        rows = {t.device: t.stop - t.start for t in seg.tiles}
        assert rows["rpi5-0"] > max(rows["rpi4-1"], rows["rpi4-2"])


def test_deepthings_fuses_a_fixed_grid(chain):
    graph, cost = chain
    plan = plan_deepthings(graph, cost, grid=(3, 1), layers=2)
    _check(plan, graph, cost)
    group = plan.stages[0].spatial
    assert group.axis == 2 and len(group.segments) == 1 and group.segments[0].hi == 2
    assert [t.stop - t.start for t in group.segments[0].tiles] == [10, 10, 10]
    wide = plan_deepthings(graph, cost, grid=(1, 2))
    assert wide.stages[0].spatial.axis == 3 and len(wide.stages[0].spatial.segments[0].tiles) == 2
    with pytest.raises(ValueError):
        plan_deepthings(graph, cost, grid=(2, 2))  # a 2-D grid needs 2-D tiles
    with pytest.raises(ValueError):
        plan_deepthings(graph, cost, grid=(4, 1))  # more tiles than devices


def test_deepthings_refuses_a_grid_finer_than_the_tensor():
    graph = build_layer_graph(shape_inference.infer_shapes(residual_model()))
    cost = build_cost_table(graph, cluster(("rpi5", "rpi4")))
    assert plan_deepthings(graph, cost).stages[0].spatial is not None
    small = build_layer_graph(shape_inference.infer_shapes(conv_chain_model(n=2, channels=4, size=1)))
    with pytest.raises(InfeasibleError):
        plan_deepthings(small, build_cost_table(small, cluster(("rpi5", "rpi4"))))


def test_registry_runs_every_spatial_strategy(chain):
    graph, cost = chain
    for name, planner in SPATIAL_PLANNERS.items():
        plan = planner(graph, cost, "latency")
        _check(plan, graph, cost)
        assert plan.strategy == name
