"""A profile's `weight_gbps`: a layer that is not memory-bound pays for streaming its weights in, on top of
its compute, and every tile of it pays for all of them (compiler/cost/table.py weight_ms, tiles.py).

Hand-made profiles, so every expected number is worked out here from the formulas."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.cluster import load_cluster, load_profile
from edgec.compiler.cost import build_cost_table
from edgec.compiler.cost.tiles import SegmentCost, tile_ms
from edgec.compiler.errors import UserError
from edgec.compiler.ingest import load_model
from edgec.compiler.spatial import spatial_cuts

FIG = {"op_overhead_us": 10.0, "gflops": {"conv": 100.0, "depthwise_conv": 20.0, "gemm": 80.0, "other": 5.0},
       "memory_gbps": 10.0}
WEIGHT_GBPS = 4.0


def write_profile(tmp_path, name, **figures) -> str:
    doc = {"name": name, "memory_mb": 4096, "usable_memory_fraction": 0.75, "runtime_overhead_mb": 50, **FIG,
           **figures}
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    return f"{name}.yaml"


def costs(tmp_path, model_path, **figures):
    ref = write_profile(tmp_path, "p", **figures)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"devices": [{"name": "d", "profile": ref}]}))
    ing = load_model(model_path)
    return ing, build_cost_table(ing.graph, load_cluster(tmp_path / "c.yaml"), ing.sha256, ing.model)


def model(tmp_path) -> str:
    """Conv 3x3 16->32 on 24x24 (+Relu), MaxPool, Flatten+Gemm 32*12*12 -> 10: a conv, a pool and an FC,
    with weights that are not constant."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((32 * 12 * 12, 10)).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], [w, fc])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def by_class(graph, cls):
    return [i for i, layer in enumerate(graph.layers) if layer.cost_class == cls]


def test_a_compute_bound_layer_adds_its_weights_at_weight_gbps(tmp_path):
    path = model(tmp_path)
    ing, plain = costs(tmp_path, path)
    _, streamed = costs(tmp_path, path, weight_gbps=WEIGHT_GBPS)
    for cls in ("conv", "gemm"):
        (i,) = by_class(ing.graph, cls)
        layer = ing.graph.layers[i]
        compute = layer.flops / (FIG["gflops"][cls] * 1e6)
        activations = (layer.input_bytes + layer.output_bytes) / (FIG["memory_gbps"] * 1e6)
        overhead = len(layer.op_types) * FIG["op_overhead_us"] / 1000
        weights = layer.param_bytes / (WEIGHT_GBPS * 1e6)
        assert streamed.layer_ms[i, 0] == pytest.approx(overhead + max(compute, activations) + weights, rel=1e-12)
        # without weight_gbps the roofline is as before: the weights are bytes of max(compute, memory)
        before = max(compute, (layer.input_bytes + layer.output_bytes + layer.param_bytes) / (FIG["memory_gbps"] * 1e6))
        assert plain.layer_ms[i, 0] == pytest.approx(overhead + before, rel=1e-12)
        # every tile reads every weight: the stream is part of what each tile pays again
        assert streamed.overhead_ms[i, 0] == pytest.approx(overhead + weights, rel=1e-12)
        assert plain.overhead_ms[i, 0] == pytest.approx(overhead, rel=1e-12)
    # the batch-1 FC is all weights: at 4 GB/s its 184 KB cost 46 us, against 18 us at memory_gbps
    (fc,) = by_class(ing.graph, "gemm")
    assert streamed.layer_ms[fc, 0] > plain.layer_ms[fc, 0]


def test_a_memory_bound_layer_is_unchanged(tmp_path):
    path = model(tmp_path)
    ing, plain = costs(tmp_path, path)
    _, streamed = costs(tmp_path, path, weight_gbps=WEIGHT_GBPS)
    pools = by_class(ing.graph, "pool")
    assert pools
    for i in pools:
        assert streamed.layer_ms[i, 0] == plain.layer_ms[i, 0]
        assert streamed.overhead_ms[i, 0] == plain.overhead_ms[i, 0]


def test_a_tile_pays_all_the_weights_and_its_share_of_the_compute(tmp_path):
    path = model(tmp_path)
    ing, cost = costs(tmp_path, path, weight_gbps=WEIGHT_GBPS)
    (i,) = by_class(ing.graph, "conv")
    layer = ing.graph.layers[i]
    fixed = len(layer.op_types) * FIG["op_overhead_us"] / 1000 + layer.param_bytes / (WEIGHT_GBPS * 1e6)
    full = float(cost.layer_ms[i, 0])
    for rows in (1, 6, 12, 23):
        assert tile_ms(ing.graph, cost, i, 0, rows, 24) == pytest.approx(fixed + (full - fixed) * rows / 24, rel=1e-12)
    assert tile_ms(ing.graph, cost, i, 0, 24, 24) == pytest.approx(full, rel=1e-12)
    # two halves cost the weights twice: the spatial search sees it through SegmentCost
    cuts = spatial_cuts(ing.graph, 2)
    seg = SegmentCost.build(ing.graph, cost, cuts[0], cuts[1], 2)
    n = seg.rows
    halves = seg.comp(0, 0, n // 2) + seg.comp(0, n // 2, n)
    assert halves > seg.comp(0, 0, n) + 0.9 * layer.param_bytes / (WEIGHT_GBPS * 1e6)


@pytest.mark.parametrize("key", ["weight_gbps", "gemm_weight_gbps"])
def test_weight_figures_per_thread_count_and_mode(tmp_path, key):
    slow = {"power_w": {"idle": 1.5, "busy": 3.0}, "sources": ["test"], key: 3.0}
    ref = write_profile(tmp_path, "q", **{key: 6.0}, threads={1: {**FIG, key: 2.5}, 2: FIG},
                        power_w={"idle": 2.0, "busy": 5.0},
                        modes={"slow": slow, "same": {"power_w": {"idle": 1.5, "busy": 4.0}, "sources": ["test"]}})
    p = load_profile(str(tmp_path / ref))
    assert getattr(p, key) == 6.0 and getattr(p.figures(), key) == 6.0
    assert getattr(p.figures(1), key) == 2.5
    assert getattr(p.figures(2), key) is None  # a thread count that did not measure it does not price it
    assert getattr(p.mode_figures("slow"), key) == 3.0 and getattr(p.mode_figures("same"), key) == 6.0


@pytest.mark.parametrize("key", ["weight_gbps", "gemm_weight_gbps"])
@pytest.mark.parametrize("value", [0, -1.0, "fast"])
def test_a_bad_weight_figure_is_a_user_error(tmp_path, key, value):
    ref = write_profile(tmp_path, "bad", **{key: value})
    with pytest.raises(UserError, match=key):
        load_profile(str(tmp_path / ref))


def gemm_model(tmp_path, rows: int) -> str:
    """A MatMul of `rows` x 64 by 64 x 32 with weights that are not constant."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, 32])], [w])
    path = tmp_path / f"mm{rows}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


@pytest.mark.parametrize("rows, gemm_priced", [(1, False), (2, True), (128, True)])
def test_a_gemm_of_two_rows_or_more_reads_its_weights_at_gemm_weight_gbps(tmp_path, rows, gemm_priced):
    """A GEMM of several rows waits for its weights longer per byte than a batch-1 MatMul streams them: a gemm
    layer of two rows or more pays weight bytes / gemm_weight_gbps where the profile measured it, a batch-1
    one weight_gbps; without gemm_weight_gbps both pay weight_gbps."""
    path = gemm_model(tmp_path, rows)
    _, plain = costs(tmp_path, path)
    both = tmp_path / "both"
    both.mkdir()
    ing, priced = costs(both, path, weight_gbps=WEIGHT_GBPS, gemm_weight_gbps=1.0)
    (layer,) = ing.graph.layers
    assert layer.cost_class == "gemm" and layer.param_bytes == 64 * 32 * 4
    gbps = 1.0 if gemm_priced else WEIGHT_GBPS
    compute = layer.flops / (FIG["gflops"]["gemm"] * 1e6)
    moved = layer.input_bytes + layer.output_bytes
    expected = max(compute, moved / (FIG["memory_gbps"] * 1e6)) + layer.param_bytes / (gbps * 1e6)
    assert priced.layer_ms[0, 0] == pytest.approx(FIG["op_overhead_us"] / 1000 + expected)
    assert priced.layer_ms[0, 0] > plain.layer_ms[0, 0]
    only = tmp_path / "only"
    only.mkdir()
    _, old = costs(only, path, weight_gbps=WEIGHT_GBPS)
    roof = max(compute, moved / (FIG["memory_gbps"] * 1e6))
    stream = layer.param_bytes / (WEIGHT_GBPS * 1e6)
    assert old.layer_ms[0, 0] == pytest.approx(FIG["op_overhead_us"] / 1000 + roof + stream)
    # a GEMM figure faster than weight_gbps timed weights a cache held (a profile under a CPU quota, before
    # kernels.gemm_weight_figure): never priced faster than weight_gbps
    cached = tmp_path / "cached"
    cached.mkdir()
    _, fast = costs(cached, path, weight_gbps=WEIGHT_GBPS, gemm_weight_gbps=WEIGHT_GBPS * 30)
    assert fast.layer_ms[0, 0] == pytest.approx(old.layer_ms[0, 0])



def test_the_profile_records_no_gemm_weight_figure_faster_than_weight_gbps():
    """A GEMM waits on its weights longer per byte than a batch-1 MatMul streams them: a chain that came in
    faster read them from a cache, and the profile leaves the figure out (the cost model then uses weight_gbps)."""
    from edgec.runtime.profile.kernels import gemm_weight_figure

    assert gemm_weight_figure(20.0, 24.0) == 20.0
    assert gemm_weight_figure(24.0, 24.0) == 24.0
    assert gemm_weight_figure(646.0, 22.3) is None  # measured under a 0.9-core quota
    assert gemm_weight_figure(None, 22.3) is None
