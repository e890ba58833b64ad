"""Protocol version 4: `sync`/`synced` and the timings in `done` (run_clocks since version 4) are validated
like every other field, a coordinator drops and logs a `done` that fails the checks, and a worker times
requests only when asked before the first one, stamping each run's start."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from types import SimpleNamespace

import msgpack
import pytest
import zmq

from edgec.runtime.coordinator.pool import WorkerPool
from edgec.runtime.coordinator.window import OpenRequest
from edgec.runtime.errors import InputError
from edgec.runtime.manifest.types import Run
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.wire.protocol import MAX_TIMED_STEPS, PROTOCOL_VERSION, parse
from edgec.runtime.device.session import Session
from edgec.runtime.device.steps import Steps
from edgec.runtime.coordinator.trace import Trace
from edgec.runtime.wire.transport import MAX_HEADER_BYTES, BadMessage, pack


def _frames(msg: dict) -> list[zmq.Frame]:
    return [zmq.Frame(pack(msg))]


DONE = {"t": "done", "req": 0, "run_ms": 1.5, "frag_ms": [0.5, 1.0], "run_clocks": [12.0, 12.1],
        "clocks": [12.25, 12.5]}


def test_version_9():
    assert PROTOCOL_VERSION == 9


def test_valid_timing_messages_parse():
    assert parse(_frames(DONE), {"done"})[0]["clocks"] == [12.25, 12.5]
    assert parse(_frames(DONE), {"done"})[0]["run_clocks"] == [12.0, 12.1]
    assert parse(_frames({**DONE, "frag_ms": [], "run_clocks": [], "clocks": []}), {"done"})[0]["frag_ms"] == []
    assert parse(_frames({"t": "synced", "seq": 3, "clock": 1234.5}), {"synced"})[0]["seq"] == 3
    assert parse(_frames({"t": "sync", "seq": 0}), {"sync"})[0]["t"] == "sync"


@pytest.mark.parametrize("change, problem", [
    ({"frag_ms": None}, "field 'frag_ms' missing or not list"),
    ({"clocks": {"a": 1.0}}, "field 'clocks' missing or not list"),
    ({"clocks": [1.0, "x"]}, "field 'clocks' holds 'x', not a finite number"),
    ({"frag_ms": [math.nan]}, "field 'frag_ms' holds 'nan'"),
    ({"clocks": [math.inf]}, "field 'clocks' holds 'inf'"),
    ({"frag_ms": [True]}, "field 'frag_ms' holds 'True'"),
    ({"clocks": [0.0] * (MAX_TIMED_STEPS + 1)}, f"at most {MAX_TIMED_STEPS}"),
    ({"run_clocks": None}, "field 'run_clocks' missing or not list"),  # a version 3 worker's `done`
    ({"run_clocks": [12.0, math.nan]}, "field 'run_clocks' holds 'nan'"),
    ({"run_clocks": [12.0, -math.inf]}, "field 'run_clocks' holds '-inf'"),
    ({"run_clocks": [12.0, "12.1"]}, "field 'run_clocks' holds '12.1', not a finite number"),
    ({"run_clocks": [12.0]}, "'run_clocks' must hold one start per entry of 'frag_ms'"),
    ({"run_clocks": [12.0, 12.1, 12.2]}, "'run_clocks' must hold one start per entry of 'frag_ms'"),
])
def test_malformed_timings_are_bad_messages(change, problem):
    msg = {k: v for k, v in {**DONE, **change}.items() if v is not None}
    with pytest.raises(BadMessage, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse([zmq.Frame(msgpack.packb(msg))], {"done"})


def test_synced_clock_must_be_finite():
    with pytest.raises(BadMessage, match="'clock' holds 'nan'"):
        parse(_frames({"t": "synced", "seq": 0, "clock": math.nan}), {"synced"})


@pytest.mark.parametrize("runs", [MAX_TIMED_STEPS, MAX_TIMED_STEPS // 2, 0])
def test_a_done_of_max_timed_steps_fits_a_header(runs):
    """Whatever mix of runs (two floats each) and sends or receives (one each)."""
    done = {**DONE, "req": 2**31, "run_ms": 1e6 / 9, "frag_ms": [1.0 / 3] * runs, "run_clocks": [1e6 / 3] * runs,
            "clocks": [1e6 / 7] * (MAX_TIMED_STEPS - runs)}
    assert len(pack(done)) <= MAX_HEADER_BYTES - 1024
    parse(_frames(done), {"done"})


# -- the coordinator: a `done` that fails the checks is dropped and logged --------------------------------------
class _Socket:
    """A worker's connection holding the given messages."""

    def __init__(self, *messages: dict):
        self.waiting = [zmq.Frame(pack(m)) for m in messages]  # one frame each (`more` is False)

    def getsockopt(self, option: int) -> int:
        assert option == zmq.EVENTS
        return zmq.POLLIN if self.waiting else 0

    def recv(self, flags: int = 0, copy: bool = True) -> zmq.Frame:
        if not self.waiting:
            raise zmq.Again()
        return self.waiting.pop(0)


def _tracing_cluster(chain) -> tuple[WorkerPool, OpenRequest]:
    cluster = WorkerPool(load_manifest(chain.path), trace=Trace())
    request = cluster.open[0] = OpenRequest(0)
    return cluster, request


def test_coordinator_drops_a_done_without_good_run_clocks(chain, caplog):
    cluster, request = _tracing_cluster(chain)
    w = cluster.workers["pi5-a"]
    good = {"t": "done", "req": 0, "run_ms": 1.0, "frag_ms": [1.0], "run_clocks": [5.0], "clocks": [5.002]}
    w.sock = _Socket({k: v for k, v in good.items() if k != "run_clocks"}, {**good, "run_clocks": [math.nan]},
                     {**good, "run_clocks": []}, {**good, "run_clocks": 5.0})
    with caplog.at_level(logging.WARNING, logger="edgec.runtime.wire.protocol"):
        cluster._drain(w)
    assert request.done == {} and request.starts == {} and request.times == {}
    logged = [r.getMessage() for r in caplog.records if r.name == "edgec.runtime.wire.protocol"]
    assert len(logged) == 4 and cluster.drops.total == 4
    assert all(line.startswith("coordinator: dropped a message (bad message from pi5-a: done: ") for line in logged)
    assert "'run_clocks' missing" in logged[0] and "'nan'" in logged[1] and "one start per entry" in logged[2]

    w.sock = _Socket(good)
    cluster._drain(w)
    assert request.done == {"pi5-a": 1.0} and request.starts == {"pi5-a": [5.0]}
    assert request.times == {"pi5-a": ([1.0], [5.002])}


def test_coordinator_refuses_a_worker_of_the_previous_version(chain):
    cluster, _ = _tracing_cluster(chain)
    welcome = {"t": "welcome", "protocol": PROTOCOL_VERSION - 1, "edgec": "0.9", "pid": 1, "threads": 1, "cores": 1,
               "key": None}
    with pytest.raises(InputError, match=f"speaks protocol {PROTOCOL_VERSION - 1}, this coordinator "
                                         f"{PROTOCOL_VERSION}: install the same edgec version on both"):
        cluster._on_welcome(cluster.workers["pi5-a"], welcome, None)


# -- the worker stamps each run's start -------------------------------------------------------------------------
class _Executor:
    """Notes this worker's clock when each run really starts; every run takes RUN_S."""

    RUN_S = 0.001

    def __init__(self, fragments):
        self.fragments = fragments
        self.entered: list[float] = []

    def run(self, fragment_id: str, store: dict) -> float:
        self.entered.append(time.monotonic())
        return self.RUN_S


def _running_session(chain, *steps, emulate: bool = False) -> tuple[Session, _Executor]:
    s, _ = _ready_session(chain)
    m = s.manifest
    s.manifest = SimpleNamespace(steps={"pi5-a": list(steps)})
    s.executor = _Executor(m.fragments)
    s.emulate, s.dilate, s.links, s.timings = emulate, 1.0, None, True
    return s, s.executor


def test_a_run_is_stamped_just_before_the_executor_runs_it(chain):
    s, executor = _running_session(chain, Run("f0"), Run("f0"))
    before = time.monotonic()
    steps = Steps(s, 0)
    steps.execute()
    assert len(steps.run_clocks) == 2 and steps.frag_ms == [1.0, 1.0]
    assert before <= steps.run_clocks[0] <= executor.entered[0] <= steps.run_clocks[1] <= executor.entered[1]


def test_an_untimed_session_stamps_nothing(chain):
    s, _ = _running_session(chain, Run("f0"))
    s.timings = False
    steps = Steps(s, 0)
    steps.execute()
    assert steps.run_clocks == [] and steps.frag_ms == []


def test_an_emulated_run_is_stamped_where_its_padding_counts_from(chain):
    """When the device was ready for it, which may be before the executor started: the emulated timeline."""
    s, executor = _running_session(chain, Run("f0"), Run("f0"), emulate=True)
    padded = 0.1  # s: room for a loaded machine, so that no run overruns its padding
    executor.fragments = {"f0": dataclasses.replace(executor.fragments["f0"], predicted_ms=padded * 1000.0)}
    steps = Steps(s, 0)
    ready = steps.ready = time.monotonic() - 0.0005
    steps.execute()
    assert steps.run_clocks == [ready, ready + padded] and steps.frag_ms == [padded * 1000.0] * 2
    assert steps.run_clocks[0] < executor.entered[0] and not steps.overruns


class _Daemon:
    endpoint = "tcp://127.0.0.1:1"

    def __init__(self):
        self.sent: list[dict] = []

    def send_to(self, peer, frames):
        self.sent.append(msgpack.unpackb(frames[0]))


def _ready_session(chain) -> tuple[Session, _Daemon]:
    d = _Daemon()
    s = Session(d, b"owner", "peer")
    s.manifest, s.device, s.state = load_manifest(chain.path, check_files=False), "pi5-a", "ready"
    s.inbox = SimpleNamespace(base=0, window=1)
    return s, d


def test_sync_switches_timings_on_and_answers_with_the_clock(chain):
    s, d = _ready_session(chain)
    s.on_control(_frames({"t": "sync", "seq": 7}))
    assert s.timings and d.sent[-1]["t"] == "synced" and d.sent[-1]["seq"] == 7
    assert isinstance(d.sent[-1]["clock"], float)


def test_sync_after_the_first_request_is_refused(chain):
    s, _ = _ready_session(chain)
    s.on_control(_frames({"t": "run", "req": 0, "slow": 1.0}))
    with pytest.raises(InputError, match="asked for timings after the first request"):
        s.on_control(_frames({"t": "sync", "seq": 0}))


def test_an_emulated_slow_down_outside_emulation_is_refused(chain):
    s, _ = _ready_session(chain)
    with pytest.raises(InputError, match="asks for an emulated slow-down, but the run is not emulated"):
        s.on_control(_frames({"t": "run", "req": 0, "slow": 3.0}))


def test_an_emulated_slow_down_pads_that_request_only(chain):
    s, _ = _ready_session(chain)
    s.emulate, s.inbox = True, SimpleNamespace(base=0, window=2)
    s.on_control(_frames({"t": "run", "req": 0, "slow": 3.0}))
    s.on_control(_frames({"t": "run", "req": 1, "slow": 1.0}))
    assert s.slow == {0: 3.0}
