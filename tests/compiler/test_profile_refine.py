"""`edgec profile --refine REPORT.json`: measured fragment times folded into a profile's per-node table, so
that a recompile predicts them; the choice of device and profile; tile fragments; bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx
import pytest
import yaml
from click.testing import CliRunner

import edgec
from edgec.compiler.cli import cli
from edgec.compiler.cluster import load_profile, profiles_dir
from edgec.runtime.manifest.load import load_manifest

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = REPO / "tests" / "e2e" / "clusters"


def _compile(out: Path, cluster: Path, model: str = "tinychain.onnx", **options) -> dict:
    edgec.compile(MODELS / model, cluster, out, **options)
    return json.loads((out / "manifest.json").read_text())


def _refine(*args: str):
    return CliRunner().invoke(cli, ["profile", "--refine", *args])


def _hand_report(build: Path, tmp: Path, measured: dict[str, float | None]) -> Path:
    """A report as `edgec run --report` writes it, with the given medians (no run: refine reads only these)."""
    m = json.loads((build / "manifest.json").read_text())
    report = {"manifest": str(build / "manifest.json"), "repeat": 5,
              "fragments": [{"id": f["id"], "device": f["device"], "predicted_ms": f["predicted_ms"],
                             "measured_ms": measured.get(f["id"]), "error": None} for f in m["fragments"]]}
    path = tmp / "report.json"
    path.write_text(json.dumps(report))
    return path


def _fragment_nodes(build: Path, frag: dict) -> list[str]:
    return [n.name for n in onnx.load(str(build / frag["file"]), load_external_data=False).graph.node]


def _cluster_with(tmp: Path, base: Path, profile: str, new: str) -> Path:
    data = yaml.safe_load(base.read_text())
    for d in data["devices"]:
        if d["profile"] == profile:
            d["profile"] = new
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pipeline") / "build"
    _compile(out, CLUSTERS / "four.yaml", strategy="pipeline", objective="throughput")
    return out


def test_refine_round_trip_predicts_the_measured_fragment_times(pipeline, tmp_path):
    """compile, run --report, refine, recompile: the recompiled fragments predict the measured medians."""
    edgec.run(pipeline, random_inputs=True, repeat=5, report=tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    measured = {f["id"]: f["measured_ms"] for f in report["fragments"]}
    res = _refine(str(tmp_path / "r.json"), "-o", str(tmp_path / "rpi5.yaml"))
    assert res.exit_code == 0, res.stderr
    assert "refined 18 of 18 node(s) of tinychain.onnx from pi5-a, pi5-b into profile rpi5" in res.stderr
    m = load_manifest(pipeline / "manifest.json")
    table = load_profile(str(tmp_path / "rpi5.yaml")).layers[m.model_sha256]
    old = json.loads((pipeline / "manifest.json").read_text())["fragments"]
    for frag in old:  # the table's sum over a fragment is its measured median
        assert sum(table[n] for n in _fragment_nodes(pipeline, frag)) == pytest.approx(measured[frag["id"]], abs=1e-4)
    cluster = _cluster_with(tmp_path, CLUSTERS / "four.yaml", "rpi5", str(tmp_path / "rpi5.yaml"))
    new = _compile(tmp_path / "again", cluster, strategy="pipeline", objective="throughput")
    by_nodes = {tuple(_fragment_nodes(pipeline, f)): measured[f["id"]] for f in old}
    for frag in new["fragments"]:  # the same fragment (same nodes) predicts its measured time; any other the sum
        nodes = _fragment_nodes(tmp_path / "again", frag)
        want = by_nodes.get(tuple(nodes), sum(table[n] for n in nodes))
        assert frag["predicted_ms"] == pytest.approx(want, abs=2e-4)
    assert sum(f["predicted_ms"] for f in new["fragments"]) == pytest.approx(sum(measured.values()), abs=4e-4)


def test_the_table_goes_where_the_devices_thread_count_reads_it(tmp_path):
    prof = yaml.safe_load((profiles_dir() / "rpi5.yaml").read_text())
    figures = {k: prof[k] for k in ("op_overhead_us", "gflops", "memory_gbps")}
    prof["threads"] = {1: dict(figures), 4: dict(figures)}
    (tmp_path / "p1.yaml").write_text(yaml.safe_dump(prof))
    cluster = tmp_path / "one.yaml"
    cluster.write_text(yaml.safe_dump({"devices": [{"name": "solo", "profile": "p1.yaml", "threads": 2}]}))
    build = tmp_path / "build"
    m = _compile(build, cluster, strategy="single")
    report = _hand_report(build, tmp_path, {"f0": 1.25})
    res = _refine(str(report), "-o", str(tmp_path / "p1r.yaml"), "--profile", str(tmp_path / "p1.yaml"))
    assert res.exit_code == 0, res.stderr
    assert "(threads 1)" in res.stderr  # 2 threads: the largest measured count below, as Profile.figures picks
    refined = load_profile(str(tmp_path / "p1r.yaml"))
    assert m["model"]["sha256"] in refined.threads[1].layers
    assert not refined.layers and not refined.threads[4].layers
    (tmp_path / "p1.yaml").write_text((tmp_path / "p1r.yaml").read_text())
    again = _compile(tmp_path / "again", cluster, strategy="single")
    assert again["fragments"][0]["predicted_ms"] == pytest.approx(1.25, abs=1e-4)


def test_devices_with_different_profiles_need_device(tmp_path):
    build = tmp_path / "build"
    _compile(build, CLUSTERS / "two.yaml", strategy="even")
    report = _hand_report(build, tmp_path, {"f0": 0.5, "f1": 0.7})
    res = _refine(str(report), "-o", str(tmp_path / "out.yaml"))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "choose one with --device: pi5-a (rpi5), pi4-a (rpi4)" in res.stderr
    assert not (tmp_path / "out.yaml").exists()
    res = _refine(str(report), "-o", str(tmp_path / "out.yaml"), "--device", "pi4-a")
    assert res.exit_code == 0, res.stderr
    assert "from pi4-a into profile rpi4" in res.stderr
    res = _refine(str(report), "-o", str(tmp_path / "out.yaml"), "--device", "pi4-b")
    assert res.exit_code == 2 and "--device pi4-b: no measured fragment ran on it (devices: pi5-a, pi4-a)" in res.stderr


def test_tile_fragments_are_skipped_with_a_note(tmp_path):
    build = tmp_path / "build"
    m = _compile(build, CLUSTERS / "two.yaml", model="tinyconv.onnx", strategy="spatial")
    tiles = [f["id"] for f in m["fragments"] if f["device"] == "pi4-a"]
    assert tiles and all("s" in t for t in tiles)
    report = _hand_report(build, tmp_path, {f["id"]: 0.3 for f in m["fragments"]})
    res = _refine(str(report), "-o", str(tmp_path / "out.yaml"), "--device", "pi4-a")
    assert res.exit_code == 2 and "no pipeline fragment of pi4-a was measured" in res.stderr
    assert f"fragment {tiles[0]} on pi4-a is a tile of a spatial stage (part of each node): skipped" in res.stderr
    res = _refine(str(report), "-o", str(tmp_path / "out.yaml"), "--device", "pi5-a")
    assert res.exit_code == 0, res.stderr
    assert "is a tile of a spatial stage" in res.stderr and load_profile(str(tmp_path / "out.yaml")).layers


@pytest.mark.parametrize("content, message", [
    (None, "report not found"),
    ("{", "not a JSON report"),
    ('{"manifest": "x"}', "not an `edgec run --report` file"),
    ('{"manifest": "x", "fragments": [{"id": "f0", "device": "a", "measured_ms": -1}]}', "not an `edgec run --report`"),
    ('{"manifest": "/no/such/manifest.json", "fragments": []}', "the report's manifest:"),
])
def test_bad_reports_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    res = _refine(str(path), "-o", str(tmp_path / "out.yaml"))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    assert res.stderr.startswith(f"edgec: {path}: ")
    assert not (tmp_path / "out.yaml").exists()


def test_refine_options_do_not_mix_with_measuring(pipeline, tmp_path):
    report = _hand_report(pipeline, tmp_path, {"f0": 0.2})
    res = _refine(str(report), "-o", str(tmp_path / "out.yaml"), "--quick")
    assert res.exit_code == 2 and "--quick measures this machine; --refine measures nothing" in res.stderr
    res = CliRunner().invoke(cli, ["profile", "-o", str(tmp_path / "out.yaml"), "--device", "pi5-a"])
    assert res.exit_code == 2 and "--device goes with --refine REPORT.json" in res.stderr
    res = _refine(str(report), "-o", str(tmp_path / "out.yaml"), "--profile", "no-such-profile")
    assert res.exit_code == 2 and "no-such-profile" in res.stderr
