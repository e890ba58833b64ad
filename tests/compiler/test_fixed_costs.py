"""The runtime's fixed costs (a profile's `runtime:`): priced per message and per request by the network model and
evaluate, carried in the manifest for simulate; and the throughput model of a spatial stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from edgec.compiler.cluster import load_cluster
from edgec.compiler.cluster.profile import profiles_dir
from edgec.compiler.cost import build_cost_table, evaluate, simulate_manifest
from edgec.compiler.ingest import load_model
from edgec.compiler.plan_types import Plan, Stage
from edgec.runtime.manifest.load import load_manifest
from tests.compiler.test_tiles import blocks_net, emit, plan_of, spatial_stage

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
A = {"message_ms": 0.4, "message_ms_per_mb": 2.0, "request_ms": 1.2}
B = {"message_ms": 0.2, "message_ms_per_mb": 0.0, "request_ms": 0.6}


def profile_with(tmp: Path, name: str, runtime: dict | None) -> str:
    doc = yaml.safe_load((profiles_dir() / "rpi5.yaml").read_text())
    doc["name"] = name
    if runtime is not None:
        doc["runtime"] = runtime
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def cluster_path(tmp: Path, runtimes: list[dict | None], medium: str = "switched", tag: str = "") -> Path:
    devices = [{"name": f"d{i}", "profile": profile_with(tmp, f"p{tag}{i}", rt)} for i, rt in enumerate(runtimes)]
    doc = {"devices": devices, "network": {"bandwidth_mbps": 100, "latency_ms": 0.5, "medium": medium}}
    path = tmp / f"cluster{tag}-{medium}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_message_costs_the_mean_of_both_ends_figures(tmp_path):
    graph = load_model(MODELS / "tinychain.onnx").graph
    plain = build_cost_table(graph, load_cluster(cluster_path(tmp_path, [None, None], tag="n")))
    priced = build_cost_table(graph, load_cluster(cluster_path(tmp_path, [A, B], tag="f")))
    extra = priced.transfer_ms(1_000_000, "d0", "d1") - plain.transfer_ms(1_000_000, "d0", "d1")
    assert extra == pytest.approx((0.4 + 0.2) / 2 + 1_000_000 * (2.0 + 0.0) / 2 / 1e6, rel=1e-12)
    assert priced.transfer_ms(1_000_000, "d1", "d0") == pytest.approx(priced.transfer_ms(1_000_000, "d0", "d1"))
    # the planners read the links' figures: the fixed part is in the latency, the per-byte part in the bandwidth
    net = priced.network
    assert net.latency_ms("d0", "d1") == pytest.approx(0.5 + 0.3)
    assert 1_000_000 / net.bytes_per_ms("d0", "d1") == pytest.approx(1_000_000 / 12_500 + 1.0)
    assert priced.transfer_ms(1_000_000, "d0", "d0") == 0.0


def test_a_profile_without_the_figures_prices_them_zero(tmp_path):
    cl = load_cluster(cluster_path(tmp_path, [None, None]))
    net = build_cost_table(load_model(MODELS / "tinychain.onnx").graph, cl).network
    assert (net.bytes_per_ms("d0", "d1"), net.latency_ms("d0", "d1")) == (100 * 125.0, 0.5)
    assert net.request_in_ms("d0") == net.request_out_ms("d0") == 0.0
    assert "costs" not in cl.to_dict()["network"]  # a manifest without them is what it always was


@pytest.mark.parametrize("two_stages", [False, True])
def test_a_request_costs_exactly_its_figure(tmp_path, two_stages):
    """Half of request_ms where the model's input comes in, half where its output goes out, each with the
    input's or output's bytes at the device's per-byte message cost (they travel the same transport): on one
    device the whole figure; over two, d0's input half and d1's output half; the message between them pays
    its fixed and per-byte cost."""
    graph = load_model(MODELS / "tinychain.onnx").graph
    n = len(graph.layers)
    in_mb, out_mb = (sum(graph.tensors[t].nbytes for t in names) / 1e6 for names in (graph.inputs, graph.outputs))
    stages = (Stage("d0", 0, n // 2), Stage("d1", n // 2, n)) if two_stages else (Stage("d0", 0, n),)
    plan = Plan("manual", "latency", stages).ensures(graph)
    plain = evaluate(plan, graph, build_cost_table(graph, load_cluster(cluster_path(tmp_path, [None, None], tag="n"))))
    priced = evaluate(plan, graph, build_cost_table(graph, load_cluster(cluster_path(tmp_path, [A, B], tag="f"))))
    if not two_stages:
        whole = 1.2 + (in_mb + out_mb) * 2.0
        assert priced.latency_ms - plain.latency_ms == pytest.approx(whole)
        # the coordinator is held for the hand-offs, the device for its compute alone (evaluate)
        assert priced.coordinator_ms == pytest.approx(whole) and plain.coordinator_ms == 0
        assert priced.period_ms == plain.period_ms
        assert priced.bottleneck_ms == pytest.approx(max(plain.bottleneck_ms, whole))
        return
    (tr,) = priced.transfers
    message = (0.4 + 0.2) / 2 + tr.nbytes * (2.0 + 0.0) / 2 / 1e6
    assert priced.latency_ms - plain.latency_ms == pytest.approx(0.6 + in_mb * 2.0 + message + 0.3)
    assert priced.period_ms == plain.period_ms
    assert priced.coordinator_ms == pytest.approx(0.6 + in_mb * 2.0 + 0.3)  # d1 prices bytes at 0


def test_a_spatial_stage_holds_its_device_from_scatter_to_gather(tmp_path):
    """Streaming through a spatial stage: its device runs one input's scatter .. gather before the next
    input's, so its period is the stage's whole span, not its compute (the old figure, which assumed it
    computes while it sends and waits)."""
    model = blocks_net(tmp_path / "m.onnx")
    _, _, pred, _, _ = emit(model, cluster_path(tmp_path, [None, None]),
                            lambda g: plan_of(g, spatial_stage(g, ["d0", "d1"], 2)), tmp_path / "o")
    spatial_ms = pred.stage_ms[0]
    assert pred.period_ms["d0"] >= spatial_ms > pred.busy_ms["d0"]  # compute alone is less than the span
    assert pred.period_ms["d1"] <= spatial_ms
    assert pred.bottleneck_ms >= pred.period_ms["d0"] > max(pred.busy_ms.values())
    assert pred.throughput_ips == pytest.approx(1000.0 / pred.bottleneck_ms)


@pytest.mark.parametrize("medium", ["switched", "shared"])
def test_simulate_replays_the_compiled_prediction_with_the_figures(tmp_path, medium):
    model = blocks_net(tmp_path / "m.onnx")
    _, _, pred, _, manifest = emit(model, cluster_path(tmp_path, [A, B, None], medium),
                                   lambda g: plan_of(g, spatial_stage(g, ["d0", "d1", "d2"], 2,
                                                                      rng=np.random.default_rng(1))), tmp_path / "o")
    assert manifest["network"]["costs"] == {"d0": A, "d1": B}
    m = load_manifest(tmp_path / "o/manifest.json")
    assert m.network.transfer_s("d0", "d1", 1000) * 1e3 == pytest.approx(
        build_cost_table(load_model(model).graph, load_cluster(cluster_path(tmp_path, [A, B, None], medium)))
        .transfer_ms(1000, "d0", "d1"))
    from edgec.runtime.manifest.load import manifest_json, parse_manifest
    assert parse_manifest(json.loads(manifest_json(m)), tmp_path / "o/manifest.json").network == m.network  # what workers receive
    sim = simulate_manifest(m)
    assert sim["latency_ms"] == pytest.approx(pred.latency_ms, rel=1e-4)  # fragment times are rounded to 4 places
    plain = emit(model, cluster_path(tmp_path, [None, None, None], medium, tag="n"),
                 lambda g: plan_of(g, spatial_stage(g, ["d0", "d1", "d2"], 2, rng=np.random.default_rng(1))),
                 tmp_path / "p")[2]
    assert pred.latency_ms > plain.latency_ms + 0.9  # every message and the request cost something


def test_manifest_costs_are_checked(tmp_path):
    import json

    from edgec.runtime.errors import InputError

    model = blocks_net(tmp_path / "m.onnx")
    emit(model, cluster_path(tmp_path, [A, B]), lambda g: plan_of(g, spatial_stage(g, ["d0", "d1"], 2)), tmp_path / "o")
    path = tmp_path / "o/manifest.json"
    doc = json.loads(path.read_text())
    doc["network"]["costs"]["d0"]["message_ms"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"network\.costs\.d0\.message_ms: expected a finite number >= 0"):
        load_manifest(path)


def test_a_bad_runtime_figure_is_one_line_and_exit_2(tmp_path):
    doc = yaml.safe_load((profiles_dir() / "rpi5.yaml").read_text())
    doc["runtime"] = {"message_ms": -0.5}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"devices": [{"name": "a", "profile": "bad.yaml"}]}))
    proc = subprocess.run([sys.executable, "-m", "edgec.compiler", "compile", str(MODELS / "tinychain.onnx"),
                           "--devices", str(tmp_path / "c.yaml"), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "runtime.message_ms" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
