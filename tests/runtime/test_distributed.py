"""`edgec worker` daemons on loopback, reached by `edgec run --addresses`, with and without keys: results verify,
fragments are cached, peers without the keys (or with the wrong ones) change nothing, bad frames and floods
are dropped without growing memory, streaming returns the same outputs in order."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from click.testing import CliRunner

import edgec
from edgec.runtime.front.cli import keygen as keygen_cmd, run as run_cmd
from edgec.runtime.device.worker import worker as worker_cmd
from edgec.runtime.coordinator.pool import WorkerPool
from edgec.runtime.coordinator.connect import load_keys
from edgec.runtime.errors import InputError
from edgec.runtime.coordinator.inputs import random_inputs
from edgec.runtime.wire.keys import Keyring, keygen
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.wire.protocol import PROTOCOL_VERSION
from edgec.runtime.manifest.schedule import pipeline_depth
from edgec.runtime.wire.transport import pack, send_tensor
from edgec.runtime.coordinator.verify import reference_outputs

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = REPO / "tests" / "e2e" / "clusters"
MEMBERS = ["pi5-a", "pi5-b", "pi4-a", "pi4-b"]


# -- fixtures -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    keygen(folder, ["coordinator", *MEMBERS])
    return folder


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    """tinychain as a two-stage pipeline pi5-a -> pi5-b (pi4-a and pi4-b get no steps)."""
    out = tmp_path_factory.mktemp("pipeline") / "build"
    edgec.compile(MODELS / "tinychain.onnx", CLUSTERS / "four.yaml", out, strategy="pipeline", objective="throughput")
    m = load_manifest(out / "manifest.json")
    assert [d for d in m.device_names if m.steps.get(d)] == ["pi5-a", "pi5-b"]
    return out


@pytest.fixture(scope="module")
def spatial_build(tmp_path_factory) -> Path:
    """tinyconv with its first layers split by rows over pi5-a and pi4-a."""
    out = tmp_path_factory.mktemp("spatial") / "build"
    edgec.compile(MODELS / "tinyconv.onnx", CLUSTERS / "two.yaml", out, strategy="spatial")
    return out


class Worker:
    """An `edgec worker` subprocess on 127.0.0.1 (a free port), with its own cache folder."""

    def __init__(self, folder: Path, *args: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.cache = folder / "cache"
        self.log_file = folder / "stderr.log"
        # Append mode, and read through another open file: the worker's offset is never moved under it.
        with open(self.log_file, "ab") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edgec.runtime.device.worker", "--listen", "tcp://127.0.0.1:0", "--cache",
                 str(self.cache), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True)
        line = self.proc.stdout.readline()
        m = re.fullmatch(r"edgec worker: listening on (tcp://127\.0\.0\.1:\d+)\n", line)
        assert m, (line, self.log())
        self.address = m.group(1)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 10.0) -> bool:
        """The worker logs after it answers: a line may land a moment after the coordinator returns."""
        deadline = time.monotonic() + timeout
        while text not in self.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        return text in self.log()

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
        raise AssertionError("no VmRSS")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()


def killable_workers(folder: Path, names: list[str], *args: str):
    """A generator for a fixture: an `edgec worker` per name on loopback (dict name -> Worker); at teardown
    every one is stopped, and those the test did not kill must have stopped cleanly on SIGTERM (exit 0)."""
    started = {name: Worker(folder / name, *args) for name in names}
    yield started
    killed = {name for name, w in started.items() if w.proc.poll() is not None}
    codes = {name: w.stop() for name, w in started.items()}
    assert all(codes[name] == 0 for name in started if name not in killed), codes


@pytest.fixture
def start_worker(tmp_path):
    started: list[Worker] = []

    def start(name: str, *args: str) -> Worker:
        w = Worker(tmp_path / f"worker-{name}-{len(started)}", *args)
        started.append(w)
        return w

    yield start
    codes = [w.stop() for w in started]
    assert all(w.proc.poll() is not None for w in started)
    assert codes == [0] * len(codes), codes  # SIGTERM ends a worker with exit code 0


def keyed(start_worker, keys: Path, name: str) -> Worker:
    return start_worker(name, "--keys", str(keys), "--name", name, "--threads", "1")


def edgec_run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgec.runtime", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def one_line_error(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("edgec: warning")]
    assert len(lines) == 1 and lines[0].startswith("edgec: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def cluster(build: Path, keys: Path | None, **kwargs) -> WorkerPool:
    return WorkerPool(load_manifest(build / "manifest.json"), keys=load_keys(keys), timeout=30, **kwargs)


# -- runs across workers --------------------------------------------------------------------------------------
def test_pipeline_on_keyed_workers_verifies_and_a_second_run_sends_no_fragments(pipeline, keys, start_worker):
    a, b = keyed(start_worker, keys, "pi5-a"), keyed(start_worker, keys, "pi5-b")
    addresses = {"pi5-a": a.address, "pi5-b": b.address}
    first = edgec.run(pipeline, random_inputs=True, verify=True, addresses=addresses, keys=keys, repeat=3)
    assert first["verify"]["passed"] and first["inflight"] == 5 and first["throughput_ips"] > 0
    assert set(first["devices"]) == {"pi5-a", "pi5-b"}  # pi4-a and pi4-b have no steps: no worker
    for name, w in (("pi5-a", a), ("pi5-b", b)):
        dev = first["devices"][name]
        assert dev["address"] == w.address and not dev["local"] and dev["requests"] == 4
        assert dev["fragment_bytes_received"] == dev["fragment_bytes_sent"] > 0
    assert first["devices"]["pi5-b"]["bytes_received"] > 0  # pi5-a's tensors, straight from pi5-a
    second = edgec.run(pipeline, random_inputs=True, verify=True, addresses=addresses, keys=keys)
    assert second["verify"]["passed"]
    assert all(d["fragment_bytes_received"] == d["fragment_bytes_sent"] == 0 for d in second["devices"].values())
    assert a.wait_for_log("run ended: 2 request(s)") and "run ended: 4 request(s)" in a.log()


def test_adapt_switches_between_sessions_on_the_same_remote_workers(tmp_path, keys, start_worker):
    """run --adapt across keyed remote workers: pi5-a slowed 5x (emulated) from request 6 on, the run ends its
    session on both workers and opens the fallback without pi5-a on pi5-b's, every output verified."""
    build = tmp_path / "build"
    edgec.compile(MODELS / "tinychain.onnx", CLUSTERS / "four.yaml", build, strategy="pipeline",
                  objective="throughput", fallbacks=True)
    a, b = keyed(start_worker, keys, "pi5-a"), keyed(start_worker, keys, "pi5-b")
    report = edgec.run(build, random_inputs=True, verify=True, addresses={"pi5-a": a.address, "pi5-b": b.address},
                       keys=keys, emulate=True, dilate=20.0, repeat=20, adapt=True, adapt_threshold=0.5,
                       slow={"pi5-a": (6, 5.0)})
    assert report["verify"]["passed"] and report["verify"]["requests_checked"] == 21
    assert report["completed"] == 20 and report["lost"] == 0
    # On a loaded machine the first re-costing after the slow-down may blame a link out of pi5-a and switch once
    # more on the way; the last switch is the one the slow-down calls for.
    switches = [x for x in report["adaptations"] if x["to"] != x["from"]]
    assert switches and switches[-1]["to"] == "fallback-pi5-a/manifest.json", switches
    assert 6 <= switches[-1]["switched_at"] <= 20 and "compute of pi5-a at 5.00x" in switches[-1]["reason"]
    sessions = {"pi5-a": 1 + sum(s["to"] != "fallback-pi5-a/manifest.json" for s in switches),  # a session per plan
                "pi5-b": 1 + sum(s["to"] != "fallback-pi5-b/manifest.json" for s in switches)}  # the worker is in
    deadline = time.monotonic() + 10.0  # a worker logs the end of a session a moment after it answers
    while b.log().count("run ended") < sessions["pi5-b"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (a.log().count("run ended"), b.log().count("run ended")) == (sessions["pi5-a"], sessions["pi5-b"]), \
        (switches, a.log(), b.log())


def test_spatial_plan_mixing_a_local_and_a_keyed_remote_worker(spatial_build, keys, start_worker):
    remote = keyed(start_worker, keys, "pi4-a")
    proc = edgec_run(spatial_build, "--random-inputs", "--verify", "--json", "--keys", keys, "--addresses",
                     f"pi4-a={remote.address}")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verify"]["passed"]
    assert report["devices"]["pi5-a"]["local"] and not report["devices"]["pi4-a"]["local"]
    assert report["devices"]["pi4-a"]["bytes_received"] > 0 and report["devices"]["pi4-a"]["bytes_sent"] > 0


def test_a_device_without_steps_is_never_contacted(pipeline):
    """pi4-a has no steps: an address nobody listens on is never tried."""
    report = edgec.run(pipeline, random_inputs=True, verify=True, addresses={"pi4-a": "tcp://127.0.0.1:9"},
                       timeout=20)
    assert report["verify"]["passed"] and set(report["devices"]) == {"pi5-a", "pi5-b"}


def test_a_second_coordinator_is_refused_while_a_run_is_on(pipeline, keys, start_worker):
    a, b = keyed(start_worker, keys, "pi5-a"), keyed(start_worker, keys, "pi5-b")
    addresses = {"pi5-a": a.address, "pi5-b": b.address}
    inputs = random_inputs(load_manifest(pipeline / "manifest.json").inputs, 0)
    with cluster(pipeline, keys, addresses=addresses) as first:
        first.infer(inputs)
        proc = edgec_run(pipeline, "--random-inputs", "--keys", keys, "--addresses", f"pi5-a={a.address}",
                         "--addresses", f"pi5-b={b.address}")
        line = one_line_error(proc)
        assert re.search(r"device pi5-[ab] ", line) and "busy with the run of another coordinator" in line
        first.infer(inputs)  # the first run goes on undisturbed
    assert edgec.run(pipeline, random_inputs=True, addresses=addresses, keys=keys)["outputs"]  # then it is free


def test_sigterm_during_a_run_ends_the_worker_and_fails_the_run_cleanly(pipeline, keys, start_worker):
    a, b = keyed(start_worker, keys, "pi5-a"), keyed(start_worker, keys, "pi5-b")
    inputs = random_inputs(load_manifest(pipeline / "manifest.json").inputs, 0)
    with cluster(pipeline, keys, addresses={"pi5-a": a.address, "pi5-b": b.address}) as c:
        c.infer(inputs)
        b.proc.send_signal(signal.SIGTERM)
        assert b.proc.wait(timeout=15) == 0
        with pytest.raises(Exception, match="pi5-b"):
            for _ in range(50):
                c.infer(inputs)
    assert b.wait_for_log("stopping")
    assert not [p for p in b.cache.iterdir() if p.name.startswith(".")]  # no temporary files left
    assert [p.suffix for p in b.cache.iterdir()] == [".onnx"]


# -- keys ----------------------------------------------------------------------------------------------------
def test_keygen_layout_and_rerun(tmp_path):
    res = CliRunner().invoke(keygen_cmd, [str(tmp_path / "k"), "--devices", str(CLUSTERS / "two.yaml")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "k" / "public").iterdir()) == ["coordinator.key", "pi4-a.key", "pi5-a.key"]
    secret = tmp_path / "k" / "private" / "pi5-a.key_secret"
    assert oct(secret.stat().st_mode & 0o777) == "0o600" and oct((tmp_path / "k" / "private").stat().st_mode & 0o777) == "0o700"
    before = secret.read_bytes()
    res = CliRunner().invoke(keygen_cmd, [str(tmp_path / "k"), "--name", "pi5-a", "--name", "pi5-c"])
    assert res.exit_code == 0 and "kept    pi5-a" in res.output and "created pi5-c" in res.output
    assert secret.read_bytes() == before  # never overwritten
    ring = Keyring.load(tmp_path / "k", "pi5-c")
    assert set(ring.trusted) == {"coordinator", "pi4-a", "pi5-a", "pi5-c"} and ring.public == ring.trusted["pi5-c"]
    (tmp_path / "k" / "public" / "pi4-a.key").unlink()
    res = CliRunner().invoke(keygen_cmd, [str(tmp_path / "k"), "--name", "pi4-a"])
    assert res.exit_code == 2 and "pi4-a.key: missing" in res.stderr
    res = CliRunner().invoke(keygen_cmd, [str(tmp_path / "k"), "--name", "../evil"])
    assert res.exit_code == 2 and not (tmp_path / "evil.key").exists()


def test_wrong_keys_exit_2_at_once(pipeline, keys, start_worker, tmp_path):
    a, b = keyed(start_worker, keys, "pi5-a"), keyed(start_worker, keys, "pi5-b")
    other = tmp_path / "other-cluster"
    keygen(other, ["coordinator", *MEMBERS])
    addresses = ["--addresses", f"pi5-a={a.address}", "--addresses", f"pi5-b={b.address}"]
    start = time.monotonic()
    line = one_line_error(edgec_run(pipeline, "--random-inputs", "--keys", other, *addresses))
    assert "secure handshake failed" in line and "keys do not match" in line
    line = one_line_error(edgec_run(pipeline, "--random-inputs", *addresses))
    assert "secure handshake failed" in line and "requires keys" in line
    assert time.monotonic() - start < 30  # detected from the handshake, not by waiting out --timeout (60 s)


def test_a_handshake_that_fails_before_the_first_message_is_reported_as_such(pipeline, keys, start_worker,
                                                                              monkeypatch):
    """A keyless coordinator's handshake with a CURVE worker can fail before the coordinator queues its hello,
    which leaves the socket no pipe to send on: the hello must wait watching the connection's monitor, and
    report the handshake (exit 2), not wait out the timeout and report that nothing was accepted (CI saw it)."""
    a, b = keyed(start_worker, keys, "pi5-a"), keyed(start_worker, keys, "pi5-b")
    connect = WorkerPool._connect

    def connect_then_wait(self, w):
        connect(self, w)
        time.sleep(0.5)  # the handshake fails meanwhile, on loopback within milliseconds

    monkeypatch.setattr(WorkerPool, "_connect", connect_then_wait)
    start = time.monotonic()
    with pytest.raises(InputError, match="the worker requires keys"):
        with WorkerPool(load_manifest(pipeline / "manifest.json"), timeout=20,
                        addresses={"pi5-a": a.address, "pi5-b": b.address}):
            pass
    assert time.monotonic() - start < 10


def test_a_worker_refuses_a_reachable_address_without_keys():
    for address in ("tcp://0.0.0.0:0", "tcp://192.0.2.1:5555", "tcp://*:0"):
        res = CliRunner().invoke(worker_cmd, ["--listen", address])
        assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
        assert "without --keys" in res.stderr and res.stderr.startswith("edgec: ")


def test_an_unreachable_worker_exits_2_naming_device_and_address(pipeline):
    start = time.monotonic()
    line = one_line_error(edgec_run(pipeline, "--random-inputs", "--timeout", "1.5", "--addresses",
                                    "pi5-b=tcp://127.0.0.1:9"))
    assert "device pi5-b" in line and "tcp://127.0.0.1:9" in line and "within 1.5 s" in line
    assert time.monotonic() - start < 30


def test_a_worker_of_another_protocol_version(pipeline, start_worker):
    """A real worker refuses a coordinator speaking an older or a newer version; the coordinator refuses a
    worker that answers with the previous version (a stand-in worker here): exit 2, one line, both ways."""
    w = start_worker("plain")
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(w.address)
        for version in (PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1):
            dealer.send(pack({"t": "hello", "protocol": version, "edgec": "9.9"}))
            assert dealer.poll(10_000)
            answer = msgpack.unpackb(dealer.recv())
            assert answer["t"] == "refused" and answer["code"] == "version" and answer["protocol"] == PROTOCOL_VERSION
            assert f"this coordinator {version} " in answer["reason"]

        fake = ctx.socket(zmq.ROUTER)
        port = fake.bind_to_random_port("tcp://127.0.0.1")

        def old_worker():
            if fake.poll(30_000):
                peer, _ = fake.recv_multipart()
                fake.send_multipart([peer, pack({"t": "welcome", "protocol": PROTOCOL_VERSION - 1, "edgec": "0.1",
                                                 "pid": 1, "threads": 0, "cores": 1, "key": None})])

        thread = threading.Thread(target=old_worker)
        thread.start()
        proc = edgec_run(pipeline, "--random-inputs", "--timeout", "20", "--addresses",
                         f"pi5-b=tcp://127.0.0.1:{port}")
        thread.join()
        line = one_line_error(proc)
        assert "pi5-b" in line
        assert f"speaks protocol {PROTOCOL_VERSION - 1}, this coordinator {PROTOCOL_VERSION}" in line
    finally:
        ctx.destroy(linger=0)


# -- hostile peers ---------------------------------------------------------------------------------------------
def _expected(build: Path, inputs: dict) -> dict:
    return reference_outputs(load_manifest(build / "manifest.json"), inputs)


def _send_forever(stop: threading.Event, make_socket, messages) -> None:
    sock = make_socket()
    try:
        while not stop.is_set():
            for frames in messages:
                try:
                    sock.send_multipart(frames, flags=zmq.NOBLOCK)
                except zmq.Again:
                    time.sleep(0.001)
    finally:
        sock.close(linger=0)


def test_peers_without_the_right_key_cannot_change_a_result(pipeline, keys, start_worker, tmp_path):
    """While requests stream, pi5-b's data socket is fed well-formed 'relu_5 from pi5-a' tensors of zeros for
    every request id: by a socket with no keys, by one with a key outside the cluster, and by a cluster
    member (pi4-a) posing as pi5-a. Every output still equals the reference, and the run ends normally."""
    a, b = keyed(start_worker, keys, "pi5-a"), keyed(start_worker, keys, "pi5-b")
    m = load_manifest(pipeline / "manifest.json")
    recv = next(s for s in m.steps["pi5-b"] if type(s).__name__ == "Recv")
    shape = next(t.shape for t in m.transfers if t.dst == "pi5-b")
    keygen(tmp_path / "stranger", ["stranger"])
    stranger = Keyring.load(tmp_path / "stranger", "stranger")
    member = Keyring.load(keys, "pi4-a")
    requests = [random_inputs(m.inputs, seed) for seed in range(30)]
    stop = threading.Event()
    with cluster(pipeline, keys, addresses={"pi5-a": a.address, "pi5-b": b.address}, inflight=2) as c:
        target = c.workers["pi5-b"].data_addr
        b_key = c.workers["pi5-b"].key
        forgeries = [send_frames(req, recv.src, recv.tensor, np.zeros(shape, np.float32)) for req in range(40)]

        def plain():
            s = c.ctx.socket(zmq.PUSH)
            s.connect(target)
            return s

        def with_keys(ring):
            def make():
                s = c.ctx.socket(zmq.PUSH)
                ring.connect_to(s, b_key)
                s.connect(target)
                return s
            return make

        threads = [threading.Thread(target=_send_forever, args=(stop, maker, forgeries))
                   for maker in (plain, with_keys(stranger), with_keys(member))]
        for t in threads:
            t.start()
        try:
            time.sleep(0.3)
            got = [out for out, _, _ in c.stream(requests)]
        finally:
            stop.set()
            for t in threads:
                t.join()
    assert c.device_report()["pi5-b"]["dropped"] > 0  # the member's forgeries arrived, and were dropped
    for inputs, out in zip(requests, got):
        want = _expected(pipeline, inputs)
        assert all(np.array_equal(out[k], want[k]) or np.allclose(out[k], want[k], atol=1e-5) for k in want)
        assert not all(np.array_equal(out[k], np.zeros_like(out[k])) for k in out)


def test_a_run_without_keys_makes_its_own_so_no_other_process_can_feed_its_workers(pipeline, tmp_path):
    """No --keys, every worker started by the run: the run makes keys of its own, so pi5-b's data socket takes
    nothing from a plain socket or from a key outside the run, even well-formed tensors for every request id.
    Every output equals the reference; the run's keys never touch the disk."""
    m = load_manifest(pipeline / "manifest.json")
    recv = next(s for s in m.steps["pi5-b"] if type(s).__name__ == "Recv")
    shape = next(t.shape for t in m.transfers if t.dst == "pi5-b")
    keygen(tmp_path / "stranger", ["stranger"])
    stranger = Keyring.load(tmp_path / "stranger", "stranger")
    requests = [random_inputs(m.inputs, seed) for seed in range(30)]
    stop = threading.Event()
    with cluster(pipeline, None, inflight=2) as c:
        assert c.ephemeral and c.keys.folder is None  # the run's keys live in memory only
        target, b_key = c.workers["pi5-b"].data_addr, c.workers["pi5-b"].key
        assert b_key is not None  # pi5-b serves CURVE
        forgeries = [send_frames(req, recv.src, recv.tensor, np.zeros(shape, np.float32)) for req in range(40)]

        def plain():
            s = c.ctx.socket(zmq.PUSH)
            s.connect(target)
            return s

        def stranger_socket():
            s = c.ctx.socket(zmq.PUSH)
            stranger.connect_to(s, b_key)
            s.connect(target)
            return s

        threads = [threading.Thread(target=_send_forever, args=(stop, maker, forgeries))
                   for maker in (plain, stranger_socket)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.3)
            got = [out for out, _, _ in c.stream(requests)]
        finally:
            stop.set()
            for t in threads:
                t.join()
    assert c.device_report()["pi5-b"]["dropped"] == 0  # nothing got as far as the worker's checks
    for inputs, out in zip(requests, got):
        want = _expected(pipeline, inputs)
        assert all(np.allclose(out[k], want[k], atol=1e-5) for k in want)


def send_frames(req, src, name, array):
    from edgec.runtime.wire.transport import tensor_frames

    return [bytes(f) if not isinstance(f, bytes) else f for f in tensor_frames(req, src, name, array)]


GARBAGE = [
    [b"\xc1"],  # not msgpack
    [b"\x92\x01\x02"],  # msgpack, not a map
    [pack({"t": 5})],
    [pack({"t": "tensor", "req": "zero", "src": "pi5-a", "tensor": "x", "dtype": "float32", "shape": [1],
           "codec": "none"}), b"\0" * 4],
    [pack({"t": "tensor", "req": 0, "src": "pi5-a", "tensor": "relu_5", "dtype": "float32", "shape": [10 ** 12],
           "codec": "none"}), b"\0" * 4],
    [pack({"t": "tensor", "req": 0, "src": "pi5-a", "tensor": "relu_5", "dtype": "complex256", "shape": [1],
           "codec": "none"}), b"\0" * 4],
    [pack({"t": "tensor", "req": 0, "src": "pi5-a", "tensor": "relu_5", "dtype": "float32", "shape": [2],
           "codec": "lzma"}), b"\0" * 8],
    [pack({"t": "tensor", "req": 0, "src": "pi5-a", "tensor": "relu_5", "dtype": "float32", "shape": [1] * 40,
           "codec": "none"}), b"\0" * 4],
    [pack({"t": "run", "req": 0}), b"extra", b"frames"],
    [pack({"t": "hello", "protocol": "1", "edgec": 1})],
    [pack({"t": "end"})],
    [b"\xdf\xff\xff\xff\xff"],  # a map claiming 4 billion entries
    [b"\x91" * 5000],  # nesting deeper than msgpack's stack
]


def test_garbage_frames_leave_the_worker_serving(pipeline, start_worker):
    """Garbage on the control socket (from a stranger) and on the data socket (during a run): dropped and
    logged; the run in progress and the next one verify."""
    a, b = start_worker("a"), start_worker("b")
    addresses = {"pi5-a": a.address, "pi5-b": b.address}
    m = load_manifest(pipeline / "manifest.json")
    inputs = random_inputs(m.inputs, 1)
    want = _expected(pipeline, inputs)
    ctx = zmq.Context()
    try:
        stranger = ctx.socket(zmq.DEALER)
        stranger.connect(b.address)
        for frames in GARBAGE:
            stranger.send_multipart(frames)
        with cluster(pipeline, None, addresses=addresses) as c:
            push = ctx.socket(zmq.PUSH)
            push.connect(c.workers["pi5-b"].data_addr)
            for frames in GARBAGE:
                push.send_multipart(frames)
            time.sleep(0.5)
            for out, _, _ in c.stream([inputs] * 5):
                assert all(np.allclose(out[k], want[k], atol=1e-5) for k in want)
        assert c.device_report()["pi5-b"]["dropped"] >= len(GARBAGE) - 1
    finally:
        ctx.destroy(linger=0)
    assert b.proc.poll() is None and "dropped a message" in b.log() and "Traceback" not in b.log()
    assert edgec.run(pipeline, inputs=inputs, verify=True, addresses=addresses)["verify"]["passed"]


def test_a_flood_of_future_requests_does_not_grow_the_worker(pipeline, start_worker):
    """400 well-formed 1 MiB tensors for request ids beyond the in-flight window: refused as they arrive;
    the worker's memory stays flat (the issue saw 65 MB grow to 365 MB, for good)."""
    a, b = start_worker("a"), start_worker("b", "--verbose")  # verbose: every drop is logged, to count them
    m = load_manifest(pipeline / "manifest.json")
    inputs = random_inputs(m.inputs, 2)
    recv = next(s for s in m.steps["pi5-b"] if type(s).__name__ == "Recv")
    big = np.ones(1 << 18, np.float32)  # 1 MiB
    with cluster(pipeline, None, addresses={"pi5-a": a.address, "pi5-b": b.address}) as c:
        for _ in c.stream([inputs] * 20):
            pass
        before = b.rss_mb()
        push = c.ctx.socket(zmq.PUSH)
        push.connect(c.workers["pi5-b"].data_addr)
        for i in range(400):
            send_tensor(push, 1000 + i, recv.src, recv.tensor, big)
        deadline = time.monotonic() + 60
        while b.log().count("outside the window") < 400 and time.monotonic() < deadline:
            c.infer(inputs)  # the run goes on meanwhile (and keeps the session alive)
        after = b.rss_mb()
        for _ in c.stream([inputs] * 3):
            pass
    seen = {int(x) for x in re.findall(r"request (\d+) outside the window", b.log())}
    assert seen >= set(range(1000, 1400)), sorted(set(range(1000, 1400)) - seen)
    assert c.device_report()["pi5-b"]["dropped"] >= 400
    assert after - before < 25, (before, after)


def test_a_fragment_outside_the_build_folder_exits_2_without_a_hash(pipeline, tmp_path):
    import shutil

    build = tmp_path / "build"
    shutil.copytree(pipeline, build)
    data = json.loads((build / "manifest.json").read_text())
    secret = tmp_path / "secret.onnx"
    secret.write_bytes(b"not yours")
    digest = __import__("hashlib").sha256(secret.read_bytes()).hexdigest()
    for file in (str(secret), "../secret.onnx"):
        data["fragments"][0]["file"] = file
        (build / "manifest.json").write_text(json.dumps(data))
        line = one_line_error(edgec_run(build, "--random-inputs"))
        # the line names the path as given (a long one shortened in its middle, so its end is what is checked)
        assert "fragments[0].file" in line and "not a path inside the build folder" in line
        assert "secret.onnx' is not a path" in line, line
        assert digest[:8] not in line
    (build / "link.onnx").symlink_to(secret)
    data["fragments"][0]["file"] = "link.onnx"
    (build / "manifest.json").write_text(json.dumps(data))
    line = one_line_error(edgec_run(build, "--random-inputs"))
    assert "'link.onnx' is outside the build folder" in line and digest[:8] not in line


# -- streaming -----------------------------------------------------------------------------------------------
def test_streaming_returns_the_same_outputs_in_request_order(pipeline):
    m = load_manifest(pipeline / "manifest.json")
    requests = [random_inputs(m.inputs, seed) for seed in range(12)]
    with WorkerPool(m, inflight=4, timeout=30) as c:
        assert c.inflight == 4
        streamed = [out for out, _, _ in c.stream(requests)]
        one_by_one = [c.infer(x)[0] for x in requests]
    assert len(streamed) == len(requests)
    for a, b in zip(streamed, one_by_one):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)  # bitwise
    assert not all(np.array_equal(streamed[0][k], streamed[1][k]) for k in streamed[0])  # distinct requests
    report = edgec.run(pipeline, random_inputs=True, repeat=8, inflight=4)
    assert report["inflight"] == 4 and report["throughput_ips"] > 0 and len(report["latencies_ms"]) == 8


def test_pipeline_depth_of_a_chain(chain):
    # the input in, two stages, the link between them and the output out
    assert pipeline_depth(load_manifest(chain.path)) == 5


def test_pipeline_depth_of_a_scatter_gather(spatial):
    # a scatters to b and c, which send back to a: three rounds, so seven resources on the chain (three
    # devices, two links and the coordinator's two hand-offs, which is also the cap)
    assert pipeline_depth(load_manifest(spatial.path)) == 7



def test_pipeline_depth_is_capped_by_the_working_devices_and_links(spatial_build):
    # pi5-a scatters rows to pi4-a and gathers them back: three rounds, but two devices, one link and the
    # coordinator's two hand-offs
    assert pipeline_depth(load_manifest(spatial_build / "manifest.json")) == 5


def test_rss_stays_flat_over_1000_streamed_requests(pipeline, start_worker):
    a, b = start_worker("a"), start_worker("b")
    m = load_manifest(pipeline / "manifest.json")
    inputs = random_inputs(m.inputs, 3)
    with cluster(pipeline, None, addresses={"pi5-a": a.address, "pi5-b": b.address}, inflight=2) as c:
        for _ in c.stream([inputs] * 100):
            pass
        before = [a.rss_mb(), b.rss_mb(), _own_rss()]
        for _ in c.stream([inputs] * 1000):
            pass
        after = [a.rss_mb(), b.rss_mb(), _own_rss()]
    drift = [(y - x) / x for x, y in zip(before, after)]
    print("RSS MB before/after 1000 requests (worker a, worker b, coordinator):", before, after)
    assert all(d < 0.05 for d in drift), (before, after)


def _own_rss() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise AssertionError


def test_bad_keys_folder_and_addresses_are_input_errors(pipeline, tmp_path):
    with pytest.raises(InputError, match="not a keys folder"):
        edgec.run(pipeline, random_inputs=True, keys=tmp_path)
    with pytest.raises(InputError, match="no device 'nope'"):
        edgec.run(pipeline, random_inputs=True, addresses={"nope": "tcp://127.0.0.1:1"})
    with pytest.raises(InputError, match="not an address of the form"):
        edgec.run(pipeline, random_inputs=True, addresses={"pi5-a": "10.0.0.1:5555"})
    res = CliRunner().invoke(run_cmd, [str(pipeline), "--random-inputs", "--addresses", "pi5-a"])
    assert res.exit_code == 2 and "expected NAME=tcp://HOST:PORT" in res.stderr


@pytest.mark.slow
def test_a_worker_holding_resnet50_fragments_uses_at_most_their_weights_plus_120_mb(tmp_path, start_worker):
    out = tmp_path / "resnet50"
    from edgec.models import ensure

    edgec.compile(ensure("resnet50"), CLUSTERS / "two.yaml", out, strategy="pipeline",
                  objective="throughput")
    m = load_manifest(out / "manifest.json")
    working = [d for d in m.device_names if m.steps.get(d)]
    assert len(working) == 2
    workers = {name: start_worker(name, "--threads", "1") for name in working}
    report = edgec.run(out, random_inputs=True, verify=True, repeat=3,
                       addresses={name: w.address for name, w in workers.items()})
    assert report["verify"]["passed"]
    for name in working:
        weights_mb = sum(m.fragment_path(f).stat().st_size for f in m.device_fragments(name)) / 2**20
        rss = report["devices"][name]["rss_mb"]  # measured by the worker with its fragments loaded
        print(f"{name}: {weights_mb:.1f} MB of fragments, worker RSS {rss:.1f} MB")
        assert rss <= weights_mb + 120, (name, weights_mb, rss)
    for w in workers.values():  # and the memory is given back when the run ends
        # The worker says bye (with its counts, fragments still loaded) before it frees them: allow it a moment.
        deadline = time.monotonic() + 10.0
        while w.rss_mb() >= 100 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert w.rss_mb() < 100
