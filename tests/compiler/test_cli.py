"""CLI contract: bad input is one line + exit 2 with nothing written; --json is one object; outputs are
deterministic; an existing folder that is not an edgec build is never overwritten."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgec import models

ROOT = Path(__file__).resolve().parents[2]
TWO = ROOT / "tests/e2e/clusters/two.yaml"


def edgec(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "edgec.compiler", *map(str, args)], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def tree_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_compile_json_and_determinism(tmp_path):
    model = models.ensure("tinyconv")
    a = edgec("compile", model, "--devices", TWO, "-o", tmp_path / "a", "--objective", "throughput", "--json")
    assert a.returncode == 0, a.stderr
    s = json.loads(a.stdout)
    for key in ("strategy", "predicted_latency_ms", "predicted_throughput_ips", "bytes_transferred",
                "compile_seconds", "devices", "stages", "candidates"):
        assert key in s
    assert {d["name"] for d in s["devices"]} == {"pi5-a", "pi4-a"}
    assert all({"name", "fragments", "memory_mb", "predicted_busy_ms"} <= set(d) for d in s["devices"])
    b = edgec("compile", model, "--devices", TWO, "-o", tmp_path / "b", "--objective", "throughput", "--json")
    assert b.returncode == 0, b.stderr
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    # recompiling into an earlier build replaces it
    c = edgec("compile", model, "--devices", TWO, "-o", tmp_path / "a", "--strategy", "single")
    assert c.returncode == 0 and "single" in c.stdout
    assert len(json.loads((tmp_path / "a/manifest.json").read_text())["fragments"]) == 1


def test_simulate_and_inspect(tmp_path):
    model = models.ensure("tinychain")
    four = ROOT / "tests/e2e/clusters/four.yaml"
    s = json.loads(edgec("compile", model, "--devices", four, "-o", tmp_path / "o", "--strategy", "even", "--json").stdout)
    sim = json.loads(edgec("simulate", tmp_path / "o/manifest.json", "--json").stdout)
    assert sim["latency_ms"] == pytest.approx(s["predicted_latency_ms"], abs=1e-3)
    assert sim["bytes_transferred"] == s["bytes_transferred"] > 0
    assert len([e for e in sim["timeline"] if e["kind"] == "compute"]) == len(s["stages"]) == 4
    ins = json.loads(edgec("inspect", model, "--devices", four, "--json").stdout)
    assert len(ins["layers"]) == s["layers"]
    assert set(ins["layers"][0]["ms"]) == {"pi4-a", "pi5-a", "pi4-b", "pi5-b"}
    assert ins["layers"][0]["ms"]["pi5-a"] < ins["layers"][0]["ms"]["pi4-a"]
    assert "conv" in edgec("inspect", model).stdout


def test_inspect_manifest_shows_tiles_and_exchanges(tmp_path):
    """A layer-by-layer spatial plan (edgeflow) has a scatter, halo exchanges and a gather: inspect on
    the manifest lists every tile with its fragment and every exchange with its region and bytes."""
    model = models.ensure("tinychain")
    s = json.loads(edgec("compile", model, "--devices", TWO, "-o", tmp_path / "o", "--strategy", "edgeflow", "--json").stdout)
    manifest = tmp_path / "o/manifest.json"
    ins = json.loads(edgec("inspect", manifest, "--json").stdout)
    assert ins["strategy"] == "edgeflow" and ins["stages"] == s["stages"]
    tiled = [(i, g) for i, st in enumerate(s["stages"]) if st["spatial"] for g in st["spatial"]["segments"]]
    assert len(ins["tiles"]) == sum(len(g["tiles"]) for _, g in tiled) > 2
    data = json.loads(manifest.read_text())
    frags = {f["id"]: f for f in data["fragments"]}
    for t in ins["tiles"]:
        f = frags[t["fragment"]]  # every tile names the fragment that computes it, on its device
        assert f["device"] == t["device"] and f["outputs"][0].endswith(f"@{t['device']}[{t['rows'][0]}:{t['rows'][1]}]")
    kinds = {e["kind"] for e in ins["exchanges"]}
    assert {"scatter", "halo", "gather"} <= kinds
    assert all(e["region"] is not None for e in ins["exchanges"] if e["kind"] in ("scatter", "halo"))
    assert sum(ins["bytes_by_kind"].values()) == s["bytes_transferred"]
    text = edgec("inspect", manifest).stdout
    assert "halo" in text and "f0s0t1" in text
    assert "--devices" in one_error_line(edgec("inspect", manifest, "--devices", TWO))


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("cluster,msg", [
    ("devices: [{name: a, profile: nope}]\n", "unknown profile"),
    ("devices: [{name: a, profile: rpi4}, {name: a, profile: rpi4}]\n", "duplicate"),
    ("devices: [{name: a, profile: rpi4}]\nnetwork: {bandwidth_mbps: -5, latency_ms: 1}\n", "bandwidth"),
    ("devices: [{name: a, profile: rpi4, colour: red}]\n", "colour"),
    ("devices: [{name: a, profile: rpi4, memory_mb: 1}, {name: b, profile: rpi4, memory_mb: 1}]\n", "MB"),
    ("devices: [\n", "YAML"),
])
def test_bad_cluster(tmp_path, cluster, msg):
    if "network" not in cluster and not cluster.endswith("[\n"):
        cluster += "network: {bandwidth_mbps: 100, latency_ms: 1}\n"
    path = write(tmp_path / "c.yaml", cluster)
    line = one_error_line(edgec("compile", models.ensure("tinychain"), "--devices", path, "-o", tmp_path / "out"))
    assert "c.yaml" in line and msg in line
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]  # no temporary folder left behind


@pytest.mark.parametrize("strategy", ["auto", "single", "even", "spatial", "edgeflow"])
def test_plan_over_a_device_memory_is_refused_naming_the_device(tmp_path, strategy):
    """A plan needs more than the devices hold (tinychain's 0.25 MB of weights; 106.9 MB x 0.75 less rpi4's
    80 MB runtime overhead is 0.175 MB usable): refused at compile, one line naming the device."""
    path = write(tmp_path / "c.yaml", "devices: [{name: small-a, profile: rpi4, memory_mb: 106.8},\n"
                                      "          {name: small-b, profile: rpi4, memory_mb: 106.9}]\n"
                                      "network: {bandwidth_mbps: 100, latency_ms: 1}\n")
    line = one_error_line(edgec("compile", models.ensure("tinychain"), "--devices", path, "-o", tmp_path / "out",
                                "--strategy", strategy))
    assert "c.yaml" in line and re.search(r"\bsmall-[ab]\b", line) and "MB" in line, line
    assert not (tmp_path / "out").exists()


def test_bad_model_files(tmp_path):
    line = one_error_line(edgec("compile", tmp_path / "missing.onnx", "--devices", TWO, "-o", tmp_path / "o"))
    assert "missing.onnx" in line and "no such" in line
    bad = write(tmp_path / "bad.onnx", "garbage")
    assert "bad.onnx" in one_error_line(edgec("compile", bad, "--devices", TWO, "-o", tmp_path / "o"))
    assert "bad.onnx" in one_error_line(edgec("inspect", bad))
    assert not (tmp_path / "o").exists()


def test_refuses_to_overwrite_user_data(tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.txt").write_text("do not lose me")
    line = one_error_line(edgec("compile", models.ensure("tinychain"), "--devices", TWO, "-o", out))
    assert "refusing" in line
    assert (out / "thesis.txt").read_text() == "do not lose me"


def test_bad_manifest_for_simulate(tmp_path):
    assert "no such" in one_error_line(edgec("simulate", tmp_path / "nope.json"))
    assert "not an edgec manifest" in one_error_line(edgec("simulate", write(tmp_path / "m.json", "{}")))


def test_tampered_fragment_is_refused_by_run(tmp_path):
    edgec("compile", models.ensure("tinychain"), "--devices", TWO, "-o", tmp_path / "o", "--strategy", "even")
    frag = sorted((tmp_path / "o").glob("*.onnx"))[0]
    frag.write_bytes(frag.read_bytes() + b"\0")
    line = one_error_line(edgec("run", tmp_path / "o/manifest.json", "--random-inputs"))
    assert frag.name in line and "sha256" in line


def test_search_processes_do_not_change_the_output(tmp_path):
    model, four = models.ensure("squeezenet"), ROOT / "tests/e2e/clusters/four.yaml"
    outs = []
    for jobs in ("1", "2"):
        proc = edgec("compile", model, "--devices", four, "-o", tmp_path / jobs, "--jobs", jobs, "--json")
        assert proc.returncode == 0, proc.stderr
        outs.append(json.loads(proc.stdout)["candidates"])
    assert tree_digest(tmp_path / "1") == tree_digest(tmp_path / "2")
    assert outs[0] == outs[1] and any(c["strategy"] == "hybrid" and c["feasible"] for c in outs[0])
    assert "--jobs" in one_error_line(edgec("compile", model, "--devices", four, "-o", tmp_path / "x", "--jobs", "0"))
