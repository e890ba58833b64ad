"""`edgec compile --fallbacks`: the cluster planned again without each device the plan uses, written beside the
main build (OUTDIR/fallback-<device>/), named by the manifest, listed by --json and `edgec inspect`; rebuilt
byte for byte; the output-folder rule still holds; a device whose removal leaves no plan is reported."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgec
from edgec.compiler.cli import cli
from edgec.compiler.errors import UserError
from edgec.runtime.manifest.load import load_fallback, load_manifest

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
THREE = """devices:
  - {name: pi5-a, profile: rpi5}
  - {name: pi5-b, profile: rpi5}
  - {name: pi5-c, profile: rpi5}
network: {bandwidth_mbps: 1000, latency_ms: 0.2, medium: switched}
"""
# pi5-tiny has 0.1 MB to spare (106.8 MB x 0.75 - 80 MB of runtime), less than tinychain's weights.
WITH_A_TINY_DEVICE = """devices:
  - {name: pi5-a, profile: rpi5}
  - {name: pi5-tiny, profile: rpi5, memory_mb: 106.8}
network: {bandwidth_mbps: 100, latency_ms: 1, medium: switched}
"""


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "three.yaml"
    path.write_text(THREE)
    return path


def compile_with_fallbacks(cluster: Path, out: Path, **kwargs) -> dict:
    return edgec.compile(MODELS / "tinychain.onnx", cluster, out, strategy="pipeline", objective="throughput",
                         fallbacks=True, **kwargs)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_layout_manifest_entries_and_summary(three, tmp_path):
    out = tmp_path / "build"
    summary = compile_with_fallbacks(three, out)
    data = json.loads((out / "manifest.json").read_text())
    used = [d for d, steps in data["steps"].items() if steps]
    assert used == ["pi5-a", "pi5-b"]  # a two-stage pipeline; pi5-c is spare
    assert [f["without"] for f in data["fallbacks"]] == used
    expected = {"manifest.json", *(f["file"] for f in data["fragments"])}
    for entry in data["fallbacks"]:
        folder = f"fallback-{entry['without']}"
        assert entry["manifest"] == f"{folder}/manifest.json"
        text = (out / entry["manifest"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(text).hexdigest()
        sub = json.loads(text)
        assert entry["without"] not in [d["name"] for d in sub["devices"]]
        assert "fallbacks" not in sub  # one level: a fallback has no fallbacks of its own
        assert sub["model"]["path"] == os.path.relpath(MODELS / "tinychain.onnx", out / folder)
        expected |= {f"{folder}/manifest.json", *(f"{folder}/{f['file']}" for f in sub["fragments"])}
    assert set(snapshot(out)) == expected  # nothing else: every fallback is a complete build folder of its own

    main = load_manifest(out / "manifest.json")
    for fb in main.fallbacks:
        fallback = load_fallback(main, fb)  # sha256, inputs and outputs, devices and fragments all check out
        assert fb.without not in fallback.device_names
        assert [d for d in fallback.device_names if fallback.steps.get(d)] == \
            [d for d in ("pi5-a", "pi5-b", "pi5-c") if d != fb.without]

    listed = {f["without"]: f for f in summary["fallbacks"]}
    assert set(listed) == {"pi5-a", "pi5-b"}
    assert listed["pi5-b"]["manifest"] == str(out / "fallback-pi5-b" / "manifest.json")
    assert listed["pi5-b"]["devices"] == ["pi5-a", "pi5-c"] and listed["pi5-b"]["error"] is None
    assert listed["pi5-b"]["predicted_latency_ms"] > 0


def test_rebuild_is_byte_identical_and_replaces_only_the_build(three, tmp_path):
    out = tmp_path / "build"
    compile_with_fallbacks(three, out)
    first = snapshot(out)
    compile_with_fallbacks(three, out)  # over the earlier build, fallback folders included: allowed
    assert snapshot(out) == first
    compile_with_fallbacks(three, tmp_path / "elsewhere")
    assert snapshot(tmp_path / "elsewhere") == first

    (out / "fallback-pi5-b" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="'fallback-pi5-b/notes.txt' which is not part of the earlier edgec build"):
        compile_with_fallbacks(three, out)
    (out / "fallback-pi5-b" / "notes.txt").unlink()
    (out / "fallback-pi5-x").mkdir()  # a folder the manifest does not name is the user's
    with pytest.raises(UserError, match="'fallback-pi5-x'"):
        compile_with_fallbacks(three, out)
    (out / "fallback-pi5-x").rmdir()
    assert snapshot(out) == first  # the refused compiles changed nothing

    edgec.compile(MODELS / "tinychain.onnx", three, out, strategy="pipeline", objective="throughput")
    assert not [p for p in out.iterdir() if p.is_dir()]  # a rebuild without --fallbacks drops the old ones
    assert "fallbacks" not in json.loads((out / "manifest.json").read_text())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary or old folder left


def test_a_device_whose_removal_leaves_no_plan_is_reported_not_fatal(tmp_path):
    cluster = tmp_path / "tiny.yaml"
    cluster.write_text(WITH_A_TINY_DEVICE)
    out = tmp_path / "build"
    summary = edgec.compile(MODELS / "tinychain.onnx", cluster, out, strategy="auto", fallbacks=True)
    data = json.loads((out / "manifest.json").read_text())
    assert [d for d, steps in data["steps"].items() if steps] == ["pi5-a"]
    [entry] = data["fallbacks"]
    assert entry["without"] == "pi5-a" and entry["manifest"] is None and entry["sha256"] is None
    assert "to fit across the cluster" in entry["error"], entry["error"]
    assert summary["fallbacks"] == [{"without": "pi5-a", "manifest": None, "error": entry["error"]}]
    assert not [p for p in out.iterdir() if p.is_dir()]
    main = load_manifest(out / "manifest.json")  # the runtime reads the entry: no plan, and why
    assert main.fallback_for("pi5-a").manifest is None and main.fallback_for("pi5-a").error == entry["error"]


def test_cli_json_and_inspect_list_the_fallbacks(three, tmp_path):
    out = tmp_path / "build"
    runner = CliRunner()
    res = runner.invoke(cli, ["compile", str(MODELS / "tinychain.onnx"), "--devices", str(three), "-o", str(out),
                              "--strategy", "pipeline", "--objective", "throughput", "--fallbacks", "--json"])
    assert res.exit_code == 0, res.output
    assert [f["without"] for f in json.loads(res.stdout)["fallbacks"]] == ["pi5-a", "pi5-b"]

    res = runner.invoke(cli, ["inspect", str(out / "manifest.json"), "--json"])
    assert res.exit_code == 0, res.output
    listed = json.loads(res.stdout)["fallbacks"]
    assert [(f["without"], f["manifest"], f["devices"], f["error"]) for f in listed] == [
        ("pi5-a", "fallback-pi5-a/manifest.json", ["pi5-b", "pi5-c"], None),
        ("pi5-b", "fallback-pi5-b/manifest.json", ["pi5-a", "pi5-c"], None)]
    assert all(f["strategy"] == "pipeline" and f["predicted_latency_ms"] > 0 for f in listed)

    res = runner.invoke(cli, ["inspect", str(out / "manifest.json")])
    assert res.exit_code == 0 and "fallback plans" in res.stdout and "fallback-pi5-b/manifest.json" in res.stdout

    # a fallback changed after compiling is shown as broken (the runtime would refuse the build)
    changed = out / "fallback-pi5-a" / "manifest.json"
    changed.write_text(changed.read_text().replace('"latency_ms"', '"latency_ms" ', 1))
    res = runner.invoke(cli, ["inspect", str(out / "manifest.json"), "--json"])
    assert res.exit_code == 0, res.output
    broken = json.loads(res.stdout)["fallbacks"][0]
    assert "sha256 mismatch" in broken["error"] and "strategy" not in broken
