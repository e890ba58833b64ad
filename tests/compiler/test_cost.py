"""Cost table: roofline estimates from profiles, measured per-node tables, the network model, the pipeline problem."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml

from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.ingest import load_model
from edgec.compiler.layers import build_layer_graph
from edgec.compiler.plan.pipeline_problem import pipeline_problem
from edgec.runtime.linkmodel import mbps_to_bytes_per_ms, message_ms
from edgec.compiler.profile import write_profile
from edgec.runtime.profile.measure import measure_host
from tests.compiler.profile_scripted import script_runtime_costs, script_timings
from tests.compiler.test_profile_stability import ScriptedProbe
from tests.conftest import conv_chain_model


def cluster_file(tmp_path, profiles):
    doc = {"devices": [{"name": f"d{i}", "profile": p} for i, p in enumerate(profiles)],
           "network": {"bandwidth_mbps": 80, "latency_ms": 2}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_cluster(path)


def test_network_model_converts_mbps_once(tmp_path):
    assert mbps_to_bytes_per_ms(8) == 1000.0  # 8 Mbit/s = 1 MB/s = 1000 bytes/ms
    assert message_ms(3000, mbps_to_bytes_per_ms(8), 0.5) == 3.5 and message_ms(0, 1000.0, 0.5) == 0.0
    doc = {"devices": [{"name": n, "profile": "rpi5"} for n in ("a", "b", "c")],
           "network": {"bandwidth_mbps": 80, "latency_ms": 2, "links": [{"a": "a", "b": "c", "bandwidth_mbps": 8}]}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    net = build_cost_table(conv_graph(), load_cluster(path)).network
    assert (net.bytes_per_ms("a", "b"), net.latency_ms("a", "b")) == (10_000.0, 2)
    assert net.bytes_per_ms("c", "a") == 1000.0  # the link override, either way round
    assert net.transfer_ms(3000, "a", "c") == 3000 / 1000.0 + 2
    assert net.transfer_ms(3000, "a", "a") == 0 and net.transfer_ms(0, "a", "b") == 0


def conv_graph():
    return build_layer_graph(onnx.shape_inference.infer_shapes(conv_chain_model(n=1)))


def test_roofline_scales_with_device_speed(chain_path, tmp_path):
    ing = load_model(chain_path)
    cost = build_cost_table(ing.graph, cluster_file(tmp_path, ["rpi4", "rpi5", "laptop"]), ing.sha256)
    assert cost.layer_ms.shape == (len(ing.graph.layers), 3)
    conv = cost.layer_ms[0]
    assert conv[0] > conv[1] > 0  # rpi4 slower than rpi5 (on a tiny conv the laptop's 50 us overhead dominates)
    assert cost.transfer_ms(10_000, "d0", "d1") == pytest.approx(10_000 / (80 * 125) + 2)
    assert cost.transfer_ms(10_000, "d0", "d0") == 0


def test_pipeline_problem_matches_graph(residual_path, tmp_path):
    ing = load_model(residual_path)
    cost = build_cost_table(ing.graph, cluster_file(tmp_path, ["rpi4", "rpi5"]), ing.sha256)
    prob = pipeline_problem(ing.graph, cost)
    assert prob.n_blocks == len(ing.graph.blocks) == 3
    np.testing.assert_allclose(prob.block_ms.sum(axis=0), cost.layer_ms.sum(axis=0))
    assert list(prob.cut_bytes) == [4 * 4 * 8 * 8, 4 * 4 * 8 * 8]
    assert prob.block_param_bytes.sum() == ing.graph.total_param_bytes


def test_measured_table_is_used_for_unnamed_nodes(tmp_path, monkeypatch):
    """`edgec profile --model` keys nodes exactly as ingest names them, even when the file's nodes are
    unnamed and constant nodes are folded away (indices shift).  The per-node table is onnxruntime's profiler's,
    run for real; the micro-benchmarks and runtime costs beside it are scripted (profile_scripted.py)."""
    script_timings(monkeypatch)
    script_runtime_costs(monkeypatch)
    m = conv_chain_model(n=3)
    const = onnx.helper.make_node("Constant", [], ["unused_shape"], value=onnx.numpy_helper.from_array(np.array([1], np.int64)))
    m.graph.node.insert(0, const)
    for n in m.graph.node:
        n.name = ""
    model = tmp_path / "unnamed.onnx"
    onnx.save(m, model)
    prof = measure_host(model_path=str(model), quick=True, probe=ScriptedProbe(0.0))
    write_profile(prof, tmp_path / "me.yaml")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"devices": [{"name": "me", "profile": "me.yaml"}],
                                                      "network": {"bandwidth_mbps": 100, "latency_ms": 1}}))
    ing = load_model(model)
    cost = build_cost_table(ing.graph, load_cluster(tmp_path / "c.yaml"), ing.sha256)
    assert cost.measured == (True,)
    table = prof["layers"][ing.sha256]
    assert cost.layer_ms[0, 0] == pytest.approx(sum(table[n] for n in ing.graph.layers[0].node_names))


@pytest.mark.parametrize("medium", ["switched", "shared"])
def test_simulated_events_name_what_they_occupy(tmp_path, medium):
    """Every timeline event names its resource, and a compute event its fragment, a transfer its tensor (the
    sender's name), src and dst, beside the keys it always had."""
    from edgec.compiler.cost import simulate_manifest
    from edgec.runtime.manifest.types import HOST, Send
    from edgec.runtime.manifest.load import load_manifest
    from tests.runtime.conftest import build_spatial

    case = build_spatial(tmp_path)
    case.manifest["network"]["medium"] = medium
    m = load_manifest(case.write())
    timeline = simulate_manifest(m)["timeline"]
    computes = [e for e in timeline if e["kind"] == "compute"]
    transfers = [e for e in timeline if e["kind"] == "transfer"]
    assert sorted(e["fragment"] for e in computes) == ["fb", "fc", "head"]
    for e in computes:
        assert e["what"] == e["fragment"] and e["resource"] == f"device:{e['device']}"
    sends = [(d, s.tensor, s.to) for d, steps in m.steps.items() for s in steps if isinstance(s, Send) and s.to != HOST]
    assert sorted((e["src"], e["tensor"], e["dst"]) for e in transfers) == sorted(sends)
    assert ("a", "x", "c") in sends  # sent as x_bot: the event names the sender's tensor
    for e in transfers:
        assert e["device"] == e["src"] and e["what"] == f"{e['tensor']} -> {e['dst']}"
        assert e["resource"] == ("channel" if medium == "shared" else f"uplink:{e['src']}")
    for e in timeline:
        assert {"device", "kind", "what", "start_ms", "end_ms", "resource"} <= set(e)
