"""The cost model reads a profile's per-thread figures, op table and tile-efficiency curves (issue 11, item 1).

Small hand-made profiles, so every expected number is worked out here from the formulas of
compiler/cost/table.py and compiler/cost/tiles.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table, evaluate
from edgec.compiler.cost.table import layer_out_positions
from edgec.compiler.cost.tiles import SegmentCost, efficiency, tile_ms
from edgec.compiler.errors import UserError
from edgec.compiler.ingest import load_model
from edgec.compiler.plan.spatial_search import SpatialSearch
from edgec.compiler.spatial import spatial_cuts
from tests.conftest import conv_chain_model

FAST = {"op_overhead_us": 10.0, "gflops": {"conv": 100.0, "depthwise_conv": 20.0, "gemm": 80.0, "other": 5.0},
        "memory_gbps": 10.0}
SLOW = {"op_overhead_us": 40.0, "gflops": {"conv": 20.0, "depthwise_conv": 4.0, "gemm": 16.0, "other": 1.0},
        "memory_gbps": 2.0}


def write_profile(tmp_path, name, **figures):
    doc = {"name": name, "memory_mb": 4096, "usable_memory_fraction": 0.75, "runtime_overhead_mb": 50, **FAST,
           **figures}
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    return f"{name}.yaml"


def write_cluster(tmp_path, devices, name="c.yaml"):
    doc = {"devices": devices, "network": {"bandwidth_mbps": 100, "latency_ms": 1}}
    (tmp_path / name).write_text(yaml.safe_dump(doc))
    return tmp_path / name


def roofline(layer, fig) -> float:
    """The roofline of compiler/cost/table.py, written out for a compute-bound layer."""
    moved = layer.input_bytes + layer.output_bytes + layer.param_bytes
    compute = layer.flops / (fig["gflops"][layer.cost_class] * 1e6)
    return len(layer.op_types) * fig["op_overhead_us"] / 1000 + max(compute, moved / (fig["memory_gbps"] * 1e6))


def save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, path)
    return str(path)


def priced_model() -> onnx.ModelProto:
    """Conv -> Relu -> LRN (one layer: LRN follows), Conv 1x1, Softmax, Resize linear 2x."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w2")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("LRN", ["r1"], ["n1"], size=5, name="lrn1"),
        helper.make_node("Conv", ["n1", "w2"], ["c2"], name="conv2"),
        helper.make_node("Softmax", ["c2"], ["s"], axis=1, name="softmax"),
        helper.make_node("Resize", ["s", "", "scales"], ["y"], mode="linear", name="resize"),
    ]
    graph = helper.make_graph(nodes, "priced", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 8, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 4, 16, 16))], [w1, w2, scales])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


# --------------------------------------------------------------------------------------------------
# 1. figures per thread count


def test_device_threads_pick_that_counts_figures(tmp_path):
    ing = load_model(save(conv_chain_model(n=2), tmp_path / "m.onnx"))
    prof = write_profile(tmp_path, "host", threads={1: SLOW, 4: FAST})
    path = write_cluster(tmp_path, [{"name": "one", "profile": prof, "threads": 1},
                                    {"name": "all", "profile": prof},
                                    {"name": "three", "profile": prof, "threads": 3}])
    cost = build_cost_table(ing.graph, load_cluster(path), ing.sha256)
    conv = ing.graph.layers[0]
    assert conv.cost_class == "conv"
    assert cost.layer_ms[0, 0] == pytest.approx(roofline(conv, SLOW), rel=1e-12)
    assert cost.layer_ms[0, 1] == pytest.approx(roofline(conv, FAST), rel=1e-12)  # no threads: the top level
    assert (cost.layer_ms[:, 2] == cost.layer_ms[:, 0]).all()  # 3 not measured: the largest count below, 1
    assert (cost.layer_ms[:, 0] > cost.layer_ms[:, 1]).all()
    # every tile pays the thread count's per-operator overhead
    assert cost.overhead_ms[0, 0] == len(conv.op_types) * 40.0 / 1000
    assert cost.overhead_ms[0, 1] == len(conv.op_types) * 10.0 / 1000


def test_a_thread_counts_measured_table_is_used(tmp_path):
    ing = load_model(save(conv_chain_model(n=2), tmp_path / "m.onnx"))
    table = {n: 0.5 for layer in ing.graph.layers for n in layer.node_names}
    prof = write_profile(tmp_path, "host", threads={1: {**SLOW, "layers": {ing.sha256: table}}})
    path = write_cluster(tmp_path, [{"name": "one", "profile": prof, "threads": 1}, {"name": "all", "profile": prof}])
    cost = build_cost_table(ing.graph, load_cluster(path), ing.sha256)
    assert cost.measured == (True, False)
    assert cost.layer_ms[:, 0].tolist() == [0.5 * len(layer.node_names) for layer in ing.graph.layers]


def test_threads_go_to_the_manifest_and_choose_the_local_workers_threads(tmp_path):
    from edgec.compiler.api import compile as compile_model
    from edgec.runtime.coordinator.pool import WorkerPool as RuntimeCluster
    from edgec.runtime.manifest.load import load_manifest

    model = save(conv_chain_model(n=2), tmp_path / "m.onnx")
    prof = write_profile(tmp_path, "host", threads={1: SLOW})
    path = write_cluster(tmp_path, [{"name": "a", "profile": prof, "threads": 1}, {"name": "b", "profile": prof}])
    compile_model(model, path, tmp_path / "out", strategy="pipeline")
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [d.get("threads") for d in doc["devices"]] == [1, None]
    assert "threads" not in doc["devices"][1]  # no key without a cluster.yaml `threads`: manifests as before
    manifest = load_manifest(tmp_path / "out" / "manifest.json")
    assert [d.threads for d in manifest.devices] == [1, None]
    assert RuntimeCluster(manifest).device_threads == {"a": 1}
    assert RuntimeCluster(manifest, threads=2).device_threads == {}  # --threads wins


@pytest.mark.parametrize("threads", [0, -1, 4097, 1.5, "2", True])
def test_bad_device_threads_is_a_user_error(tmp_path, threads):
    path = write_cluster(tmp_path, [{"name": "a", "profile": "rpi5", "threads": threads}])
    with pytest.raises(UserError, match=r"device 'a': threads must be an integer from 1 to 4096") as ei:
        load_cluster(path)
    assert ei.value.path == str(path)


# --------------------------------------------------------------------------------------------------
# 2. op prices


def test_an_op_price_changes_exactly_the_layers_holding_that_op(tmp_path):
    ing = load_model(save(priced_model(), tmp_path / "m.onnx"))
    layers = ing.graph.layers
    assert [l.op_types for l in layers] == [("Conv", "Relu", "LRN"), ("Conv",), ("Softmax",), ("Resize",)]
    plain = write_profile(tmp_path, "plain")
    lrn = write_profile(tmp_path, "lrn", op_ms_per_melem={"LRN": 25.0})
    path = write_cluster(tmp_path, [{"name": "p", "profile": plain}, {"name": "l", "profile": lrn}])
    cost = build_cost_table(ing.graph, load_cluster(path), ing.sha256)
    e = 4 * 8 * 8
    # the LRN follows a Conv: its price comes on top of the Conv's roofline
    assert cost.layer_ms[0, 1] - cost.layer_ms[0, 0] == pytest.approx(e * 25.0 / 1e6, rel=1e-9)
    assert cost.priced_ms[0].tolist() == [0.0, e * 25.0 / 1e6]
    assert (cost.layer_ms[1:, 1] == cost.layer_ms[1:, 0]).all()


def relu6_model() -> onnx.ModelProto:
    """MobileNetV2's block: depthwise Conv -> BatchNormalization -> Clip(0, 6), then a 1x1 Conv without one."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "dw"),
             numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32), "pw"),
             *(numpy_helper.from_array(np.full(8, v, np.float32), n)
               for n, v in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0))),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "dw"], ["c"], pads=[1, 1, 1, 1], group=8, name="dwconv"),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Clip", ["b", "lo", "hi"], ["r"], name="relu6"),
             helper.make_node("Conv", ["r", "pw"], ["y"], name="pwconv")]
    graph = helper.make_graph(nodes, "relu6", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 8, 6, 6))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 6, 6))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_clip_after_a_conv_adds_its_price_to_the_conv_layer(tmp_path):
    """ReLU6 after a (depthwise) Conv is a pass over the output that the Conv's roofline misses: a Clip price
    adds elements x price to that layer only; a profile without one prices it as before."""
    ing = load_model(save(relu6_model(), tmp_path / "m.onnx"))
    layers = ing.graph.layers
    assert [(l.op_types, l.cost_class) for l in layers] == [
        (("Conv", "BatchNormalization", "Clip"), "depthwise_conv"), (("Conv",), "conv")]
    plain = write_profile(tmp_path, "plain", op_ms_per_melem={"LRN": 25.0})
    clip = write_profile(tmp_path, "clip", op_ms_per_melem={"LRN": 25.0, "Clip": 0.1})
    cost = build_cost_table(ing.graph, load_cluster(write_cluster(
        tmp_path, [{"name": "p", "profile": plain}, {"name": "c", "profile": clip}])), ing.sha256, model=ing.model)
    e = 8 * 6 * 6
    assert cost.layer_ms[0, 0] == pytest.approx(roofline(layers[0], FAST), rel=1e-12)
    assert cost.layer_ms[0, 1] - cost.layer_ms[0, 0] == pytest.approx(e * 0.1 / 1e6, rel=1e-9)
    assert cost.priced_ms[0].tolist() == [0.0, e * 0.1 / 1e6]
    assert cost.layer_ms[1, 1] == cost.layer_ms[1, 0]


def test_a_priced_leader_replaces_the_layers_roofline(tmp_path):
    ing = load_model(save(priced_model(), tmp_path / "m.onnx"))
    prof = write_profile(tmp_path, "soft", op_ms_per_melem={"Softmax": 2.0, "Resize": 1.0, "Resize:linear": 3.0})
    cl = load_cluster(write_cluster(tmp_path, [{"name": "s", "profile": prof}]))
    oh = 10.0 / 1000
    with_modes = build_cost_table(ing.graph, cl, ing.sha256, model=ing.model)
    assert with_modes.layer_ms[2, 0] == oh + 4 * 8 * 8 * 2.0 / 1e6  # Softmax: overhead + price, no roofline
    assert with_modes.layer_ms[3, 0] == oh + 4 * 16 * 16 * 3.0 / 1e6  # Resize:linear, priced by its mode
    # without the model a node's mode is unknown: the op type's price
    assert build_cost_table(ing.graph, cl, ing.sha256).layer_ms[3, 0] == oh + 4 * 16 * 16 * 1.0 / 1e6
    # an op table without the key leaves the roofline
    other = load_cluster(write_cluster(tmp_path, [{"name": "s", "profile": write_profile(tmp_path, "erf", op_ms_per_melem={"Erf": 1.0})}], "c_erf.yaml"))
    plain = load_cluster(write_cluster(tmp_path, [{"name": "s", "profile": write_profile(tmp_path, "plain")}], "c_plain.yaml"))
    assert (build_cost_table(ing.graph, other).layer_ms == build_cost_table(ing.graph, plain).layer_ms).all()


def test_a_priced_leader_after_a_pool_keeps_the_pools_traffic(tmp_path):
    """Inception's MaxPool -> LRN: the LRN (10 FLOPs per element) leads the layer, but the MaxPool's traffic
    is no pointwise follower's: the price comes on top of the memory roofline."""
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="pool"),
             helper.make_node("LRN", ["p"], ["y"], size=5, name="lrn")]
    graph = helper.make_graph(nodes, "pool_lrn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 8, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 4, 8, 8))])
    ing = load_model(save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx"))
    (layer,) = ing.graph.layers
    assert (layer.op_types, layer.cost_class) == (("MaxPool", "LRN"), "norm")
    prof = write_profile(tmp_path, "lrn", op_ms_per_melem={"LRN": 25.0})
    cost = build_cost_table(ing.graph, load_cluster(write_cluster(tmp_path, [{"name": "d", "profile": prof}])))
    mem = (layer.input_bytes + layer.output_bytes) / (FAST["memory_gbps"] * 1e6)
    assert cost.layer_ms[0, 0] == 2 * 10.0 / 1000 + 256 * 25.0 / 1e6 + mem


def norm_model() -> onnx.ModelProto:
    """An embedding (Gather of a 1000 x 16 table) plus a position table, a residual Add and a LayerNormalization
    (onnxruntime fuses the two: SkipLayerNormalization), then a bias Add and a LayerNormalization (not fused)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1000, 16)).astype(np.float32), "table"),
             numpy_helper.from_array(rng.standard_normal((1, 8, 16)).astype(np.float32), "pos"),
             numpy_helper.from_array(np.ones(16, np.float32), "g"),
             numpy_helper.from_array(np.zeros(16, np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "bias")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0, name="gather"),
             helper.make_node("Add", ["emb", "pos"], ["x"], name="add_pos"),
             helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["x", "r"], ["s"], name="residual"),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["n1"], axis=-1, name="ln_skip"),
             helper.make_node("Add", ["n1", "bias"], ["t"], name="add_bias"),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["y"], axis=-1, name="ln_bias")]
    graph = helper.make_graph(nodes, "norms", [helper.make_tensor_value_info("ids", TensorProto.INT64, (1, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 16))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_layer_norm_after_a_residual_add_takes_the_fused_price(tmp_path):
    """onnxruntime fuses a residual Add (two inputs of one shape) and the LayerNormalization after it into
    SkipLayerNormalization, ten times slower here: that LayerNormalization takes "LayerNormalization:skip";
    one after a bias Add (broadcast: not fused) the plain price; without the model (no shapes) the plain one."""
    from edgec.compiler.cost.table import SKIP_NORM, price_keys

    ing = load_model(save(norm_model(), tmp_path / "m.onnx"))
    lns = [layer for layer in ing.graph.layers if layer.op_types[0] == "LayerNormalization"]
    assert [price_keys(layer, ing.model)[0] for layer in lns] == [(SKIP_NORM, "LayerNormalization"),
                                                                    ("LayerNormalization",)]
    assert price_keys(lns[0])[0] == ("LayerNormalization",)
    prof = write_profile(tmp_path, "ln", op_ms_per_melem={"LayerNormalization": 0.4, SKIP_NORM: 4.0})
    cost = build_cost_table(ing.graph, load_cluster(write_cluster(tmp_path, [{"name": "d", "profile": prof}])),
                            ing.sha256, model=ing.model)
    oh = 10.0 / 1000
    skip, plain = (cost.layer_ms[layer.index, 0] - len(layer.op_types) * oh for layer in lns)
    assert skip == pytest.approx(8 * 16 * 4.0 / 1e6) and plain == pytest.approx(8 * 16 * 0.4 / 1e6)


def test_a_gather_reads_only_the_rows_it_gathers(tmp_path):
    """The embedding layer holds its whole table (memory) but reads only the gathered rows per run (its
    traffic): 8 rows of 16 floats, not 1000, plus the position table it adds, read whole."""
    ing = load_model(save(norm_model(), tmp_path / "m.onnx"))
    emb = ing.graph.layers[0]
    assert emb.op_types[:2] == ("Gather", "Add")
    assert emb.param_bytes == (1000 * 16 + 8 * 16) * 4 and emb.read_param_bytes == (8 * 16 + 8 * 16) * 4
    assert all(layer.param_read_bytes is None for layer in ing.graph.layers[1:])
    cost = build_cost_table(ing.graph, load_cluster(write_cluster(tmp_path, [{"name": "d", "profile":
                                                                             write_profile(tmp_path, "p")}])))
    moved = emb.input_bytes + emb.output_bytes + emb.read_param_bytes
    assert cost.layer_ms[0, 0] == pytest.approx(len(emb.op_types) * 10.0 / 1000 + moved / (FAST["memory_gbps"] * 1e6))


# --------------------------------------------------------------------------------------------------
# 3. tile efficiency


CONV_E = 4 * 12 * 12  # conv_chain_model(channels=4, size=12): every conv layer's output elements
CURVE = [[CONV_E / 4, 0.5], [CONV_E, 1.0]]


def chain_cost(tmp_path, **figures):
    ing = load_model(save(conv_chain_model(n=3, channels=4, size=12), tmp_path / "chain.onnx"))
    plain = write_profile(tmp_path, "plain")
    curved = write_profile(tmp_path, "curved", **figures)
    path = write_cluster(tmp_path, [{"name": "p", "profile": plain}, {"name": "c", "profile": curved}])
    return ing, build_cost_table(ing.graph, load_cluster(path), ing.sha256)


def test_efficiency_is_piecewise_linear_in_log_elements_and_clamped():
    curve = ((100.0, 0.5), (10000.0, 1.0))
    assert float(efficiency(curve, 1000.0)) == pytest.approx(0.75, rel=1e-12)  # halfway in log
    assert float(efficiency(curve, 10.0)) == 0.5 and float(efficiency(curve, 1e6)) == 1.0
    assert efficiency(((5.0, 0.8),), np.array([1.0, 5.0, 50.0])).tolist() == [0.8, 0.8, 0.8]


def test_efficiency_curves_raise_small_tiles_cost(tmp_path):
    ing, cost = chain_cost(tmp_path, efficiency={"conv": CURVE})
    g = ing.graph
    L, oh = float(cost.layer_ms[0, 1]), float(cost.overhead_ms[0, 1])
    assert cost.layer_ms[0, 1] == cost.layer_ms[0, 0]  # the curve leaves whole layers alone
    assert tile_ms(g, cost, 0, 1, 12, 12) == L  # a whole-layer tile costs exactly layer_ms
    # half the rows: 288 elements, halfway (in log) between 144 (0.5) and 576 (1.0), so 0.75 of peak
    assert tile_ms(g, cost, 0, 1, 6, 12) == pytest.approx(oh + (L - oh) * 0.5 / 0.75, rel=1e-12)
    # 2 rows: 96 elements, below the curve: its first fraction, 0.5, so twice the linear share
    assert tile_ms(g, cost, 0, 1, 2, 12) == pytest.approx(oh + (L - oh) * (2 / 12) * 2.0, rel=1e-12)
    # the device without a curve: linear in rows, as before
    L0, oh0 = float(cost.layer_ms[0, 0]), float(cost.overhead_ms[0, 0])
    assert tile_ms(g, cost, 0, 0, 6, 12) == oh0 + (L0 - oh0) * 6 / 12
    # a gemm curve does not touch conv layers
    (tmp_path / "g").mkdir()
    ing2, gemm_only = chain_cost(tmp_path / "g", efficiency={"gemm": CURVE})
    assert tile_ms(ing2.graph, gemm_only, 0, 1, 6, 12) == tile_ms(ing2.graph, gemm_only, 0, 0, 6, 12)


POSITIONS_CURVE = [[36, 0.5], [576, 1.0]]  # by output positions: the chain's layers have 12 x 12 = 144


def test_a_conv_positions_curve_prices_whole_layers_and_tiles_by_positions(tmp_path):
    """conv_positions counts a layer's height x width, not its elements, and prices whole conv layers too; it
    takes precedence over a `conv` curve by elements, which a device without it keeps using for its tiles."""
    ing = load_model(save(conv_chain_model(n=3, channels=4, size=12), tmp_path / "chain.onnx"))
    g = ing.graph
    fast = {"memory_gbps": 1e5}  # compute-bound, so that the rate decides the whole layer
    plain = write_profile(tmp_path, "plain", **fast, efficiency={"conv": CURVE})
    curved = write_profile(tmp_path, "curved", **fast, efficiency={"conv": CURVE, "conv_positions": POSITIONS_CURVE})
    path = write_cluster(tmp_path, [{"name": "p", "profile": plain}, {"name": "c", "profile": curved}])
    cost = build_cost_table(g, load_cluster(path), ing.sha256)
    assert cost.out_positions[:3].tolist() == [144.0] * 3 and cost.out_elems[0] == CONV_E  # the three convs
    layer = g.layers[0]
    oh = len(layer.op_types) * FAST["op_overhead_us"] / 1000
    compute = layer.flops / (FAST["gflops"]["conv"] * 1e6)
    assert cost.layer_ms[0, 0] == pytest.approx(oh + compute, rel=1e-12)  # a curve by elements: whole layers alone
    # 144 positions lie halfway (in log) between 36 (0.5) and 576 (1.0): the whole layer runs at 0.75
    assert cost.layer_ms[0, 1] == pytest.approx(oh + compute / 0.75, rel=1e-12)
    L, toh = float(cost.layer_ms[0, 1]), float(cost.overhead_ms[0, 1])
    assert tile_ms(g, cost, 0, 1, 12, 12) == L
    # half the rows: 72 positions, a quarter of the way in log: 0.625, against the whole layer's 0.75
    assert tile_ms(g, cost, 0, 1, 6, 12) == pytest.approx(toh + (L - toh) * 0.5 * 0.75 / 0.625, rel=1e-12)
    # the device with the curve by elements only: 288 elements, 0.75 of peak, as before
    L0, oh0 = float(cost.layer_ms[0, 0]), float(cost.overhead_ms[0, 0])
    assert tile_ms(g, cost, 0, 0, 6, 12) == pytest.approx(oh0 + (L0 - oh0) * 0.5 / 0.75, rel=1e-12)


def test_layer_out_positions_of_a_map_and_of_a_matrix(tmp_path):
    """An NCHW output's positions are its height x width; an output of rank 2 has no map: its elements."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 6))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (3, 8))], [w])
    mm = load_model(save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "mm.onnx"))
    assert [layer_out_positions(mm.graph, layer) for layer in mm.graph.layers] == [24]
    chain = load_model(save(conv_chain_model(n=2, channels=4, size=12), tmp_path / "chain.onnx"))
    assert [layer_out_positions(chain.graph, layer) for layer in chain.graph.layers][:2] == [144, 144]


def depthwise_model(channels: int = 4, size: int = 12) -> onnx.ModelProto:
    """Depthwise 3x3 Conv + Relu, then a full 3x3 Conv + Relu, random weights."""
    rng = np.random.default_rng(3)
    c = channels
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (c, 1, 3, 3)).astype(np.float32), "wd"),
             numpy_helper.from_array(rng.normal(0, 0.3, (c, c, 3, 3)).astype(np.float32), "wf")]
    nodes = [helper.make_node("Conv", ["x", "wd"], ["d"], pads=[1, 1, 1, 1], group=c, name="dw"),
             helper.make_node("Relu", ["d"], ["dr"], name="dw_relu"),
             helper.make_node("Conv", ["dr", "wf"], ["f"], pads=[1, 1, 1, 1], name="full"),
             helper.make_node("Relu", ["f"], ["y"], name="full_relu")]
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, size, size])  # noqa: E731
    model = helper.make_model(helper.make_graph(nodes, "dw", [vi("x")], [vi("y")], initializer=inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


DW_CURVE = [[CONV_E / 4, 0.25], [CONV_E, 1.0]]  # steeper than CURVE, as a depthwise conv's is


@pytest.mark.parametrize("curves, dw_frac, conv_frac", [
    ({"conv": CURVE, "depthwise_conv": DW_CURVE}, 0.625, 0.75),  # each class its own curve
    ({"conv": CURVE}, 0.75, 0.75),  # a profile written before the depthwise curve: the conv curve, as before
    ({"depthwise_conv": DW_CURVE}, 0.625, 1.0),  # the conv layer has no curve of its own: linear
])
def test_a_depthwise_conv_tile_follows_its_own_curve(tmp_path, curves, dw_frac, conv_frac):
    ing = load_model(save(depthwise_model(), tmp_path / "dw.onnx"))
    g = ing.graph
    assert [layer.cost_class for layer in g.layers] == ["depthwise_conv", "conv"]
    prof = write_profile(tmp_path, "curved", efficiency=curves)
    cost = build_cost_table(g, load_cluster(write_cluster(tmp_path, [{"name": "d", "profile": prof}])), ing.sha256)
    for i, frac in ((0, dw_frac), (1, conv_frac)):
        L, oh = float(cost.layer_ms[i, 0]), float(cost.overhead_ms[i, 0])
        assert tile_ms(g, cost, i, 0, 12, 12) == L  # a whole-layer tile costs exactly layer_ms, curve or not
        # half the rows: 288 elements, halfway in log between the curve's points
        assert tile_ms(g, cost, i, 0, 6, 12) == pytest.approx(oh + (L - oh) * 0.5 / frac, rel=1e-12)


def test_a_tiles_priced_share_is_not_scaled(tmp_path):
    ing = load_model(save(priced_model(), tmp_path / "m.onnx"))
    curve = [[4 * 8 * 8 / 4, 0.5], [4 * 8 * 8, 1.0]]
    prof = write_profile(tmp_path, "both", op_ms_per_melem={"LRN": 25.0}, efficiency={"conv": curve})
    cost = build_cost_table(ing.graph, load_cluster(write_cluster(tmp_path, [{"name": "d", "profile": prof}])), ing.sha256)
    L, oh, p = float(cost.layer_ms[0, 0]), float(cost.overhead_ms[0, 0]), float(cost.priced_ms[0, 0])
    assert p == 4 * 8 * 8 * 25.0 / 1e6
    assert tile_ms(ing.graph, cost, 0, 0, 4, 8) == pytest.approx(oh + ((L - oh - p) / 0.75 + p) * 0.5, rel=1e-12)


# A slow conv with little overhead, whose one-row tiles (32 elements) run at 5% of peak and two-row tiles at
# 60%: a one-row tile costs more than a two-row one.
STEEP = {"op_overhead_us": 0.1, "gflops": {**FAST["gflops"], "conv": 0.5},
         "efficiency": {"conv": [[32, 0.05], [64, 0.6], [256, 1.0]]}}


def test_segment_cost_follows_the_tile_model_and_its_floor_bounds_every_tile(tmp_path):
    ing, cost = chain_cost(tmp_path, efficiency={"conv": CURVE})
    g = ing.graph
    sc = SegmentCost.build(g, cost, 0, 3, 2)
    assert sc.table(0) is None and sc.table(1) is not None  # linear where there is no curve
    for d in range(2):
        assert math.isclose(sc.comp(d, 0, 12), cost.layer_ms[:3, d].sum(), rel_tol=1e-12)
        for a, b in [(0, 6), (3, 5), (11, 12)]:
            want = sum(tile_ms(g, cost, i, d, int(sc.maps.layer_rows(i, a, b)), 12) for i in range(3))
            assert math.isclose(sc.comp(d, a, b), want, rel_tol=1e-12)
    assert sc.comp(1, 0, 6) > sc.comp(0, 0, 6)  # the curve prices a half tile above its linear share


def test_need_floor_is_the_fewest_input_rows_of_any_tile_of_r_rows(tmp_path):
    """need_floor (numpy per r: the Python double loop took minutes on a 20,000-row map) against the
    definition, on a stride-2 chain whose tiles at the edges read fewer rows (the padding)."""
    m = conv_chain_model(n=2, channels=4, size=16)
    m.graph.node[2].attribute.append(helper.make_attribute("strides", [2, 2]))
    m.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 10
    fw = next(i for i in m.graph.initializer if i.name == "fw")
    fw.CopyFrom(numpy_helper.from_array(np.zeros((4 * 8 * 8, 10), np.float32), "fw"))
    ing = load_model(save(m, tmp_path / "m.onnx"))
    path = write_cluster(tmp_path, [{"name": "s", "profile": write_profile(tmp_path, "fast", **FAST)}])
    cost = build_cost_table(ing.graph, load_cluster(path), ing.sha256)
    sc = SegmentCost.build(ing.graph, cost, 0, 2, 2)  # the two conv layers
    rows = sc.rows
    assert rows == 8  # the stride-2 conv's output rows
    need = sc.need_floor()
    assert need[0] == 0 and len(need) == rows + 1
    for r in range(1, rows + 1):
        assert need[r] == min(sc.need(a, a + r)[1] - sc.need(a, a + r)[0] for a in range(rows + 1 - r))
    assert need[1] < need[2] < need[rows] == 16


def test_the_floor_bounds_tiles_whose_time_falls_with_more_rows(tmp_path):
    ing = load_model(save(conv_chain_model(n=3, channels=4, size=8), tmp_path / "m.onnx"))
    path = write_cluster(tmp_path, [{"name": "s", "profile": write_profile(tmp_path, "steep", **STEEP)}])
    cost = build_cost_table(ing.graph, load_cluster(path), ing.sha256)
    for hi in (1, 3):
        sc = SegmentCost.build(ing.graph, cost, 0, hi, 2)
        m = sc.rows
        if hi == 1:
            assert sc.comp(0, 0, 1) > sc.comp(0, 0, 2)  # the case a running maximum would get wrong
        floor = sc.floor(0)
        assert floor == sorted(floor)  # the search bisects it
        for r in range(1, m + 1):
            least = min(sc.comp(0, a, b) for a in range(m + 1) for b in range(a + r, m + 1))
            assert floor[r] == pytest.approx(least, rel=1e-12)


@pytest.mark.parametrize("medium,mbps,threshold", [("switched", 100.0, 0.6), ("shared", 10.0, 0.3), ("switched", 1000.0, 0.6)])
def test_pruned_search_equals_exhaustive_with_efficiency_curves(tmp_path, medium, mbps, threshold):
    """The search's bounds stay lower bounds when a tile's time is no longer linear in its rows."""
    ing = load_model(save(conv_chain_model(n=3, channels=4, size=8), tmp_path / "m.onnx"))
    steep = write_profile(tmp_path, "steep", **STEEP)
    plain = write_profile(tmp_path, "plain", op_overhead_us=0.1, gflops={**FAST["gflops"], "conv": 0.5})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"devices": [{"name": "a", "profile": steep}, {"name": "b", "profile": plain},
                                                {"name": "c", "profile": steep}],
                                    "network": {"bandwidth_mbps": mbps, "latency_ms": 0.2, "medium": medium}}))
    cost = build_cost_table(ing.graph, load_cluster(path), ing.sha256)
    cuts = spatial_cuts(ing.graph, 2)
    rest = [float(cost.layer_ms[c:, 0].sum()) for c in cuts]

    def search():
        return SpatialSearch(ing.graph, cost, 2, list(cost.devices), cuts, rest, threshold, None)

    want, _ = search().exhaustive()
    got = min(t for t, _ in search().run(beam=None, branch=None).values())
    assert math.isclose(got, want, rel_tol=1e-9)


def test_a_spatial_plans_prediction_uses_the_curve(tmp_path):
    """Compiled end to end: the plan is predicted with the curve, and the same plan costs more with the
    curve than without (its tiles are partial)."""
    from edgec.compiler.driver import compile_model

    model = save(conv_chain_model(n=3, channels=8, size=32), tmp_path / "m.onnx")
    e = 8 * 32 * 32
    curved = write_profile(tmp_path, "curved", efficiency={"conv": [[e / 8, 0.25], [e, 1.0]]})
    plain = write_profile(tmp_path, "plain")
    devices = lambda prof: [{"name": "a", "profile": prof}, {"name": "b", "profile": prof}]  # noqa: E731
    res = compile_model(model, write_cluster(tmp_path, devices(curved)), tmp_path / "out", strategy="spatial")
    plan, graph = res.chosen.plan, res.ingested.graph
    assert any(s.spatial is not None for s in plan.stages)
    with_curve = evaluate(plan, graph, res.cost)
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert doc["predicted"]["latency_ms"] == round(with_curve.latency_ms, 4)
    linear = evaluate(plan, graph, build_cost_table(graph, load_cluster(write_cluster(tmp_path, devices(plain), "c_plain.yaml"))))
    assert with_curve.latency_ms > linear.latency_ms
    assert all(with_curve.tile_ms[k] > linear.tile_ms[k] for k in with_curve.tile_ms)
