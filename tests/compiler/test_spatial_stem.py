"""Tiling after an untileable stem: regions, the multi-entry search, and plans stem -> tiles -> rest."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.cost import build_cost_table, evaluate
from edgec.compiler.cost.stage_timeline import predict_stage
from edgec.compiler.plan.spatial import regions, search_hybrid, search_spatial
from edgec.compiler.plan.spatial_search import SpatialSearch
from edgec.compiler.spatial import spatial_cuts, tileable
from tests.compiler.test_spatial import graph_of, make_cluster
from tests.conftest import conv_chain_model


def focus_model(size: int = 16, convs: int = 3, channels: int = 8, seed: int = 0, flip: bool = False):
    """YOLOv5's Focus stem (four strided Slice pairs, Concat on channels), then conv+relu x convs, Flatten, Gemm.

    flip: the image is first flipped upside down (a Slice with step -1, which is not tiled): an untileable
    stem before the tileable Focus."""
    rng = np.random.default_rng(seed)
    inits, nodes, parts = [], [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    end = const("end", np.array([np.iinfo(np.int64).max]))
    step = const("step", np.array([2]))
    for axis in (2, 3):
        const(f"axis{axis}", np.array([axis]))
    for start in (0, 1):
        const(f"start{start}", np.array([start]))
    image = "x"
    if flip:
        back = [const(f"flip.{what}", np.array([v])) for what, v in
                (("starts", -1), ("ends", np.iinfo(np.int64).min), ("axes", 2), ("steps", -1))]
        nodes.append(helper.make_node("Slice", ["x", *back], ["flipped"], name="flip"))
        image = "flipped"
    for k, (r, c) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        nodes.append(helper.make_node("Slice", [image, f"start{r}", end, "axis2", step], [f"h{k}"], name=f"sh{k}"))
        nodes.append(helper.make_node("Slice", [f"h{k}", f"start{c}", end, "axis3", step], [f"p{k}"], name=f"sw{k}"))
        parts.append(f"p{k}")
    nodes.append(helper.make_node("Concat", parts, ["cat"], axis=1, name="cat"))
    prev, cin = "cat", 12
    for i in range(convs):
        const(f"w{i}", rng.normal(0, np.sqrt(2 / (cin * 9)), (channels, cin, 3, 3)).astype(np.float32))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        prev, cin = f"r{i}", channels
    nodes.append(helper.make_node("Flatten", [prev], ["flat"], name="flatten"))
    const("fw", rng.normal(0, 0.05, (channels * (size // 2) ** 2, 10)).astype(np.float32))
    nodes.append(helper.make_node("Gemm", ["flat", "fw"], ["y"], name="fc"))
    graph = helper.make_graph(nodes, "focus", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_regions_find_the_run_after_the_stem():
    graph = graph_of(focus_model(flip=True))
    assert tileable(graph, 0, 2) == "flip: Slice: step -1 on a spatial axis (only positive steps are tiled)"
    assert len(spatial_cuts(graph, 2)) == 1  # nothing tileable from the model input
    prefix, later = regions(graph, 2)
    assert prefix is None and len(later) == 1
    assert later[0][0] == 1 and later[0][-1] == len(graph.layers) - 2  # the Focus to the Flatten


@pytest.mark.parametrize("axis", [2, 3])
def test_the_focus_stem_tiles_from_the_model_input(axis):
    """Issue 12: the strided Slices and their Concat are tileable, so the region starts at the model input."""
    graph = graph_of(focus_model())
    prefix, later = regions(graph, axis)
    assert prefix is not None and prefix[0] == 0 and prefix[-1] == len(graph.layers) - 2 and later == []


def test_regions_of_a_model_tileable_from_its_input_keep_that_prefix():
    graph = graph_of(conv_chain_model(n=3, channels=4, size=8))
    prefix, later = regions(graph, 2)
    assert prefix == spatial_cuts(graph, 2) and later == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.sampled_from([8, 12, 16]), kinds=st.sampled_from([("rpi5", "rpi4"), ("rpi5", "rpi5", "rpi4")]),
       mbps=st.sampled_from([10.0, 1000.0]), threshold=st.sampled_from([0.3, 0.6]), data=st.data())
def test_search_with_entries_equals_exhaustive(size, kinds, mbps, threshold, data):
    """Entered at any cut of a run (each with its own stem cost), the unbounded search finds the exhaustive
    optimum, and the path it reports starts at the entry it came from."""
    graph = graph_of(focus_model(size=size, convs=3, channels=4, flip=True))
    cost = build_cost_table(graph, make_cluster(kinds, mbps, 0.2))
    cuts = regions(graph, 2)[1][0]
    entries = {j: data.draw(st.floats(0.0, 5.0)) for j in range(len(cuts) - 1)}
    rest = [float(cost.layer_ms[c:, 0].sum()) for c in cuts]

    def search():
        return SpatialSearch(graph, cost, 2, list(cost.devices), cuts, rest, threshold, None, entries=entries)

    want, _ = search().exhaustive()
    s = search()
    ends = s.run(beam=None, branch=None)
    assert math.isclose(min(t for t, _ in ends.values()), want, rel_tol=1e-9)
    for end, (total, path) in ends.items():
        entry = s.entry_of[end]
        steps = sum(s.step(j, part, j2, part2) for (j, part), (j2, part2) in zip([(entry, None), *path], path))
        assert math.isclose(total, entries[entry] + steps + s.gather(end, path[-1][1]) + rest[end], rel_tol=1e-9)


@pytest.mark.parametrize("search", [search_spatial, search_hybrid])
def test_plans_tile_after_the_stem(search):
    """Before: "no layer at the start of the model can be tiled". Now: stem stage, then the tiled
    region, scattered from the stem's device, then the rest."""
    graph = graph_of(focus_model(size=32, convs=4, channels=32, flip=True))
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi5"), 1000.0, 0.2))
    plan, _ = search(graph, cost)
    plan.ensures(graph)
    k = next(k for k, s in enumerate(plan.stages) if s.spatial is not None)
    assert k >= 1 and plan.stages[0].spatial is None and plan.stages[0].lo == 0
    assert plan.stages[k - 1].device == plan.stages[k].device  # the stem's device scatters
    pred = evaluate(plan, graph, cost)
    info = predict_stage(plan.stages[k], graph, cost)
    stem = sum(float(cost.layer_ms[s.lo:s.hi, cost.index(s.device)].sum()) for s in plan.stages[:k])
    rest = sum(float(cost.layer_ms[s.lo:s.hi, cost.index(s.device)].sum()) for s in plan.stages[k + 1:])
    if all(s.device == plan.stages[k].device for s in plan.stages[k + 1:]):
        assert math.isclose(pred.latency_ms, stem + info["latency_ms"] + rest, rel_tol=1e-9)
