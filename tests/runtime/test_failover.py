"""Failover: a device lost mid-run (its worker killed, or silent past the heartbeats) is replaced by the
build's fallback plan without it; every request not completed is re-run, none is lost, outputs stay in order
and verify. Without a fallback the run fails as before: exit 3, naming the device. The manifest's optional
`fallbacks` field parses, and manifests without it still do."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import edgec
from edgec.runtime.coordinator.liveness import DeviceLost
from edgec.runtime.coordinator.failover import FailoverPool
from edgec.runtime.coordinator.pool import WorkerPool
from edgec.runtime.errors import InputError
from edgec.runtime.coordinator.inputs import random_inputs
from edgec.runtime.manifest.load import load_manifest
from tests.runtime.test_distributed import REPO, killable_workers

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
DEVICES = ["pi5-a", "pi5-b", "pi5-c"]
THREE = """devices:
  - {name: pi5-a, profile: rpi5}
  - {name: pi5-b, profile: rpi5}
  - {name: pi5-c, profile: rpi5}
network: {bandwidth_mbps: 1000, latency_ms: 0.2, medium: switched}
"""
REPEAT, KILL_AT = 200, 100


def _compile(folder: Path, fallbacks: bool) -> Path:
    (folder / "three.yaml").write_text(THREE)
    out = folder / "build"
    edgec.compile(MODELS / "tinychain.onnx", folder / "three.yaml", out, strategy="pipeline", objective="throughput",
                  fallbacks=fallbacks)
    return out


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    """tinychain as a pipeline pi5-a -> pi5-b on three devices; without pi5-b, the plan is pi5-a -> pi5-c."""
    out = _compile(tmp_path_factory.mktemp("fallbacks"), fallbacks=True)
    m = load_manifest(out / "manifest.json")
    assert [d for d in m.device_names if m.steps.get(d)] == ["pi5-a", "pi5-b"]
    fallback = load_manifest(out / m.fallback_for("pi5-b").manifest)
    assert [d for d in fallback.device_names if fallback.steps.get(d)] == ["pi5-a", "pi5-c"]
    return out


@pytest.fixture(scope="module")
def plain_build(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("plain"), fallbacks=False)


@pytest.fixture
def workers(tmp_path):
    """An `edgec worker` per device on loopback; those the test did not kill must stop cleanly on SIGTERM."""
    yield from killable_workers(tmp_path, DEVICES, "--threads", "1")


def _addresses(workers) -> list[str]:
    return [arg for name, w in workers.items() for arg in ("--addresses", f"{name}={w.address}")]


def _run_and_kill(build: Path, workers, victim: str, *extra: str, sig: int = signal.SIGKILL) -> tuple[int, str, str]:
    """`edgec run --repeat 200 --inflight 2`, signalling the victim's worker (SIGKILL: it dies; SIGTERM: it stops
    cleanly, telling the coordinator) once request 100 is reported."""
    cmd = [sys.executable, "-m", "edgec.runtime", str(build), "--random-inputs", "--repeat", str(REPEAT),
           "--inflight", "2", "--timeout", "30", "--verbose", *_addresses(workers), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    stderr = []
    for line in proc.stderr:
        stderr.append(line)
        if f"request {KILL_AT}/{REPEAT}:" in line:
            os.kill(workers[victim].proc.pid, sig)
    stdout = proc.stdout.read()
    proc.wait(timeout=60)
    assert workers[victim].proc.poll() is not None, "the run ended before the worker was killed"
    return proc.returncode, stdout, "".join(stderr)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_a_worker_killed_at_request_100_of_200_loses_nothing(build, workers, sig):
    code, stdout, stderr = _run_and_kill(build, workers, "pi5-b", "--verify", "--json", sig=sig)
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["completed"] == REPEAT and report["lost"] == 0 and len(report["latencies_ms"]) == REPEAT
    [switch] = report["failovers"]
    assert switch["device"] == "pi5-b" and KILL_AT <= switch["at_request"] < REPEAT
    assert Path(switch["plan"]) == build / "fallback-pi5-b" / "manifest.json"
    assert report["verify"]["passed"]
    assert report["devices"]["pi5-b"]["lost"] is True
    assert report["devices"]["pi5-c"]["requests"] == REPEAT - switch["at_request"]  # re-runs included
    notes = [ln for ln in stderr.splitlines() if "fallback plan" in ln]
    assert len(notes) == 1 and notes[0].startswith("edgec: warning: device pi5-b") and "Traceback" not in stderr


def test_every_output_verifies_in_request_order_across_a_switch(build):
    """200 distinct requests through local workers (started by the coordinator); pi5-b's is killed as request
    100 is issued. Each output must be the source model's output for that very request."""
    m = load_manifest(build / "manifest.json")
    requests = [random_inputs(m.inputs, seed) for seed in range(REPEAT)]
    with FailoverPool(m, inflight=2, timeout=30) as cluster:
        def feed():
            for i, inputs in enumerate(requests):
                if i == KILL_AT:
                    os.kill(cluster.workers["pi5-b"].proc.pid, signal.SIGKILL)
                yield inputs
        outputs = [out for out, _, _ in cluster.stream(feed())]
        assert set(cluster.workers) == {"pi5-a", "pi5-c"}  # the fallback plan's, started afresh
        assert cluster.completed == REPEAT
        [switch] = cluster.failovers
    assert switch["device"] == "pi5-b" and KILL_AT - 2 <= switch["at_request"] <= KILL_AT
    session = ort.InferenceSession(str(m.model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in m.outputs]
    for i, (inputs, got) in enumerate(zip(requests, outputs, strict=True)):
        for name, ref in zip(names, session.run(names, inputs)):
            assert np.abs(got[name] - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max())), (i, name)
    assert not np.array_equal(outputs[KILL_AT][names[0]], outputs[KILL_AT + 1][names[0]])  # distinct requests


def _silent_mid_run(build, workers, caplog) -> tuple[float, str]:
    """SIGSTOP keeps pi5-b's connection open but unanswered, mid-stream: only the heartbeats (100 ms, 5 missed)
    tell (a stopped worker neither exits nor says anything; the request timeout, 30 s, would end the run with
    an error, not a failover). Returns the seconds the 20 requests after the stop took, and what the switch said."""
    m = load_manifest(build / "manifest.json")
    inputs = random_inputs(m.inputs, 1)
    addresses = {name: w.address for name, w in workers.items()}
    stopped = workers["pi5-b"].proc
    try:
        with FailoverPool(m, addresses=addresses, inflight=2, timeout=30, heartbeat_ms=100) as cluster:
            for _ in cluster.stream([inputs] * 20):
                pass
            stopped.send_signal(signal.SIGSTOP)
            start = time.monotonic()
            with caplog.at_level(logging.WARNING, logger="edgec.runtime"):
                results = list(cluster.stream([inputs] * 20))
            elapsed = time.monotonic() - start
            assert [f["device"] for f in cluster.failovers] == ["pi5-b"] and len(results) == 20
    finally:
        stopped.send_signal(signal.SIGCONT)
    (switch,) = [r.getMessage() for r in caplog.records if "switching to the fallback plan" in r.getMessage()]
    return elapsed, switch


def test_a_device_silent_past_the_heartbeats_is_replaced(build, workers, caplog):
    _, switch = _silent_mid_run(build, workers, caplog)
    # found by the heartbeats set for this run: 5 missed at 100 ms
    assert "pi5-b" in switch and "answered no heartbeat for 0.5 s" in switch, switch


@pytest.mark.slow
def test_a_device_silent_past_the_heartbeats_is_replaced_within_seconds(build, workers, caplog):
    """Slow: a wall-clock bound, which a busy machine may miss."""
    elapsed, _ = _silent_mid_run(build, workers, caplog)
    # Found by the heartbeats: about 0.6 s here, where the default 1 s interval takes 6 s, and the request
    # timeout 30 s.
    assert elapsed < 3, elapsed


def test_without_fallbacks_a_lost_device_fails_the_run_naming_it(plain_build, workers):
    code, stdout, stderr = _run_and_kill(plain_build, workers, "pi5-b", "--json")
    assert code == 3 and stdout == "", stderr
    last = stderr.splitlines()[-1]
    assert last.startswith("edgec: device pi5-b") and "compile with --fallbacks" in last and "Traceback" not in stderr


def _kill_once_welcomed(monkeypatch, workers, victim: str) -> None:
    """Fault injection: SIGKILL the victim's worker as soon as it has answered the coordinator's hello, before
    its fragments are loaded (tests/e2e/test_oom_netbed.py has the OOM killer do it for real)."""
    welcome = WorkerPool._on_welcome

    def welcome_then_kill(self, w, msg, payload):
        welcome(self, w, msg, payload)
        if w.name == victim and workers[victim].proc.poll() is None:
            workers[victim].proc.kill()
            workers[victim].proc.wait()

    monkeypatch.setattr(WorkerPool, "_on_welcome", welcome_then_kill)


def test_a_worker_dying_as_the_run_starts_is_a_lost_device(build, workers, monkeypatch):
    _kill_once_welcomed(monkeypatch, workers, "pi5-b")
    m = load_manifest(build / "manifest.json")
    inputs = random_inputs(m.inputs, 3)
    with FailoverPool(m, addresses={n: w.address for n, w in workers.items()}, inflight=1, timeout=30) as cluster:
        assert len(list(cluster.stream([inputs] * 3))) == 3
        assert cluster.failovers == [{"device": "pi5-b", "at_request": 0,
                                      "plan": str(build / "fallback-pi5-b" / "manifest.json")}]
        assert set(cluster.workers) == {"pi5-a", "pi5-c"}
    report = cluster.device_report()  # the workers' counts come with their goodbye, on close
    assert report["pi5-b"]["lost"] is True and report["pi5-c"]["requests"] == 3


def test_a_worker_still_connecting_when_the_first_plan_fails_is_told_the_run_is_over(build, workers, monkeypatch):
    """pi5-b dies as it is welcomed while pi5-a's welcome is still unread (a busy machine): pi5-a read its hello
    and began a session of this coordinator, so ending that run must end the session there too, or the fallback
    plan finds pi5-a busy with it ("refused: the worker is busy with the run of another coordinator")."""
    welcome, pools = WorkerPool._on_welcome, []

    def first_run_reads_only_pi5b(self, w, msg, payload):
        pools.append(self) if self not in pools else None
        if self is pools[0] and w.name == "pi5-a":
            return  # unread: pi5-a stays "connecting" in the first run
        welcome(self, w, msg, payload)
        if self is pools[0] and w.name == "pi5-b" and workers["pi5-b"].proc.poll() is None:
            workers["pi5-b"].proc.kill()
            workers["pi5-b"].proc.wait()

    monkeypatch.setattr(WorkerPool, "_on_welcome", first_run_reads_only_pi5b)
    m = load_manifest(build / "manifest.json")
    with FailoverPool(m, addresses={n: w.address for n, w in workers.items()}, inflight=1, timeout=30) as cluster:
        assert len(list(cluster.stream([random_inputs(m.inputs, 3)] * 2))) == 2
        assert [f["device"] for f in cluster.failovers] == ["pi5-b"] and set(cluster.workers) == {"pi5-a", "pi5-c"}
    assert len(pools) == 2 and cluster.device_report()["pi5-a"]["requests"] == 2


def test_without_fallbacks_a_worker_dying_as_the_run_starts_fails_naming_it(plain_build, workers, monkeypatch):
    _kill_once_welcomed(monkeypatch, workers, "pi5-b")
    m = load_manifest(plain_build / "manifest.json")
    with pytest.raises(DeviceLost, match=r"^device pi5-b .*lost the connection.*compile with --fallbacks"):
        with FailoverPool(m, addresses={n: w.address for n, w in workers.items()}, timeout=30):
            pass


def test_a_broken_fallback_is_bad_input_before_the_run(build, tmp_path):
    import shutil

    copy = tmp_path / "build"
    shutil.copytree(build, copy)
    fallback = copy / "fallback-pi5-a" / "manifest.json"
    fallback.write_text(fallback.read_text() + " ")
    with pytest.raises(InputError, match=r"fallback without pi5-a: fallback-pi5-a/manifest.json sha256 mismatch"):
        edgec.run(copy, random_inputs=True, addresses={"pi5-a": "tcp://127.0.0.1:9"}, timeout=1)
    fallback.unlink()
    with pytest.raises(InputError, match="fallback without pi5-a: cannot read fallback-pi5-a/manifest.json"):
        edgec.run(copy, random_inputs=True)


# -- the manifest field ---------------------------------------------------------------------------------------
def _with_fallbacks(case, entries) -> Path:
    data = case.copy_manifest()
    data["fallbacks"] = entries
    case.path.write_text(json.dumps(data))
    return case.path


def test_a_manifest_without_fallbacks_still_parses(chain):
    assert load_manifest(chain.path).fallbacks == ()
    assert load_manifest(_with_fallbacks(chain, None)).fallbacks == ()


def test_a_manifest_with_fallbacks_parses(chain):
    sha = "AB" * 32
    m = load_manifest(_with_fallbacks(chain, [
        {"without": "pi4-a", "manifest": "fallback-pi4-a/manifest.json", "sha256": sha},
        {"without": "pi5-a", "manifest": None, "sha256": None, "error": "no device can hold the model"}]))
    fb = m.fallback_for("pi4-a")
    assert (fb.manifest, fb.sha256, fb.error) == ("fallback-pi4-a/manifest.json", sha.lower(), None)
    assert m.fallback_for("pi5-a").manifest is None and m.fallback_for("pi5-a").error == "no device can hold the model"
    assert m.fallback_for("nope") is None


@pytest.mark.parametrize("entry, problem", [
    ({"without": "pi9", "manifest": "f/manifest.json", "sha256": "a" * 64}, "fallbacks[0].without: unknown device"),
    ({"without": "pi4-a", "manifest": "../f/manifest.json", "sha256": "a" * 64}, "not a path inside the build"),
    ({"without": "pi4-a", "manifest": "/etc/manifest.json", "sha256": "a" * 64}, "not a path inside the build"),
    ({"without": "pi4-a", "manifest": "f/manifest.json", "sha256": "abc"}, "expected 64 hexadecimal digits"),
    ({"without": "pi4-a", "manifest": None, "sha256": None}, "expected sha256 null and an error"),
    ("pi4-a", "fallbacks[0]: expected an object"),
])
def test_bad_fallback_entries_are_refused(chain, entry, problem):
    with pytest.raises(InputError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        load_manifest(_with_fallbacks(chain, [entry]))
    with pytest.raises(InputError, match="two entries without device 'pi4-a'"):
        good = {"without": "pi4-a", "manifest": "f/manifest.json", "sha256": "a" * 64}
        load_manifest(_with_fallbacks(chain, [good, good]))
