"""Protocol version 3: `sync`/`synced` and the timings in `done` are validated like every other field, and a
worker times requests only when asked before the first one."""

from __future__ import annotations

import math
from types import SimpleNamespace

import msgpack
import pytest
import zmq

from edgec.runtime.errors import InputError
from edgec.runtime.manifest import load_manifest
from edgec.runtime.protocol import MAX_TIMED_STEPS, PROTOCOL_VERSION, parse
from edgec.runtime.session import Session
from edgec.runtime.transport import BadMessage, pack


def _frames(msg: dict) -> list[zmq.Frame]:
    return [zmq.Frame(pack(msg))]


DONE = {"t": "done", "req": 0, "run_ms": 1.5, "frag_ms": [0.5, 1.0], "clocks": [12.25, 12.5]}


def test_version_3():
    assert PROTOCOL_VERSION == 3


def test_valid_timing_messages_parse():
    assert parse(_frames(DONE), {"done"})[0]["clocks"] == [12.25, 12.5]
    assert parse(_frames({**DONE, "frag_ms": [], "clocks": []}), {"done"})[0]["frag_ms"] == []
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
])
def test_malformed_timings_are_bad_messages(change, problem):
    msg = {k: v for k, v in {**DONE, **change}.items() if v is not None}
    with pytest.raises(BadMessage, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse([zmq.Frame(msgpack.packb(msg))], {"done"})


def test_synced_clock_must_be_finite():
    with pytest.raises(BadMessage, match="'clock' holds 'nan'"):
        parse(_frames({"t": "synced", "seq": 0, "clock": math.nan}), {"synced"})


def test_a_done_of_max_timed_steps_fits_a_header():
    parse(_frames({**DONE, "frag_ms": [1.0 / 3] * (MAX_TIMED_STEPS // 2),
                   "clocks": [1e6 / 7] * (MAX_TIMED_STEPS - MAX_TIMED_STEPS // 2)}), {"done"})


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
    s.on_control(_frames({"t": "run", "req": 0}))
    with pytest.raises(InputError, match="asked for timings after the first request"):
        s.on_control(_frames({"t": "sync", "seq": 0}))
