"""--emulate [--dilate K]: the planner's network semantics (one uplink per sender on a switched medium, one
channel for all on a shared one, the sender waiting for its burst), dilation of every emulated and reported
time, overrun warnings, the protocol fields they use; and --verify checking every request."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from click.testing import CliRunner

import edgec
from edgec.compiler.cost import simulate_manifest
from edgec.runtime.coordinator import pool as coordinator
from edgec.runtime.front.api import execute, report
from edgec.runtime.front.cli import run as run_cmd
from edgec.runtime.coordinator.emulate import Channel, Overruns, suggest_dilate
from edgec.runtime.device.emulate import DelayedLinks, pad_run
from edgec.runtime.manifest.types import Fragment
from edgec.runtime.manifest.load import load_manifest, parse_manifest
from edgec.runtime.wire.protocol import MAX_DILATE, parse
from edgec.runtime.wire.transport import BadMessage, pack

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
FOUR = REPO / "tests" / "e2e" / "clusters" / "four.yaml"


@pytest.fixture(scope="module")
def tinychain(tmp_path_factory) -> Path:
    """tinychain as a two-stage pipeline pi5-a -> pi5-b (one transfer, relu_5, 8192 bytes)."""
    out = tmp_path_factory.mktemp("tinychain") / "build"
    edgec.compile(MODELS / "tinychain.onnx", FOUR, out, strategy="pipeline", objective="throughput")
    return out


@pytest.fixture(scope="module")
def tinyconv(tmp_path_factory) -> Path:
    """tinyconv split spatially over pi5-a and pi5-b: pi5-a sends pi5-b its rows, then runs its own tile."""
    out = tmp_path_factory.mktemp("tinyconv") / "build"
    edgec.compile(MODELS / "tinyconv.onnx", FOUR, out, strategy="spatial")
    return out


def _edited(build: Path, folder: Path, change) -> Path:
    """A copy of a build whose manifest.json went through change(manifest dict)."""
    shutil.copytree(build, folder)
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m, sort_keys=True, indent=1))
    return folder


def _fragment(m: dict, fid: str) -> dict:
    return next(f for f in m["fragments"] if f["id"] == fid)


def _predicted_ms(path: Path) -> float:
    return simulate_manifest(load_manifest(path / "manifest.json" if path.is_dir() else path))["latency_ms"]


# -- dilation ----------------------------------------------------------------------------------------------------

def test_dilate_stretches_the_run_and_divides_what_it_reports(tinychain, tmp_path, late):
    def slow(m):
        m["network"]["links"] = [{"a": "pi5-a", "b": "pi5-b", "bandwidth_mbps": 2.0, "latency_ms": 5.0}]
        for f in m["fragments"]:
            f["predicted_ms"] = 6.0

    build = _edited(tinychain, tmp_path / "b", slow)
    predicted = _predicted_ms(build)  # 6 + 8192 B at 2 Mbit/s (32.8 ms) + 5 + 6
    assert predicted == pytest.approx(49.768)
    acc = tmp_path / "acc.json"
    start = time.monotonic()
    _, result, _ = execute(build, random_inputs=True, repeat=3, inflight=1, emulate=True, dilate=4, report=acc)
    wall_s = time.monotonic() - start
    assert _emulated(result.latency_ms, predicted, late, over=0.10)
    assert wall_s >= 4 * 4 * predicted / 1000.0 * 0.97  # the warm-up and 3 requests, each 4 x longer in real time
    assert _emulated(1000.0 / result.throughput_ips, predicted, late, over=0.15)
    accuracy = json.loads(acc.read_text())
    (t,) = accuracy["transfers"]
    if late:  # padded to 24 ms of real time each, reported as 6
        for ms in result.device_run_ms.values():
            assert ms and all(x == pytest.approx(6.0, rel=0.02) for x in ms)
        assert result.emulation == {"dilate": 4.0, "overruns": []}
        assert all(f["measured_ms"] == pytest.approx(6.0, rel=0.02) for f in accuracy["fragments"])
        assert t["measured_ms"] == pytest.approx(t["predicted_ms"], rel=0.05)
    else:  # never early (the padding is a floor); an overrun, if any, is a busy moment's
        for ms in result.device_run_ms.values():
            assert ms and all(x >= 6.0 * 0.98 for x in ms)
        assert result.emulation["dilate"] == 4.0
        assert all(f["measured_ms"] >= 6.0 * 0.98 for f in accuracy["fragments"])
        assert t["measured_ms"] >= t["predicted_ms"] * 0.95


@pytest.mark.parametrize("args, problem", [
    (["--emulate", "--dilate", "0.5"], "--dilate 0.5: expected a number from 1"),
    (["--emulate", "--dilate", "0"], "--dilate 0.0: expected a number from 1"),
    (["--emulate", "--dilate", "-3"], "--dilate -3.0: expected"),
    (["--emulate", "--dilate", "nan"], "--dilate nan: expected"),
    (["--emulate", "--dilate", "inf"], "--dilate inf: expected"),
    (["--emulate", "--dilate", str(MAX_DILATE * 2)], f"to {MAX_DILATE:g}"),
    (["--emulate", "--dilate", "fast"], "'fast' is not a valid float"),
    (["--dilate", "2"], "needs --emulate"),
])
def test_bad_dilate_exits_2_with_one_line(chain, args, problem):
    res = CliRunner().invoke(run_cmd, [str(chain.path), "--random-inputs", *args])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgec: ") and problem in lines[0], res.stderr


def test_protocol_checks_the_emulation_fields():
    def frames(msg):
        return [zmq.Frame(pack(msg))]

    base = {"t": "open", "device": "a", "manifest": b"{}", "path": "m", "inflight": 1, "emulate": True,
            "compress": "none"}
    assert parse(frames({**base, "dilate": 2.5}), {"open"})[0]["dilate"] == 2.5
    assert parse(frames({**base, "dilate": 3}), {"open"})[0]["dilate"] == 3
    for bad in (0.5, math.nan, MAX_DILATE + 1, True):
        with pytest.raises(BadMessage, match="dilate"):
            parse([zmq.Frame(msgpack.packb({**base, "dilate": bad}))], {"open"})
    with pytest.raises(BadMessage, match="'dilate' missing"):
        parse(frames(base), {"open"})
    assert parse(frames({"t": "channel", "seq": 0, "ms": 12.5, "since_ms": 0.25}), {"channel"})[0]["ms"] == 12.5
    with pytest.raises(BadMessage, match="outside"):
        parse(frames({"t": "channel", "seq": 0, "ms": -1.0, "since_ms": 0}), {"channel"})
    assert parse(frames({"t": "grant", "seq": 0, "wait_ms": -1.5}), {"grant"})[0]["wait_ms"] == -1.5
    ok = {"t": "overrun", "req": 3, "fragments": ["f0", "f1"], "measured_ms": [1.5, 2.0]}
    assert parse(frames(ok), {"overrun"})[0]["fragments"] == ["f0", "f1"]
    for bad in ({"fragments": ["f0"]}, {"fragments": ["f0", 7]}, {"measured_ms": [1.0, -2.0]}):
        with pytest.raises(BadMessage, match="overrun"):
            parse(frames({**ok, **bad}), {"overrun"})


# -- overruns ----------------------------------------------------------------------------------------------------

def test_an_overrun_warns_once_per_fragment_with_a_dilation_that_leaves_room(tinychain, tmp_path):
    def change(m):
        _fragment(m, "f0")["predicted_ms"] = 0.001
        _fragment(m, "f1")["predicted_ms"] = 20.0  # room to spare: it does not overrun

    build = _edited(tinychain, tmp_path / "b", change)
    res = CliRunner().invoke(run_cmd, [str(build), "--random-inputs", "--emulate", "--repeat", "3", "--json"])
    assert res.exit_code == 0, res.stderr
    emulation = json.loads(res.stdout)["emulation"]
    assert emulation["dilate"] == 1.0
    (over,) = emulation["overruns"]
    assert (over["fragment"], over["device"], over["padded_ms"]) == ("f0", "pi5-a", 0.001)
    assert over["measured_ms"] > over["padded_ms"]
    (line,) = [ln for ln in res.stderr.splitlines() if "warning: emulation" in ln]
    found = re.fullmatch(r"edgec: warning: emulation: fragment f0 on device pi5-a ran (\d+\.\d{3}) ms, more than its "
                         r"predicted 0\.001 ms x 1; --dilate (\d+(\.\d)?) would leave room", line)
    assert found, line
    assert float(found.group(1)) == pytest.approx(over["measured_ms"], abs=1e-3)
    # 1.2 x the worst measured / predicted, rounded up to one decimal (give or take the JSON's rounding to 0.1 us)
    assert float(found.group(2)) == pytest.approx(suggest_dilate(over["measured_ms"] / 0.001), abs=0.1 + 1e-9)


def test_suggested_dilation_and_overrun_bookkeeping():
    assert suggest_dilate(2.5) == 3.0 and suggest_dilate(1.01) == 1.3 and suggest_dilate(10.0) == 12.0
    log = Overruns(2.0)
    assert log.suggestion() is None and log.warnings() == []
    log.add("a", "f0", 1.0, 3.0)
    log.add("a", "f0", 1.0, 2.5)  # not the worst: kept once, at its worst
    log.add("b", "f1", 2.0, 5.0)
    assert log.suggestion() == suggest_dilate(3.0) == 3.6
    assert log.as_json()["overruns"] == [{"fragment": "f0", "device": "a", "measured_ms": 3.0, "padded_ms": 2.0},
                                         {"fragment": "f1", "device": "b", "measured_ms": 5.0, "padded_ms": 4.0}]
    assert len(log.warnings()) == 2 and all(ln.endswith("--dilate 3.6 would leave room") for ln in log.warnings())


def test_pad_run_dilates():
    frag = Fragment("f", "d", "f.onnx", "0", (), (), predicted_ms=10.0)
    start = time.perf_counter()
    assert pad_run(frag, 0.001, dilate=3.0) == pytest.approx(0.030)
    assert time.perf_counter() - start >= 0.028
    assert pad_run(frag, 0.040, dilate=3.0) == 0.040


def _emulated(measured_ms: float, predicted_ms: float, late: bool, over: float = 0.20) -> bool:
    """Emulation keeps the predicted time: never more than 4% early (padding and link delays are floors), and,
    with `late`, late by at most `over` (what a loaded test machine adds; the benchmark, not this test, measures
    fidelity). The cases below are built so that the wrong semantics would be at least 25% early."""
    return 0.96 * predicted_ms <= measured_ms and (not late or measured_ms <= (1.0 + over) * predicted_ms)


@pytest.fixture(params=["early", pytest.param("late", marks=pytest.mark.slow)])
def late(request) -> bool:
    """Whether an emulated run's test also bounds how late it is: the wall clock's upper bounds, which the other
    jobs of a busy machine can push past, are in the slow set; the floors (never early) hold under any load."""
    return request.param == "late"


# -- the network: the planner's semantics ----------------------------------------------------------------------

def test_one_uplink_per_sender_and_a_granted_start(spatial):
    spatial.manifest["network"]["latency_ms"] = 10.0
    links = DelayedLinks(parse_manifest(spatial.manifest, spatial.path), "a", dilate=2.0)
    sent: list[float] = []
    start = time.monotonic()
    first = links.submit("b", 0, lambda: sent.append(time.monotonic() - start), not_before=start + 0.010)
    second = links.submit("c", 0, lambda: sent.append(time.monotonic() - start))  # another peer: still queues
    assert first == start + 0.010 and second == pytest.approx(start + 0.030)
    assert links.busy_until == pytest.approx(start + 0.050)
    links.close()
    assert len(sent) == 2 and sent[0] >= 0.0295 and sent[1] >= 0.0495


def test_channel_reservations_are_first_come_first_served():
    ch = Channel()
    assert ch.reserve(10.0, 0.5) == 0.0  # free: start now
    assert ch.reserve(10.1, 0.2) == pytest.approx(0.4)  # behind the first, until 10.5
    assert ch.reserve(11.0, 0.1) == 0.0  # free again by then
    assert ch.reserve(12.0, 0.1, since_s=0.5) == -0.5  # free since its burst was ready: it started then
    assert ch.reserve(12.0, 0.1, since_s=0.5) == pytest.approx(-0.4)  # behind that one


def _fan_out(spatial, medium: str, fb_ms: float):
    """The hand-built spatial case: a sends b and c their rows (one burst), both send their tiles back."""
    spatial.manifest["network"].update(medium=medium, latency_ms=40.0)
    for f in spatial.manifest["fragments"]:
        f["predicted_ms"] = fb_ms if f["id"] == "fb" else 1.0
    spatial.write()
    return spatial


def test_switched_sender_sends_to_two_peers_one_after_another(spatial, late):
    case = _fan_out(spatial, "switched", 1.0)
    predicted = _predicted_ms(case.path)
    assert predicted == pytest.approx(122.0, abs=0.1)  # with a lane per destination it would be 82
    _, result, _ = execute(case.path, random_inputs=True, repeat=2, inflight=1, emulate=True)
    assert _emulated(result.latency_ms, predicted, late)


def test_shared_medium_second_sender_waits_for_the_first(spatial, late):
    # b gets its rows at 40 ms, c at 80 ms; fb takes 41 ms, so both tiles are ready at 81 ms and both senders ask
    # for the one channel at once: one sends from 81 to 121 ms, the other from 121 to 161 ms.
    case = _fan_out(spatial, "shared", 41.0)
    predicted = _predicted_ms(case.path)
    assert predicted == pytest.approx(162.0, abs=0.1)  # a lane per sender would give 122
    _, result, _ = execute(case.path, random_inputs=True, repeat=2, inflight=1, emulate=True, dilate=1.5)
    assert _emulated(result.latency_ms, predicted, late)


def test_the_sender_runs_its_next_fragment_once_its_sends_are_done(tinyconv, tmp_path, late):
    def change(m):
        m["network"]["links"] = [{"a": "pi5-a", "b": "pi5-b", "bandwidth_mbps": 1000.0, "latency_ms": 30.0}]
        for f in m["fragments"]:
            f["predicted_ms"] = {"f0s0t0": 50.0}.get(f["id"], 1.0)

    build = _edited(tinyconv, tmp_path / "b", change)
    steps = [s["op"] for s in json.loads((build / "manifest.json").read_text())["steps"]["pi5-a"]]
    assert steps.index("send") < steps.index("run")  # sends pi5-b its rows, then runs its own tile
    predicted = _predicted_ms(build)
    assert predicted == pytest.approx(81.0, abs=0.2)  # 30 (send) + 50 (own tile) + 1; not waiting: 62
    _, result, _ = execute(build, random_inputs=True, repeat=2, inflight=1, emulate=True)
    assert _emulated(result.latency_ms, predicted, late)


# -- --verify checks every request -------------------------------------------------------------------------------

def test_verify_fails_when_any_request_differs(chain, monkeypatch):
    stream = coordinator.WorkerPool.stream
    seen = {"n": 0}

    def corrupt_the_third_timed(self, requests, inflight=None):
        for outputs, latency, run_ms in stream(self, requests, inflight):
            seen["n"] += 1
            if seen["n"] == 4:  # the warm-up, then timed requests 1, 2 and 3
                outputs = {**outputs, "prob": outputs["prob"] + np.float32(1.0)}
            yield outputs, latency, run_ms

    m, result, checked = execute(chain.path, random_inputs=True, verify=True, repeat=5)
    assert checked.passed and checked.requests_checked == 6
    assert report(m, result, checked)["verify"]["requests_checked"] == 6
    monkeypatch.setattr(coordinator.WorkerPool, "stream", corrupt_the_third_timed)
    _, _, checked = execute(chain.path, random_inputs=True, verify=True, repeat=5)
    assert seen["n"] == 6
    assert not checked.passed and checked.worst_output == "prob" and checked.requests_checked == 6
    assert checked.max_abs_diff == pytest.approx(1.0, abs=1e-3)
