"""Reports: compile's per-device memory (tile devices included), inspect's block cuts, manifest reading."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgec import models
from edgec.compiler import report
from edgec.compiler.driver import compile_model
from edgec.compiler.errors import UserError
from edgec.compiler.ingest import load_model
from edgec.compiler.cost.memory import device_memory_bytes
from edgec.compiler.plan.spatial import fits
from edgec.compiler.cost import simulate_manifest
from edgec.compiler.units import MiB
from edgec.runtime.manifest.load import load_manifest

ROOT = Path(__file__).resolve().parents[2]
FOUR = ROOT / "tests/e2e/clusters/four.yaml"


@pytest.fixture(scope="module")
def spatial_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("spatial")
    result = compile_model(models.ensure("tinyconv"), FOUR, out / "o", "spatial")
    return result, report.compile_summary(result, out / "o", 0.0)


def _limits(limits: dict[str, int]):
    """A stand-in for the cost table: fits() reads only each device's usable bytes from it."""
    return SimpleNamespace(cluster=SimpleNamespace(device=lambda d: SimpleNamespace(usable_bytes=limits[d])))


def test_tile_devices_report_their_memory(spatial_build):
    result, summary = spatial_build
    tile_only = {t.device for st in result.chosen.plan.stages if st.spatial for t in st.spatial.segments[0].tiles}
    tile_only -= {st.device for st in result.chosen.plan.stages}
    assert tile_only, "the spatial plan should put some device on tiles only"
    with_fragments = [d for d in summary["devices"] if d["fragments"]]
    assert {d["name"] for d in with_fragments} >= tile_only
    assert all(d["memory_mb"] > 0 for d in with_fragments)
    assert all(d["memory_mb"] == 0 for d in summary["devices"] if not d["fragments"])
    text = report.format_compile(summary)
    for d in with_fragments:
        row = next(line for line in text.splitlines() if line.startswith(d["name"] + " "))
        assert f"{d['memory_mb']:.3f}" in row


def test_memory_is_what_the_memory_check_counts(spatial_build):
    result, summary = spatial_build
    plan, graph = result.chosen.plan, result.ingested.graph
    need = device_memory_bytes(plan, graph)
    assert {d["name"]: d["memory_mb"] for d in summary["devices"]} == {
        d.name: round(need.get(d.name, 0) / MiB, 3) for d in result.cluster.devices}
    exact = {d.name: need.get(d.name, 0) for d in result.cluster.devices}
    assert fits(plan, graph, _limits(exact))
    for name in need:  # one byte less on any device that holds something, and the check refuses the plan
        assert not fits(plan, graph, _limits({**exact, name: exact[name] - 1})), name


def test_inspect_text_lists_block_cuts():
    ing = load_model(models.ensure("tinyconv"))
    s = report.inspect_summary(ing, None)
    cuts = list(ing.graph.block_cuts)
    assert cuts and s["block_cuts"] == cuts
    lines = report.format_inspect(s).splitlines()
    assert f"block cuts: {', '.join(map(str, cuts))} ({len(cuts) + 1} serial blocks)" in lines


def test_inspect_text_says_when_there_are_no_cuts():
    s = {"model": "m.onnx", "layers": [], "total_flops": 0, "total_param_bytes": 0, "block_cuts": []}
    assert "block cuts: none (1 serial blocks)" in report.format_inspect(s).splitlines()


@pytest.mark.parametrize("text,pattern", [
    ("[" * 20000 + "]" * 20000, r"JSON nested more than 64 levels deep"),
    ('{"format": "edgec.manifest", "x": ' + "{\"a\": " * 500 + "1" + "}" * 501, r"JSON nested more than 64 levels"),
    ('{"format": ', r"not valid JSON"),
    ('{"format": "other"}', r"not an edgec manifest"),
])
def test_load_manifest_json_errors_name_the_file(tmp_path, text, pattern):
    path = tmp_path / "manifest.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=pattern) as info:
        report.load_manifest_json(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_load_manifest_json_refuses_a_huge_file(tmp_path):
    path = tmp_path / "manifest.json"
    with open(path, "wb") as fh:
        fh.truncate(2 << 30)
    with pytest.raises(UserError, match=r"larger than 64 MiB"):
        report.load_manifest_json(path)


def test_one_device_without_network_compiles_and_loads(tmp_path):
    cluster = tmp_path / "one.yaml"
    cluster.write_text("devices:\n  - {name: solo, profile: rpi5}\n", encoding="utf-8")
    result = compile_model(models.ensure("tinychain"), cluster, tmp_path / "o")
    text = (tmp_path / "o/manifest.json").read_text(encoding="utf-8")
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert data["network"]["bandwidth_mbps"] is None and data["network"]["latency_ms"] is None
    manifest = load_manifest(tmp_path / "o/manifest.json")
    assert manifest.device_names == ("solo",)
    sim = simulate_manifest(manifest)
    assert sim["bytes_transferred"] == 0 and sim["latency_ms"] == pytest.approx(result.chosen.prediction.latency_ms, abs=1e-3)


def result_manifest(spatial_build) -> Path:
    return Path(spatial_build[1]["manifest"])


def test_the_plan_section_reads_as_the_plan_compiled(spatial_build):
    """The manifest's plan section is Plan.to_dict, read back by Plan.from_dict: the plan compiled."""
    result, _ = spatial_build
    doc = report.load_manifest_json(result_manifest(spatial_build))
    plan = report.read_plan(doc.plan, doc.manifest.path)
    assert plan == result.chosen.plan and any(s.spatial is not None for s in plan.stages)
    assert report.read_layer_names(doc.layers, plan, doc.manifest.path) == [l.name for l in result.ingested.graph.layers]


@pytest.mark.parametrize("damage, where, what", [
    (lambda p: p.update(strategy=1), "plan.strategy", "a string"),
    (lambda p: p.__setitem__("stages", {}), "plan.stages", "a list"),
    (lambda p: p["stages"][0].__setitem__("lo", "0"), "plan.stages[0].lo", "an integer"),
    (lambda p: p["stages"][0].__setitem__("spatial", 3), "plan.stages[0].spatial", "an object or null"),
    (lambda p: p["stages"][0]["spatial"].__setitem__("axis", "height"), "plan.stages[0].spatial.axis", "an integer"),
    (lambda p: p["stages"][0]["spatial"]["segments"][0]["tiles"][1].__setitem__("cols", [0, "2"]),
     "plan.stages[0].spatial.segments[0].tiles[1].cols", "[start, stop] integers or null"),
    (lambda p: p.__setitem__("modes", [["a"]]), "plan.modes[0]", "[device, mode] strings"),
])
def test_a_damaged_plan_section_is_one_line_naming_where(spatial_build, tmp_path, damage, where, what):
    """The runtime ignores the plan section, so inspect's reader is its only check."""
    data = json.loads(result_manifest(spatial_build).read_text(encoding="utf-8"))
    damage(data["plan"])
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    doc = report.load_manifest_json(path)  # simulate does not read the plan: the rest of the manifest is fine
    with pytest.raises(UserError) as info:
        report.plan_summary(doc)
    assert str(info.value) == f"{path}: not a valid edgec manifest: {where}: expected {what}"


def test_layer_names_that_do_not_cover_the_plan_are_one_line(spatial_build, tmp_path):
    data = json.loads(result_manifest(spatial_build).read_text(encoding="utf-8"))
    data["layers"] = data["layers"][:1]
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(UserError, match="layers: expected a list of the model's layer names"):
        report.plan_summary(report.load_manifest_json(path))
