"""Every tile of a spatial stage is one fragment run, and pays the device's `runtime.run_ms` (what a fragment
run in a plan takes beyond the profile's hot timings): in predict_stage, in the tile fragments' predicted_ms
(which simulate replays), and in the spatial search's step model, added after the assembly copy in both.
A pipeline stage is not charged it."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from edgec.compiler.cli import cli
from edgec.compiler.cluster import ClusterModel, DeviceSpec, load_profile, validate_profile_dict
from edgec.compiler.cluster.profile import profile_path
from edgec.compiler.errors import UserError
from edgec.compiler.cost import build_cost_table, evaluate, simulate_manifest
from edgec.compiler.cost.stage_timeline import predict_stage
from edgec.compiler.cost.tile_steps import StepModel
from edgec.compiler.cost.tiles import SegmentCost
from edgec.compiler.emit import assemble_manifest, build_fragments, write_output
from edgec.compiler.plan_types import Plan, Stage
from edgec.runtime.manifest.load import load_manifest
from tests.compiler.test_tile_copy import SIZE, chain, plan_of, rows_stage

RUN_MS = {"rpi5": 0.0625, "rpi4": 0.125}  # per device kind


def cluster(kinds, run_ms: dict[str, float]) -> ClusterModel:
    devs = []
    for i, k in enumerate(kinds):
        prof = load_profile(k)
        prof = dataclasses.replace(prof, runtime=dataclasses.replace(prof.runtime, run_ms=run_ms.get(k, 0.0)))
        devs.append(DeviceSpec(f"{k}-{i}", prof, prof.memory_mb, None))
    return ClusterModel(tuple(devs), 100.0, 0.2, "switched", {}, "test")


def test_every_tile_pays_its_devices_run_cost_and_the_fragments_carry_it(tmp_path):
    ing = chain(tmp_path)
    graph = ing.graph
    kinds = ("rpi5", "rpi4")
    free, charged = cluster(kinds, {}), cluster(kinds, RUN_MS)
    stage = rows_stage(graph, free.device_names, (8, 8, 3))
    plan = plan_of(graph, stage)
    before = predict_stage(stage, graph, build_cost_table(graph, free))
    cost = build_cost_table(graph, charged, ing.sha256)
    after = predict_stage(stage, graph, cost)
    assert cost.run_ms == (RUN_MS["rpi5"], RUN_MS["rpi4"])
    for (j, n), ms in after["tile_ms"].items():
        kind = stage.spatial.segments[j].tiles[n].device.split("-")[0]
        assert ms == before["tile_ms"][j, n] + RUN_MS[kind], (j, n)
    # each device runs three tiles one after another: its compute grows by three of its run costs
    for d, kind in zip(free.device_names, kinds):
        assert after["compute_ms"][d] == pytest.approx(before["compute_ms"][d] + 3 * RUN_MS[kind], rel=1e-12)
    assert after["latency_ms"] > before["latency_ms"]

    # the emitted tile fragments carry it, and simulate (which replays them) agrees with the prediction
    pred = evaluate(plan, graph, cost)
    frags = build_fragments(ing, plan, pred)
    manifest = assemble_manifest(ing, plan, pred, frags, charged.to_dict(), tmp_path / "out", {"strategy": "manual"})
    write_output(tmp_path / "out", manifest, frags)
    frag_ms = {f["id"]: f["predicted_ms"] for f in manifest["fragments"]}
    for (j, n), ms in after["tile_ms"].items():
        assert frag_ms[f"f0s{j}t{n}"] == round(ms, 4)
    sim = simulate_manifest(load_manifest(tmp_path / "out" / "manifest.json"))
    assert sim["latency_ms"] == pytest.approx(pred.latency_ms, rel=1e-4)


def test_the_step_model_charges_it_as_predict_stage(tmp_path):
    """The search's step model gives predict_stage's tile times bit for bit, copies and run costs included."""
    graph = chain(tmp_path).graph
    for kinds, splits in ((("rpi5", "rpi4"), (8, 8, 3)), (("rpi4", "rpi5"), (5, 11, 9))):
        cost = build_cost_table(graph, cluster(kinds, RUN_MS))
        stage = rows_stage(graph, list(cost.devices), splits)
        info = predict_stage(stage, graph, cost)
        model = StepModel(cost, [0, 1])
        holders = [(0, 0, SIZE)]
        for j, seg in enumerate(stage.spatial.segments):
            cx = model.context(SegmentCost.build(graph, cost, seg.lo, seg.hi, 2), holders)
            part = (0, splits[j], SIZE)
            for n in range(2):
                _, comp, _, _ = model.term(cx, n, part[n], part[n + 1], (0.0,) * len(holders), 0.0)
                assert comp == info["tile_ms"][j, n], (kinds, j, n)
            holders = [(0, 0, splits[j]), (1, splits[j], SIZE)]


def test_a_pipeline_stage_is_not_charged(tmp_path):
    graph = chain(tmp_path).graph
    whole = Plan("manual", "latency", (Stage("rpi5-0", 0, len(graph.layers)),)).ensures(graph)
    free = evaluate(whole, graph, build_cost_table(graph, cluster(("rpi5",), {})))
    charged = evaluate(whole, graph, build_cost_table(graph, cluster(("rpi5",), RUN_MS)))
    assert charged.latency_ms == free.latency_ms


def test_a_profile_reads_its_run_cost_and_refuses_a_negative_one():
    doc = {"name": "x", "memory_mb": 1024, "usable_memory_fraction": 0.8, "runtime_overhead_mb": 100,
           "op_overhead_us": 5, "gflops": {"conv": 10, "depthwise_conv": 5, "gemm": 10, "other": 2},
           "memory_gbps": 5, "runtime": {"message_ms": 0.2, "run_ms": 0.05}}
    assert validate_profile_dict(doc, "x.yaml").runtime.run_ms == 0.05
    assert validate_profile_dict({**doc, "runtime": {"message_ms": 0.2}}, "x.yaml").runtime.run_ms == 0.0
    with pytest.raises(UserError) as ei:
        validate_profile_dict({**doc, "runtime": {"run_ms": -1}}, "x.yaml")
    assert str(ei.value).startswith("x.yaml: ") and "run_ms" in str(ei.value) and "\n" not in str(ei.value)


MODELS = Path(os.environ["EDGEC_MODELS_DIR"])


def _profile_with_run_ms(tmp_path: Path, name: str, run_ms) -> Path:
    """The shipped profile `name` with runtime.run_ms set, as a file."""
    doc = yaml.safe_load(profile_path(name, None).read_text())
    doc.setdefault("runtime", {})["run_ms"] = run_ms
    path = tmp_path / f"{name}-run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _two_devices(tmp_path: Path, run_ms) -> Path:
    prof = _profile_with_run_ms(tmp_path, "rpi5", run_ms)
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({"devices": [{"name": "a", "profile": str(prof)}, {"name": "b", "profile": str(prof)}],
                                    "network": {"bandwidth_mbps": 1000, "latency_ms": 0.1, "medium": "switched"}}))
    return path


def test_a_spatial_plan_priced_with_it_runs_and_verifies(tmp_path):
    """End to end: a profile with run_ms, a spatial plan whose tile fragments carry it, `edgec run --verify`
    reproduces the whole model's outputs."""
    runner = CliRunner()
    model = MODELS / "tinyconv.onnx"
    out = tmp_path / "out"
    res = runner.invoke(cli, ["compile", str(model), "--devices", str(_two_devices(tmp_path, 0.25)), "-o", str(out),
                              "--strategy", "spatial", "--json"], prog_name="edgec")
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    tiles = [f for f in manifest["fragments"] if "t" in f["id"].split("s")[-1]]
    assert tiles and all(f["predicted_ms"] >= 0.25 for f in tiles)
    res = runner.invoke(cli, ["run", str(out / "manifest.json"), "--random-inputs", "--seed", "3", "--verify",
                              "--json"], prog_name="edgec")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["verify"]["passed"]


def test_a_negative_run_cost_is_one_line_exit_2_and_no_build(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["compile", str(MODELS / "tinyconv.onnx"), "--devices", str(_two_devices(tmp_path, -1)),
                                   "-o", str(out)], prog_name="edgec")
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and "rpi5-run.yaml" in res.stderr and "run_ms" in res.stderr
    assert "Traceback" not in res.output and not out.exists()
