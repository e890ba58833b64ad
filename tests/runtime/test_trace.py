"""`edgec run --trace FILE.json`: Chrome trace events of a real run that agree with its --report and with the
order in which its workers did things, every event where its worker stamped it (synthetic timings, exact
figures), and bad trace paths."""

from __future__ import annotations

import json
import os
import statistics
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgec
from edgec.runtime.coordinator.accuracy import ClockOffset, Samples
from edgec.runtime.front.cli import run as run_cmd
from edgec.runtime.errors import RunError
from edgec.runtime.manifest.types import HOST, Recv, Run, Send
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.coordinator.trace import Trace

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = REPO / "tests" / "e2e" / "clusters"
REPEAT = 5


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    """tinychain as a two-stage pipeline pi5-a -> pi5-b: two fragments, one transfer."""
    out = tmp_path_factory.mktemp("pipeline") / "build"
    edgec.compile(MODELS / "tinychain.onnx", CLUSTERS / "four.yaml", out, strategy="pipeline", objective="throughput")
    return out


@pytest.fixture(scope="module")
def traced(pipeline, tmp_path_factory) -> tuple[dict, dict]:
    """(trace, report) of one run with both."""
    folder = tmp_path_factory.mktemp("traced")
    edgec.run(pipeline, random_inputs=True, repeat=REPEAT, report=folder / "r.json", trace=folder / "t.json")
    return json.loads((folder / "t.json").read_text()), json.loads((folder / "r.json").read_text())


def _timed(trace: dict, kind: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] in "Xi" and e["args"]["kind"] == kind]


def test_trace_is_chrome_trace_json(traced, pipeline):
    trace, _ = traced
    assert trace["displayTimeUnit"] == "ms" and isinstance(trace["traceEvents"], list)
    other = trace["otherData"]
    assert other["producer"] == "edgec run --trace" and other["requests"] == REPEAT and other["dropped"] == 0
    assert other["manifest"] == os.path.abspath(pipeline / "manifest.json") and other["medium"] == "switched"
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "coordinator", 1: "pi5-a", 2: "pi5-b"}  # the devices that work, in manifest order
    threads = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e["name"] == "thread_name"}
    for e in trace["traceEvents"]:
        assert e["ph"] in ("M", "X", "i") and isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] != "M":
            assert (e["pid"], e["tid"]) in threads and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
    # From the earliest event: the first request's start, unless a clock offset's error puts a stamp before it.
    assert min(e["ts"] for e in trace["traceEvents"] if e["ph"] != "M") == 0
    assert min(e["ts"] for e in _timed(trace, "request")) <= max(other["clock_bound_ms"].values()) * 1000


def test_one_event_per_fragment_run_and_transfer_per_request(traced, pipeline):
    trace, _ = traced
    m = load_manifest(pipeline / "manifest.json")
    runs = Counter((d, s.fragment) for d, steps in m.steps.items() for s in steps if isinstance(s, Run))
    sends = Counter((d, s.to, s.tensor) for d, steps in m.steps.items() for s in steps
                    if isinstance(s, Send) and s.to != HOST)
    recvs = Counter((s.src, d, s.tensor) for d, steps in m.steps.items() for s in steps
                    if isinstance(s, Recv) and s.src != HOST)
    assert sorted(e["args"]["request"] for e in _timed(trace, "request")) == list(range(REPEAT))
    for req in range(REPEAT):
        mine = [e for e in trace["traceEvents"] if e["ph"] != "M" and e["args"]["request"] == req]
        assert Counter((e["args"]["device"], e["args"]["fragment"]) for e in mine if e["args"]["kind"] == "compute") \
            == runs
        assert Counter((e["args"]["src"], e["args"]["dst"], e["args"]["tensor"]) for e in mine
                       if e["args"]["kind"] == "transfer") == sends
        assert Counter((e["args"]["src"], e["args"]["dst"], e["args"]["name"]) for e in mine
                       if e["args"]["kind"] == "recv") == recvs


def test_durations_agree_with_the_report_of_the_same_run(traced):
    trace, report = traced
    for f in report["fragments"]:
        durs = [e["dur"] / 1000 for e in _timed(trace, "compute") if e["args"]["fragment"] == f["id"]]
        assert len(durs) == REPEAT and statistics.median(durs) == pytest.approx(f["measured_ms"], abs=1e-4)
    for t in report["transfers"]:
        mine = [e for e in _timed(trace, "transfer") if (e["args"]["src"], e["args"]["dst"], e["args"]["tensor"])
                == (t["src"], t["dst"], t["tensor"])]
        assert len(mine) == REPEAT
        assert statistics.median(e["args"]["ms"] for e in mine) == pytest.approx(t["measured_ms"], abs=1e-4)
        assert all(e["dur"] == pytest.approx(max(e["args"]["ms"], 0) * 1000, abs=1e-3) for e in mine)
    latencies = [e["dur"] / 1000 for e in _timed(trace, "request")]
    assert statistics.median(latencies) == pytest.approx(report["latency"]["measured_ms"], abs=1e-4)


def test_a_workers_runs_never_overlap(traced):
    """A worker runs one fragment at a time: every run of a device is on one thread, whatever was in flight."""
    trace, _ = traced
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {threads[(e["pid"], e["tid"])] for e in _timed(trace, "compute")} == {"compute"}


def test_events_follow_each_workers_order(traced):
    """Each device's events on its own clock, in the order its worker did things: a run ends before the send
    of its output starts, and starts after its input arrived; every run lies within its request."""
    trace, _ = traced
    slack = 0.01  # microseconds: rounding
    bound = max(trace["otherData"]["clock_bound_ms"].values()) * 1000.0  # between two clocks, in microseconds
    for req in range(REPEAT):
        mine = {(e["args"]["kind"], e["name"]): e for e in trace["traceEvents"]
                if e["ph"] != "M" and e["args"]["request"] == req}
        request = mine[("request", f"request {req}")]
        f0, f1 = mine[("compute", "f0")], mine[("compute", "f1")]
        sent = next(e for (kind, _), e in mine.items() if kind == "transfer")
        arrived = next(e for (kind, _), e in mine.items() if kind == "recv")
        assert f0["ts"] + f0["dur"] <= sent["ts"] + slack and arrived["ts"] <= f1["ts"] + slack
        for run in (f0, f1):
            assert request["ts"] - 2 * bound <= run["ts"]
            assert run["ts"] + run["dur"] <= request["ts"] + request["dur"] + 2 * bound


# -- synthetic worker timings: every event at its stamp ----------------------------------------------------------
def _synthetic(pipeline, emulated: bool = False) -> dict:
    """pi5-a runs f0 (2 ms) and sends relu_5 to pi5-b, which runs f1 (3 ms). pi5-a's clock is 100 s ahead.
    Request 0 starts at 1.000 s: pi5-a starts f0 at 1.004 (busy before: later than the earliest moment the
    other stamps allow) and its send at 1.0065; pi5-b takes the tensor at 1.008, starts f1 at 1.009.
    Request 1 starts at 1.001: pi5-a starts f0 at 1.007, its send at 1.0095; pi5-b, running f1 until 1.012,
    takes the tensor at 1.012 and starts f1 at 1.0125."""
    m = load_manifest(pipeline / "manifest.json")
    offsets = {"pi5-a": ClockOffset(100.0, 1e-4), "pi5-b": ClockOffset(0.0, 1e-4)}
    trace = Trace(emulated=emulated)
    trace.add(m, {"pi5-a": ([2.0], [101.0065]), "pi5-b": ([3.0], [1.008])},
              {"pi5-a": [101.004], "pi5-b": [1.009]}, offsets, 1.000, 20.0)
    trace.add(m, {"pi5-a": ([2.0], [101.0095]), "pi5-b": ([3.0], [1.012])},
              {"pi5-a": [101.007], "pi5-b": [1.0125]}, offsets, 1.001, 25.0)
    return trace.as_json()


def _compute(trace: dict) -> dict[tuple[str, int], tuple[float, float]]:
    return {(e["name"], e["args"]["request"]): (e["ts"], e["dur"]) for e in _timed(trace, "compute")}


@pytest.mark.parametrize("emulated", [False, True])
def test_runs_are_where_their_workers_stamped_them(pipeline, emulated):
    """Worker clocks mapped through the offsets: an emulated run's stamp is its emulated start already."""
    trace = _synthetic(pipeline, emulated)
    assert _compute(trace) == {
        ("f0", 0): (4000.0, 2000.0),  # not where it would end as its send starts (4500)
        ("f0", 1): (7000.0, 2000.0),
        ("f1", 0): (9000.0, 3000.0),  # not at its tensor's arrival (8000)
        ("f1", 1): (12500.0, 3000.0),
    }
    transfers = {e["args"]["request"]: (e["ts"], e["dur"]) for e in _timed(trace, "transfer")}
    assert transfers == {0: (6500.0, 1500.0), 1: (9500.0, 2500.0)}  # clock offsets taken out
    assert {e["args"]["request"]: e["dur"] for e in _timed(trace, "request")} == {0: 20000.0, 1: 25000.0}
    assert trace["otherData"]["emulated"] is emulated


def test_a_run_before_the_request_by_clock_error_moves_the_origin(pipeline):
    """A stamp that an offset's error puts before its request's start is kept where it falls: every `ts`
    counts from the earliest event, so none is negative."""
    m = load_manifest(pipeline / "manifest.json")
    offsets = {"pi5-a": ClockOffset(0.0, 1e-4), "pi5-b": ClockOffset(0.0, 1e-4)}
    trace = Trace()
    trace.add(m, {"pi5-a": ([1.0], [2.0011]), "pi5-b": ([1.0], [2.0012])}, {"pi5-a": [1.99995], "pi5-b": [2.0013]},
              offsets, 2.0, 3.0)
    doc = trace.as_json()
    assert _compute(doc)[("f0", 0)] == (0.0, 1000.0) and _timed(doc, "request")[0]["ts"] == 50.0


def test_a_start_per_run_or_an_error(pipeline):
    m = load_manifest(pipeline / "manifest.json")
    offsets = {"pi5-a": ClockOffset(0.0, 0.0), "pi5-b": ClockOffset(0.0, 0.0)}
    times = {"pi5-a": ([1.0], [0.5]), "pi5-b": ([1.0], [0.6])}
    for starts in ({"pi5-a": [0.1]}, {"pi5-a": [0.1], "pi5-b": []}, {"pi5-a": [0.1], "pi5-b": [0.2, 0.3]}):
        with pytest.raises(RunError, match="device pi5-b: its worker stamped [0-9] run start"):
            Trace().add(m, times, starts, offsets, 0.0, 1.0)


def test_trace_and_samples_take_the_same_figures(pipeline):
    m = load_manifest(pipeline / "manifest.json")
    samples = Samples(m)
    offsets = {"pi5-a": ClockOffset(100.0, 1e-4), "pi5-b": ClockOffset(0.0, 1e-4)}
    times = {"pi5-a": ([2.5], [101.010]), "pi5-b": ([3.25], [1.0127])}
    samples.add(times, offsets)
    trace = Trace()
    trace.add(m, times, {"pi5-a": [101.0070], "pi5-b": [1.013]}, offsets, 1.0, 20.0)
    doc = trace.as_json()
    [transfer] = _timed(doc, "transfer")
    assert transfer["args"]["ms"] == pytest.approx(samples.transfer_ms[("pi5-a", "pi5-b", "relu_5")][0])
    assert {e["name"]: e["dur"] / 1000 for e in _timed(doc, "compute")} == \
        {fid: ms[0] for fid, ms in samples.fragment_ms.items()}


def test_cleared_trace_forgets_the_warm_up(pipeline):
    m = load_manifest(pipeline / "manifest.json")
    offsets = {"pi5-a": ClockOffset(0.0, 0.0), "pi5-b": ClockOffset(0.0, 0.0)}
    trace = Trace()
    trace.add(m, {"pi5-a": ([1.0], [0.5]), "pi5-b": ([1.0], [0.6])}, {"pi5-a": [0.2], "pi5-b": [0.7]}, offsets,
              0.0, 9.0)
    trace.clear()
    trace.add(m, {"pi5-a": ([1.0], [1.5]), "pi5-b": ([1.0], [1.6])}, {"pi5-a": [1.2], "pi5-b": [1.7]}, offsets,
              1.0, 7.0)
    doc = trace.as_json()
    assert [e["args"]["latency_ms"] for e in _timed(doc, "request")] == [7.0] and doc["otherData"]["requests"] == 1


# -- bad paths ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["missing/t.json", "."])
def test_bad_trace_path_fails_before_the_run(pipeline, tmp_path, where):
    target = tmp_path / where
    res = CliRunner().invoke(run_cmd, [str(pipeline), "--random-inputs", "--trace", str(target)])
    assert res.exit_code == 2
    [line] = res.stderr.splitlines()
    assert line.startswith(f"edgec: {target}: ") and "trace" in line.split(": ", 2)[2]
    assert "worker" not in res.stderr and not (tmp_path / "missing").exists()


def test_cli_writes_the_trace(pipeline, tmp_path):
    target = tmp_path / "t.json"
    res = CliRunner().invoke(run_cmd, [str(pipeline), "--random-inputs", "--repeat", "2", "--trace", str(target),
                                       "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(target.read_text())
    assert len(_timed(doc, "request")) == 2 and not list(tmp_path.glob(".t.json.*"))
    assert json.loads(res.stdout)["completed"] == 2


def test_a_trace_across_a_failover_names_each_requests_plan(tmp_path):
    """pi5-b's local worker is killed mid-run: every completed request is in the trace once, those after the
    switch with the fallback plan's fragments (pi5-a -> pi5-c)."""
    import signal

    from edgec.runtime.coordinator.failover import FailoverPool
    from edgec.runtime.coordinator.inputs import random_inputs
    from tests.runtime.test_failover import _compile as compile_with_fallbacks

    build = compile_with_fallbacks(tmp_path, fallbacks=True)
    m = load_manifest(build / "manifest.json")
    fallback = load_manifest(build / m.fallback_for("pi5-b").manifest)
    inputs = random_inputs(m.inputs, 0)
    trace = Trace()
    with FailoverPool(m, inflight=2, timeout=30, trace=trace) as cluster:
        def feed():
            for i in range(20):
                if i == 8:
                    os.kill(cluster.workers["pi5-b"].proc.pid, signal.SIGKILL)
                yield inputs
        assert len(list(cluster.stream(feed()))) == 20
    doc = trace.as_json()
    plans = {e["args"]["request"]: e["args"]["plan"] for e in _timed(doc, "request")}
    assert sorted(plans) == list(range(20)) and plans[19] == str(fallback.path) and plans[0] == str(m.path)
    by_path = {str(m.path): m, str(fallback.path): fallback}
    for e in _timed(doc, "compute"):
        assert by_path[plans[e["args"]["request"]]].fragments[e["args"]["fragment"]].device == e["args"]["device"]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"coordinator", "pi5-a", "pi5-b", "pi5-c"}
