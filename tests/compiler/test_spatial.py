"""Spatial planner: pruned search equals exhaustive search, plans are valid, cost model is consistent."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import shape_inference

from edgec.compiler.cluster import ClusterModel, DeviceSpec, load_profile
from edgec.compiler.cost import build_cost_table
from edgec.compiler.ingest import load_model
from edgec.compiler.layers import build_layer_graph
from edgec.compiler.plan.spatial import search_hybrid, search_spatial
from edgec.compiler.plan.spatial_partitions import windows
from edgec.compiler.plan.spatial_search import INF, SpatialSearch
from edgec.compiler.cost.stage_timeline import predict_stage
from edgec.compiler.cost.tiles import SegmentCost, tile_ms
from edgec.compiler.plan_types import Plan
from edgec.compiler.cost import evaluate
from edgec.compiler.spatial import spatial_cuts
from tests.conftest import conv_chain_model, residual_model

LIGHT = Path(__import__("onnx").__file__).parent / "backend/test/data/light"
PROFILES = {n: load_profile(n) for n in ("rpi5", "rpi4")}


def make_cluster(kinds, mbps=100.0, latency=1.0, medium="switched", links=None) -> ClusterModel:
    devs = tuple(DeviceSpec(f"{k}-{i}", PROFILES[k], PROFILES[k].memory_mb, None) for i, k in enumerate(kinds))
    return ClusterModel(devs, mbps, latency, medium, links or {}, "test")


def graph_of(model):
    return build_layer_graph(shape_inference.infer_shapes(model))


def _search(graph, cost, threshold, axis=2, budget=None):
    cuts = spatial_cuts(graph, axis)
    rest = [float(cost.layer_ms[c:, 0].sum()) for c in cuts]
    return SpatialSearch(graph, cost, axis, list(cost.devices), cuts, rest, threshold, budget)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), size=st.integers(4, 9), kinds=st.sampled_from([("rpi5", "rpi4"), ("rpi4", "rpi5"), ("rpi5", "rpi5", "rpi4")]),
       mbps=st.sampled_from([1.0, 10.0, 100.0, 1000.0]), medium=st.sampled_from(["switched", "shared"]),
       threshold=st.sampled_from([0.1, 0.3, 0.6]), residual=st.booleans())
def test_pruned_search_equals_exhaustive(n, size, kinds, mbps, medium, threshold, residual):
    model = residual_model() if residual else conv_chain_model(n=n, channels=4, size=size)
    graph = graph_of(model)
    cost = build_cost_table(graph, make_cluster(kinds, mbps, 0.2, medium))
    ref = _search(graph, cost, threshold)
    want, path = ref.exhaustive()
    pruned = _search(graph, cost, threshold)
    ends = pruned.run(beam=None, branch=None)
    got = min(t for t, _ in ends.values())
    assert math.isclose(got, want, rel_tol=1e-9), (got, want, path)
    assert pruned.stats.exact
    # the default beam never reports better than the optimum, and every total is the sum of its steps
    beam = _search(graph, cost, threshold, budget=1000)
    for end, (total, p) in beam.run().items():
        assert total >= want - 1e-9
        steps = sum(beam.step(j, part, j2, part2) for (j, part), (j2, part2) in zip([(0, None), *p], p))
        assert math.isclose(total, steps + beam.gather(end, p[-1][1]) + beam.rest[end], rel_tol=1e-9)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), size=st.integers(4, 9), kinds=st.sampled_from([("rpi5", "rpi4"), ("rpi5", "rpi5", "rpi4")]),
       mbps=st.sampled_from([1.0, 100.0]), incumbent=st.sampled_from([INF, 0.0, 5.0, 20.0]), data=st.data())
def test_one_search_for_several_tails_finds_what_each_finds_alone(n, size, kinds, mbps, incumbent, data):
    """run_tails (spatial and hybrid share a search in auto): per tail, the best total under its own
    incumbent is the exact optimum of a search with that tail alone, and a lower-bound tail with its
    exact values on demand changes nothing."""
    graph = graph_of(conv_chain_model(n=n, channels=4, size=size))
    cost = build_cost_table(graph, make_cluster(kinds, mbps, 0.2))
    cuts = spatial_cuts(graph, 2)
    tails = [[float(cost.layer_ms[c:, d].sum()) + data.draw(st.floats(0.0, 3.0)) * (c < cuts[-1]) for c in cuts]
             for d in range(2)]
    alone = []
    for rest in tails:
        s = SpatialSearch(graph, cost, 2, list(cost.devices), cuts, rest, 0.3, None)
        alone.append(min((t for t, _ in s.run(beam=None, branch=None, incumbent=incumbent).values()), default=INF))
    lower = tuple([x * 0.5 for x in t] for t in tails)  # what the search prunes with; exact values on demand
    both = SpatialSearch(graph, cost, 2, list(cost.devices), cuts, lower, 0.3, None,
                         exact_rest=lambda j, t: tails[t][j])
    ends = both.run_tails(beam=None, branch=None, incumbent=(incumbent, incumbent))
    for t, want in enumerate(alone):
        got = min((prefix + tails[t][j] for j, (prefix, _) in ends.items()), default=INF)
        if want < incumbent:
            assert math.isclose(got, want, rel_tol=1e-9), (t, got, want)
        else:  # bounded away: nothing below the incumbent, in both
            assert got >= incumbent - 1e-9 or math.isclose(got, want, rel_tol=1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(4, 12), kinds=st.sampled_from([("rpi5", "rpi4"), ("rpi5", "rpi4", "rpi4"), ("rpi4", "rpi5", "rpi5", "rpi4")]),
       mbps=st.sampled_from([1.0, 100.0]), medium=st.sampled_from(["switched", "shared"]), k=st.integers(1, 3),
       data=st.data())
def test_k_best_partitions_are_exact(size, kinds, mbps, medium, k, data):
    """The partition search with sub-tree reuse and every bound on returns the k best steps exactly,
    after the scatter and after an arbitrary earlier partition."""
    graph = graph_of(conv_chain_model(n=2, channels=4, size=size))
    cost = build_cost_table(graph, make_cluster(kinds, mbps, 0.2, medium))
    s = _search(graph, cost, 0.5)
    prev = data.draw(st.sampled_from([None, *s.partitions(1)]))
    j, j2 = (0, 1) if prev is None else (1, 2)
    want = sorted(s.step(j, prev, j2, p) for p in s.partitions(j2))[:k]
    got = [c for c, _ in s.transition(j, prev, j2, INF, k)]
    assert len(got) == len(want) and all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(got, want))


def test_windows_follow_adaps_bounds():
    lo, hi, order = windows(224, np.array([3.0, 1.0]), 0.1)
    assert order[0][0] == 168 and order[1][0] == 56  # Eq. 1: speed-proportional shares first
    assert hi[0] == 168 + 6 and lo[0] == 168 - 6  # Eq. 3: 10% of (Eq. 2's 223 - 168), rounded up
    assert hi[1] - 56 == 17  # 10% of 223 - 56
    lo, hi, _ = windows(3, np.ones(4), 0.1)
    assert min(lo) == 0 and sum(hi) >= 3  # fewer rows than devices: some devices sit out


def test_search_space_counts_every_choice():
    graph = graph_of(conv_chain_model(n=2, channels=4, size=6))
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi4"), 10.0))
    s = _search(graph, cost, 0.5)
    per_cut = [sum(1 for _ in s.partitions(j)) for j in (1, 2)]
    # end after cut 1 (one segmentation) or cut 2 (fused, or split at 1)
    assert round(10 ** s.space_log10()) == per_cut[0] + per_cut[1] * (1 + per_cut[0])


def test_tile_time_is_consistent_with_the_cost_table():
    graph = graph_of(conv_chain_model(n=3, channels=4, size=12))
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi4")))
    sc = SegmentCost.build(graph, cost, 0, 3, 2)
    for d in range(2):  # a whole-tensor tile costs exactly the layers' times
        assert math.isclose(sc.comp(d, 0, 12), cost.layer_ms[:3, d].sum(), rel_tol=1e-12)
    # a tile pays per-op overhead plus its share of rows, halo rows included
    rows = [sc.maps.layer_rows(i, 0, 6) for i in range(3)]
    assert rows == [8, 7, 6]  # 3x3 pad-1 convs: each earlier layer computes one more row below
    want = sum(tile_ms(graph, cost, i, 1, r, 12) for i, r in enumerate(rows))
    assert math.isclose(sc.comp(1, 0, 6), want, rel_tol=1e-12)


def _stage_rows(plan: Plan):
    return [[(t.device, t.start, t.stop) for t in seg.tiles] for seg in plan.stages[0].spatial.segments]


def test_plan_spatial_on_a_chain_is_valid_and_beats_one_device():
    graph = graph_of(conv_chain_model(n=4, channels=64, size=64))
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi5", "rpi4"), 1000.0, 0.1))
    plan, stats = search_spatial(graph, cost)
    plan.ensures(graph)
    assert plan.strategy == "spatial" and plan.stages[0].spatial is not None
    assert stats.nodes_visited > 0 and stats.search_space_log10 > 2
    pred = evaluate(plan, graph, cost)
    assert pred.latency_ms < cost.layer_ms.sum(axis=0).min()  # fast network: splitting pays
    # the faster device gets more rows of every segment output
    for tiles in _stage_rows(plan):
        sizes = {d.split("-")[0]: b - a for d, a, b in tiles}
        assert sizes.get("rpi5", 0) > sizes.get("rpi4", 0)


def test_predict_stage_timeline_matches_simulate():
    graph = graph_of(conv_chain_model(n=4, channels=16, size=32))
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi4", "rpi4"), 100.0))
    plan, _ = search_spatial(graph, cost, devices=list(cost.devices))
    info = predict_stage(plan.stages[0], graph, cost)
    pred = evaluate(plan, graph, cost)
    tail = sum(float(cost.layer_ms[s.lo:s.hi, cost.index(s.device)].sum()) for s in plan.stages[1:])
    assert math.isclose(pred.latency_ms, info["latency_ms"] + tail, rel_tol=1e-9)
    assert pred.bytes_transferred == info["bytes"] > 0
    assert all(tr[1] != tr[2] for tr in info["transfers"])
    assert set(info["compute_ms"]) == set(plan.stages[0].spatial.devices) | {plan.stages[0].device}


def test_uneven_rows_over_three_devices():
    graph = graph_of(conv_chain_model(n=2, channels=4, size=7))
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi4", "rpi4"), 1000.0, 0.0))
    plan, _ = search_spatial(graph, cost, threshold=0.5)
    for tiles in _stage_rows(plan):
        assert tiles[0][1] == 0 and tiles[-1][2] == 7


def test_plans_on_branching_zoo_models_cover_the_graph():
    graph = load_model(LIGHT / "light_inception_v1.onnx").graph
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi4"), 100.0))
    for plan, stats in (search_spatial(graph, cost), search_hybrid(graph, cost)):
        plan.ensures(graph)
        assert Plan.from_dict(plan.to_dict()) == plan
        assert stats.seconds < 10


def test_hybrid_can_follow_tiles_with_pipeline_stages():
    graph = graph_of(conv_chain_model(n=4, channels=32, size=64))
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi4", "rpi4"), 1000.0, 0.1))
    plan, _ = search_hybrid(graph, cost)
    plan.ensures(graph)
    spatial_pred = evaluate(search_spatial(graph, cost)[0], graph, cost).latency_ms
    assert evaluate(plan, graph, cost).latency_ms <= spatial_pred * 1.05
