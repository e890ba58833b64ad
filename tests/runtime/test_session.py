"""edgec.Cluster, the serving session: outputs equal onnxruntime on the whole model, from many threads at
once; a bad input fails its own request only; a full queue refuses at once; close() answers every accepted
request; a device lost without a fallback fails the requests accepted, naming it, and the session turns
not ready; with a fallback, every request is answered across the switch."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest

import edgec
from edgec.runtime.errors import InputError
from edgec.runtime.coordinator.inputs import random_inputs
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.serve.session import QueueFull, SessionClosed
from tests.runtime.test_failover import build  # noqa: F401 - the fixture: tinychain with fallbacks


def _reference(m, inputs: dict) -> dict:
    session = ort.InferenceSession(str(m.model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in m.outputs]
    return dict(zip(names, session.run(names, inputs)))


def _close(got: dict, ref: dict) -> bool:
    return set(got) == set(ref) and all(
        got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape
        and np.abs(got[k] - ref[k]).max() <= 1e-4 * max(1.0, float(np.abs(ref[k]).max())) for k in ref)


def test_requests_from_many_threads_equal_onnxruntime(chain):
    m = load_manifest(chain.path)
    requests = [random_inputs(m.inputs, seed) for seed in range(24)]
    with edgec.Cluster(chain.folder, inflight=2, timeout=30) as cluster:
        assert cluster.ready and cluster.inflight == 2
        assert _close(cluster.infer(requests[0]), _reference(m, requests[0]))
        with ThreadPoolExecutor(6) as pool:
            outputs = list(pool.map(cluster.infer, requests))
        futures = [cluster.submit(x, block=True) for x in requests]
        pipelined = [f.result(timeout=30) for f in futures]
    assert not cluster.ready
    for x, got, again in zip(requests, outputs, pipelined, strict=True):
        ref = _reference(m, x)
        assert _close(got, ref) and _close(again, ref)
    assert not np.array_equal(outputs[0]["prob"], outputs[1]["prob"])  # distinct requests, each its own answer


def test_a_bad_input_fails_that_request_only(chain):
    m = load_manifest(chain.path)
    good = random_inputs(m.inputs, 0)
    with edgec.Cluster(chain.folder, timeout=30) as cluster:
        for bad, what in (({}, "missing model input"), ({"nope": good["data"], "data": good["data"]}, "nope"),
                          ({"data": good["data"][:, :2]}, "shape"), ({"data": good["data"].astype(np.float64)}, "float64"),
                          ("data", "expected")):
            with pytest.raises(InputError, match=what):
                cluster.submit(bad)
        assert cluster.ready
        assert _close(cluster.infer(good), _reference(m, good))


def test_a_full_queue_refuses_at_once_and_close_answers_every_accepted_request(chain):
    m = load_manifest(chain.path)
    x = random_inputs(m.inputs, 3)
    accepted, refused = [], 0
    with edgec.Cluster(chain.folder, inflight=1, queue=2, timeout=30) as cluster:
        for _ in range(40):  # far faster than one request a millisecond: the queue of 2 fills
            try:
                accepted.append(cluster.submit(x))
            except QueueFull as exc:
                refused += 1
                assert "queue is full" in str(exc)
    assert refused > 0 and len(accepted) >= 2
    ref = _reference(m, x)
    assert all(f.done() and _close(f.result(), ref) for f in accepted)  # close() answered them all
    with pytest.raises(SessionClosed):
        cluster.submit(x)


def test_a_device_lost_without_fallback_fails_the_accepted_requests_naming_it(chain):
    m = load_manifest(chain.path)
    x = random_inputs(m.inputs, 4)
    with edgec.Cluster(chain.folder, timeout=30, heartbeat_ms=100) as cluster:
        cluster.infer(x)
        proc = cluster.pool.workers["pi4-a"].proc
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        failed = []
        for _ in range(3):
            try:
                failed.append(cluster.submit(x))
            except SessionClosed:  # the I/O thread noticed first
                break
        for f in failed:
            with pytest.raises(Exception, match="pi4-a"):
                f.result(timeout=30)
        deadline = time.monotonic() + 30
        while cluster.ready and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not cluster.ready
        with pytest.raises(SessionClosed, match="pi4-a"):
            cluster.submit(x)


def test_a_device_killed_mid_session_with_a_fallback_answers_every_request(build):  # noqa: F811
    m = load_manifest(build / "manifest.json")
    requests = [random_inputs(m.inputs, seed) for seed in range(60)]
    events: list[str] = []
    with edgec.Cluster(build, inflight=2, timeout=30) as cluster:
        cluster.listen(lambda event, _figures: events.append(event))
        futures = [cluster.submit(x, block=True) for x in requests[:30]]
        [f.result(timeout=30) for f in futures[:5]]
        os.kill(cluster.pool.workers["pi5-b"].proc.pid, signal.SIGKILL)
        futures += [cluster.submit(x, block=True) for x in requests[30:]]
        outputs = [f.result(timeout=60) for f in futures]
        assert cluster.ready
        assert [s["device"] for s in cluster.pool.failovers] == ["pi5-b"]
    assert events.count("failover") == 1 and events.count("done") == len(requests)
    for x, got in zip(requests, outputs, strict=True):
        assert _close(got, _reference(m, x))


def test_an_idle_session_answers_a_late_request_promptly(chain):
    """Between requests the I/O thread waits on its workers and on the wake pipe: a request arriving after a
    pause is issued at once, not after the poll interval (not timed here: it must simply be answered)."""
    m = load_manifest(chain.path)
    x = random_inputs(m.inputs, 5)
    with edgec.Cluster(chain.folder, timeout=30) as cluster:
        cluster.infer(x)
        time.sleep(1.2)  # past a ping interval: the workers stay connected while nothing is asked
        done = threading.Event()
        future = cluster.submit(x)
        future.add_done_callback(lambda _f: done.set())
        assert done.wait(30) and _close(future.result(), _reference(m, x))
