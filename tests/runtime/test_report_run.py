"""`edgec run --report FILE.json`: the accuracy report's schema and figures on a two-device pipeline of local
workers, the clock-offset correction of transfer times (a fake offset), and bad report paths."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgec
from edgec.runtime.coordinator.accuracy import ClockOffset, Samples, build_report, estimate_offset
from edgec.runtime.front.cli import run as run_cmd
from edgec.runtime.coordinator.pool import WorkerPool
from edgec.runtime.errors import RunError
from edgec.runtime.coordinator.inputs import random_inputs
from edgec.runtime.manifest.load import load_manifest

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = REPO / "tests" / "e2e" / "clusters"
KEYS = ["manifest", "repeat", "fragments", "transfers", "latency", "throughput", "failovers"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    """tinychain as a two-stage pipeline pi5-a -> pi5-b: two fragments, one transfer."""
    out = tmp_path_factory.mktemp("pipeline") / "build"
    edgec.compile(MODELS / "tinychain.onnx", CLUSTERS / "four.yaml", out, strategy="pipeline", objective="throughput")
    return out


def _close(a: float, b: float, tol: float = 2e-4) -> bool:
    return abs(a - b) <= tol


def test_report_schema_and_figures(pipeline, tmp_path):
    path = tmp_path / "acc.json"
    edgec.run(pipeline, random_inputs=True, repeat=6, report=path)
    report = json.loads(path.read_text())
    m = load_manifest(pipeline / "manifest.json")
    assert list(report) == KEYS
    assert report["manifest"] == os.path.abspath(m.path) and report["repeat"] == 6 and report["failovers"] == []
    assert [(f["id"], f["device"], f["predicted_ms"]) for f in report["fragments"]] == \
        [(f.id, f.device, round(f.predicted_ms, 4)) for f in m.fragments.values()]
    assert [(t["tensor"], t["src"], t["dst"], t["bytes"]) for t in report["transfers"]] == \
        [(t.tensor, t.src, t.dst, t.bytes) for t in m.transfers] and report["transfers"]
    for entry in report["fragments"] + report["transfers"]:
        assert entry["measured_ms"] > 0
        assert _close(entry["error"], entry["measured_ms"] / entry["predicted_ms"] - 1, 2e-3)
    for t, spec in zip(report["transfers"], m.transfers):
        assert _close(t["predicted_ms"], m.network.transfer_s(spec.src, spec.dst, spec.bytes) * 1000)
        assert 0 <= t["clock_bound_ms"] < 50  # loopback round trips: well under a millisecond when idle
    lat, ips = report["latency"], report["throughput"]
    assert _close(lat["predicted_ms"], m.predicted["latency_ms"]) and lat["measured_ms"] > 0
    assert _close(ips["predicted_ips"], m.predicted["throughput_ips"]) and ips["measured_ips"] > 0
    assert _close(lat["error"], lat["measured_ms"] / lat["predicted_ms"] - 1, 2e-3)
    assert _close(ips["error"], ips["measured_ips"] / ips["predicted_ips"] - 1, 2e-3)


def test_emulated_report_measures_the_padded_runs(pipeline, tmp_path):
    path = tmp_path / "acc.json"
    edgec.run(pipeline, random_inputs=True, repeat=3, emulate=True, inflight=1, report=path)
    report = json.loads(path.read_text())
    for f in report["fragments"]:  # a tiny fragment runs faster than its prediction: padded to it exactly
        assert f["measured_ms"] >= f["predicted_ms"] - 1e-3
    for t in report["transfers"]:  # delivered after bytes / bandwidth + latency at the earliest
        assert t["measured_ms"] >= t["predicted_ms"] - t["clock_bound_ms"] - 1e-3


def test_cli_summarises_the_worst_offenders_on_stderr(pipeline, tmp_path):
    path = tmp_path / "acc.json"
    res = CliRunner().invoke(run_cmd, [str(pipeline), "--random-inputs", "--repeat", "3", "--report", str(path)])
    assert res.exit_code == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("edgec: accuracy:")]
    assert lines[0].startswith("edgec: accuracy: latency ")
    assert sum("fragment f" in ln for ln in lines) == 2 and sum("transfer relu_5" in ln for ln in lines) == 1
    assert json.loads(path.read_text())["repeat"] == 3
    assert not list(tmp_path.glob(".acc.json.*"))  # no temporary file left behind


@pytest.mark.parametrize("where", ["missing", "directory"])
def test_a_report_path_that_cannot_be_written_fails_before_the_run(pipeline, tmp_path, where):
    target = tmp_path / "no-such-folder" / "acc.json" if where == "missing" else tmp_path
    res = CliRunner().invoke(run_cmd, [str(pipeline), "--random-inputs", "--report", str(target)])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(f"edgec: {target}: ")
    assert "worker(s) ready" not in res.stderr


def test_local_workers_share_the_coordinator_clock_within_the_bound(pipeline):
    """Local workers read the same monotonic clock: Cristian's estimate is within its bound of 0."""
    m = load_manifest(pipeline / "manifest.json")
    with WorkerPool(m, timings=True) as c:
        assert set(c.offsets) == {"pi5-a", "pi5-b"}
        for off in c.offsets.values():
            assert abs(off.offset_s) <= off.bound_s and off.bound_s < 0.5
        c.infer(random_inputs(m.inputs, seed=0))
        assert set(c.samples.fragment_ms) == {"f0", "f1"} and len(c.samples.transfer_ms) == 1


def test_transfer_times_are_corrected_by_each_workers_clock_offset(pipeline):
    """pi5-a's clock runs 100 s ahead of the coordinator's, pi5-b's 50 s behind: a tensor sent at coordinator
    time 10.000 s and received at 10.003 s measures 3 ms, not 150 s."""
    m = load_manifest(pipeline / "manifest.json")
    ahead = estimate_offset(5.0, 100.0 + 5.0004, 5.0010)  # the worker read its clock 0.4 ms into the round trip
    behind = estimate_offset(6.0, -50.0 + 6.0005, 6.0010)
    assert _close(ahead.offset_s, 100.0 - 0.0001, 1e-9) and _close(ahead.bound_s, 0.0005, 1e-9)
    assert abs(behind.offset_s - -50.0) <= behind.bound_s
    samples = Samples(m)
    samples.add({"pi5-a": ([0.2], [100.0 + 10.000]), "pi5-b": ([0.1], [-50.0 + 10.003])},
                {"pi5-a": ahead, "pi5-b": behind})
    (ms,) = samples.transfer_ms.values()
    assert abs(ms[0] - 3.0) <= (ahead.bound_s + behind.bound_s) * 1000 + 1e-9
    report = build_report(m, repeat=1, latency_ms=1.0, throughput_ips=1.0, samples=samples,
                          offsets={"pi5-a": ahead, "pi5-b": behind}, failovers=[])
    (t,) = report["transfers"]
    assert _close(t["measured_ms"], ms[0]) and _close(t["clock_bound_ms"], 1.0)
    assert [f["measured_ms"] for f in report["fragments"]] == [0.2, 0.1]


def test_samples_are_bounded_and_timings_must_match_the_steps(pipeline, monkeypatch):
    from edgec.runtime.coordinator import accuracy

    m = load_manifest(pipeline / "manifest.json")
    monkeypatch.setattr(accuracy, "MAX_SAMPLES", 4)
    samples = Samples(m)
    zero = {d: ClockOffset(0.0, 0.0) for d in ("pi5-a", "pi5-b")}
    for i in range(10):
        samples.add({"pi5-a": ([float(i + 1)], [0.0]), "pi5-b": ([1.0], [0.001])}, zero)
    assert list(samples.fragment_ms["f0"]) == [7.0, 8.0, 9.0, 10.0]
    samples.check("pi5-a", [0.1], [1.0])
    with pytest.raises(RunError, match="pi5-b: its worker timed 2 run"):
        samples.check("pi5-b", [0.1, 0.2], [1.0])


def test_a_transfer_entry_without_a_send_is_reported_unmeasured(pipeline, tmp_path):
    raw = json.loads((pipeline / "manifest.json").read_text())
    raw["transfers"].append({**raw["transfers"][0], "tensor": "relu_4"})  # informational: no such send
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(raw))
    m = load_manifest(path, check_files=False)
    report = build_report(m, repeat=1, latency_ms=1.0, throughput_ips=1.0, samples=Samples(m), offsets={},
                          failovers=[])
    assert report["transfers"][1]["measured_ms"] is None and report["transfers"][1]["error"] is None


def test_a_report_after_a_failover_is_the_fallback_plans(tmp_path):
    """pi5-b's local worker is killed mid-run: the fragments and transfers reported are the fallback plan's
    (pi5-a -> pi5-c), timed on the requests it ran, and the report lists the switch."""
    from edgec.runtime.coordinator.failover import FailoverPool
    from tests.runtime.test_failover import _compile as compile_with_fallbacks

    build = compile_with_fallbacks(tmp_path, fallbacks=True)
    m = load_manifest(build / "manifest.json")
    inputs = random_inputs(m.inputs, 0)
    with FailoverPool(m, inflight=2, timeout=30, timings=True) as cluster:
        def feed():
            for i in range(30):
                if i == 10:
                    os.kill(cluster.workers["pi5-b"].proc.pid, signal.SIGKILL)
                yield inputs
        latencies = [lat for _, lat, _ in cluster.stream(feed())]
        report = build_report(cluster.manifest, repeat=30, latency_ms=sorted(latencies)[15], throughput_ips=1.0,
                              samples=cluster.samples, offsets=cluster.offsets, failovers=cluster.failovers)
    fallback = load_manifest(build / m.fallback_for("pi5-b").manifest)
    assert report["manifest"] == os.path.abspath(fallback.path)
    assert [f["device"] for f in report["failovers"]] == ["pi5-b"]
    assert {f["device"] for f in report["fragments"]} == {"pi5-a", "pi5-c"}
    assert all(f["measured_ms"] > 0 for f in report["fragments"] + report["transfers"])
    assert [(t["src"], t["dst"]) for t in report["transfers"]] == [("pi5-a", "pi5-c")]
