"""End-to-end runs of hand-built manifests through the CLI: success, verification, and every failure exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgec.runtime.front.cli import run
from tests.runtime.procs import local_workers

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: str):
    return CliRunner().invoke(run, [str(a) for a in args], catch_exceptions=False)


def workers_of(manifest: Path) -> list[int]:
    """Live local workers that runs in this process started: leftovers once a run has ended. (Local workers
    carry no manifest on their command line; `manifest` names the run for the reader.)"""
    return local_workers(os.getpid())


def assert_one_line_error(stderr: str, *needles: str) -> None:
    errors = [ln for ln in stderr.splitlines() if ln.startswith("edgec: ") and not ln.startswith("edgec: starting")]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("edgec: "), stderr
    assert "Traceback" not in stderr, stderr
    for needle in needles:
        assert needle in last, last
    assert errors, stderr


def test_chain_random_inputs_verify_json(chain):
    res = invoke(chain.path, "--random-inputs", "--seed", "3", "--verify", "--json", "--repeat", "3")
    assert res.exit_code == 0, res.stderr
    report = json.loads(res.stdout)
    assert set(report) == {"manifest", "latency_ms", "latencies_ms", "warmup", "throughput_ips", "inflight", "compress",
                           "outputs", "verify", "devices", "completed", "lost", "failovers", "adaptations", "emulation"}
    assert len(report["latencies_ms"]) == 3 and report["latency_ms"] > 0
    assert report["throughput_ips"] > 0 and report["inflight"] == 5  # two stages, their link, input and output
    assert report["completed"] == 3 and report["lost"] == 0 and report["failovers"] == []
    assert report["outputs"] == [{"name": "prob", "shape": [1, 10], "dtype": "float32"}]
    assert report["verify"]["passed"] is True and report["verify"]["worst_output"] == "prob"
    assert report["verify"]["tolerance"] == 1e-4
    assert report["verify"]["requests_checked"] == 4 and report["emulation"] is None  # the warm-up too
    assert set(report["devices"]) == {"pi5-a", "pi4-a"}
    assert all(d["fragments_run_ms"] > 0 and d["local"] and d["requests"] == 4 for d in report["devices"].values())
    assert report["warmup"] == 1
    assert not workers_of(chain.path)


def test_warmup_runs_untimed_requests_first(chain):
    """--warmup N: N requests run (and are verified) before the --repeat timed ones, which alone are timed."""
    res = invoke(chain.path, "--random-inputs", "--verify", "--json", "--repeat", "2", "--warmup", "3")
    assert res.exit_code == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["warmup"] == 3 and len(report["latencies_ms"]) == 2 and report["completed"] == 2
    assert report["verify"]["requests_checked"] == 5
    assert all(d["requests"] == 5 for d in report["devices"].values())
    assert "warm-up request 3/3" in res.stderr
    res = invoke(chain.path, "--random-inputs", "--json", "--warmup", "0")
    assert res.exit_code == 0, res.stderr
    assert all(d["requests"] == 1 for d in json.loads(res.stdout)["devices"].values())


@pytest.mark.parametrize("value", ["-1", "1001", "x"])
def test_bad_warmup_exits_2(chain, value):
    res = invoke(chain.path, "--random-inputs", "--warmup", value)
    assert res.exit_code == 2 and "--warmup" in res.stderr and "Traceback" not in res.stderr
    assert not workers_of(chain.path)


def test_warmup_of_the_api_is_checked(chain):
    from edgec.runtime.front.api import run as api_run
    from edgec.runtime.errors import InputError

    for bad in (-1, True, 1.5):
        with pytest.raises(InputError, match="warmup"):
            api_run(chain.path, random_inputs=True, warmup=bad)


def test_spatial_inputs_file_verify_and_output(spatial, tmp_path):
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 6)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    out = tmp_path / "sub" / "out.npz"
    out.parent.mkdir()
    res = invoke(spatial.folder, "--inputs", tmp_path / "in.npz", "--verify", "--output", out)
    assert res.exit_code == 0, res.stderr
    assert "verify: PASSED" in res.stdout and "latency: median" in res.stdout
    with np.load(out) as got:
        assert sorted(got.files) == ["feat", "out"]
        w = _conv_weight(spatial)
        y = np.maximum(np.einsum("oc,nchw->nohw", w, x), 0)
        np.testing.assert_allclose(got["feat"], y.mean(axis=(2, 3)), rtol=1e-5, atol=1e-5)
    assert [p.name for p in out.parent.iterdir()] == ["out.npz"]  # no temp file left behind


def test_spatial_box_region_sends_the_box(spatial):
    """The bottom half sent as a box (rows 4:8 by columns 0:6): each range of the box cuts its axis."""
    box = [{"axis": 2, "start": 4, "stop": 8}, {"axis": 3, "start": 0, "stop": 6}]
    spatial.manifest["steps"]["a"][3]["region"] = box
    spatial.manifest["transfers"][0]["region"] = box
    spatial.write()
    res = invoke(spatial.path, "--random-inputs", "--verify")
    assert res.exit_code == 0, res.stderr
    assert "verify: PASSED" in res.stdout


def _conv_weight(case) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(case.folder / "b.fb.onnx"))
    return numpy_helper.to_array(model.graph.initializer[0])[:, :, 0, 0]


def test_verify_mismatch_exits_1(chain):
    # Point the manifest at a different "source model" (the spatial head is irrelevant; use a scaled chain).
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(chain.folder / "model.onnx"))
    w2 = next(i for i in model.graph.initializer if i.name == "w2")
    w2.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w2) * 1.01, "w2"))
    (chain.folder / "other.onnx").write_bytes(model.SerializeToString())
    import hashlib

    chain.manifest["model"] = {"path": "other.onnx", "sha256": hashlib.sha256(model.SerializeToString()).hexdigest()}
    chain.write()
    res = invoke(chain.path, "--random-inputs", "--verify", "--json")
    assert res.exit_code == 1, res.stderr
    verdict = json.loads(res.stdout)["verify"]
    assert verdict["passed"] is False and verdict["worst_output"] == "prob" and verdict["max_abs_diff"] > 1e-4


def test_tampered_fragment_exits_2_one_line(chain):
    with open(chain.folder / "pi4-a.f1.onnx", "ab") as fh:
        fh.write(b"\0")
    proc = subprocess.run([sys.executable, "-m", "edgec.runtime", str(chain.path), "--random-inputs"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""
    assert_one_line_error(proc.stderr, str(chain.path), "f1", "sha256 mismatch")


def test_missing_fragment_file_exits_2(chain):
    (chain.folder / "pi5-a.f0.onnx").unlink()
    res = invoke(chain.path, "--random-inputs")
    assert res.exit_code == 2
    assert_one_line_error(res.stderr, "pi5-a.f0.onnx", "not found")


def test_missing_manifest_exits_2(tmp_path):
    res = invoke(tmp_path / "nope.json", "--random-inputs")
    assert res.exit_code == 2
    assert_one_line_error(res.stderr, "nope.json", "manifest not found")


@pytest.mark.parametrize("array, problem", [
    (np.zeros((1, 3, 8, 7), np.float32), "has shape [1, 3, 8, 7], the manifest expects [1, 3, 8, 8]"),
    (np.zeros((1, 3, 8, 8), np.float64), "has dtype float64, the manifest expects float32"),
])
def test_bad_inputs_npz_exits_2_naming_file(chain, tmp_path, array, problem):
    np.savez(tmp_path / "bad.npz", data=array)
    res = invoke(chain.path, "--inputs", tmp_path / "bad.npz")
    assert res.exit_code == 2
    assert_one_line_error(res.stderr, str(tmp_path / "bad.npz"), problem)


def test_bad_input_npy_and_unknown_name_exit_2(chain, tmp_path):
    np.save(tmp_path / "d.npy", np.zeros((1, 3, 8, 8), np.float32))
    res = invoke(chain.path, "--input", f"nodata={tmp_path / 'd.npy'}")
    assert res.exit_code == 2
    assert_one_line_error(res.stderr, "d.npy", "'nodata' is not a model input")
    res = invoke(chain.path, "--input", f"data={tmp_path / 'missing.npy'}")
    assert res.exit_code == 2
    assert_one_line_error(res.stderr, "missing.npy", "not found")


def test_worker_failure_exits_3_without_orphans(chain, make_failing_head):
    chain.replace_fragment("f1", make_failing_head())
    chain.write()
    res = invoke(chain.path, "--random-inputs")
    assert res.exit_code == 3
    assert_one_line_error(res.stderr, "pi4-a", "fragment f1", "failed")
    assert not workers_of(chain.path)


def test_timeout_exits_3_and_kills_workers(chain):
    chain.fragment("f1")["predicted_ms"] = 20000.0  # the emulated run sleeps far past the timeout
    chain.write()
    start = time.monotonic()
    res = invoke(chain.path, "--random-inputs", "--emulate", "--timeout", "1.5")
    assert res.exit_code == 3
    assert_one_line_error(res.stderr, "timed out after 1.5 s")
    assert time.monotonic() - start < 15
    assert not workers_of(chain.path)


@pytest.fixture(params=["early", pytest.param("late", marks=pytest.mark.slow)])
def late(request) -> bool:
    """Whether the emulated run's test also bounds it from above: the wall clock's upper bounds, which the other
    jobs of a busy machine can push past, are in the slow set; the floors hold under any load."""
    return request.param == "late"


def test_emulate_follows_predicted_ms_and_links(chain, late):
    plain = json.loads(invoke(chain.path, "--random-inputs", "--json").stdout)["latency_ms"] if late else None
    chain.fragment("f0")["predicted_ms"] = 120.0
    chain.manifest["network"]["links"] = [{"a": "pi4-a", "b": "pi5-a", "bandwidth_mbps": 1.0, "latency_ms": 40.0}]
    chain.write()
    res = invoke(chain.path, "--random-inputs", "--json", "--emulate", "--repeat", "2")
    assert res.exit_code == 0, res.stderr
    report = json.loads(res.stdout)
    # 120 ms run + 1024 B at 1 Mbit/s (8.2 ms) + 40 ms link latency
    assert 168.0 <= report["latency_ms"]
    if late:
        assert report["latency_ms"] < 168.0 + 300.0  # generous: the machine may be shared
        assert plain < 60.0
    assert report["devices"]["pi5-a"]["fragments_run_ms"] >= 120.0


def test_python_dash_m_runtime_help():
    proc = subprocess.run([sys.executable, "-m", "edgec.runtime", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--random-inputs" in proc.stdout


def test_worker_help():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "edgec.runtime.device.worker", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and "--listen" in proc.stdout and "--keys" in proc.stdout


def test_the_human_latency_line_says_when_requests_wait_for_those_ahead(chain):
    """At the default depth (5 for two stages) a streamed request's latency includes its wait behind the others;
    the line says so, and how to time a lone request."""
    streamed = invoke(chain.path, "--random-inputs", "--repeat", "4")
    assert streamed.exit_code == 0, streamed.stderr
    assert "with up to 5 in flight a request also waits for those ahead of it (--inflight 1" in streamed.stdout
    lone = invoke(chain.path, "--random-inputs", "--repeat", "4", "--inflight", "1")
    assert lone.exit_code == 0, lone.stderr
    assert "latency: median" in lone.stdout and "waits for those ahead" not in lone.stdout
