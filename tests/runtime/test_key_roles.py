"""Key roles on real workers (loopback, CURVE): only the coordinator's key starts a run (a device's key is
refused with a reason, and its other control messages change nothing), and a coordinator that claimed a
worker and went silent loses its claim after --idle-timeout, so that another coordinator gets the worker."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import zmq

import edgec
from edgec.runtime.errors import InputError
from edgec.runtime.wire.keys import COORDINATOR, Keyring, keygen
from edgec.runtime.wire.protocol import PROTOCOL_VERSION
from edgec.runtime.wire.transport import pack

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = REPO / "tests" / "e2e" / "clusters"
WAIT_S = 30.0  # a liveness deadline on a busy machine; the claim itself ends after --idle-timeout 1


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    keygen(folder, [COORDINATOR, "pi5-a", "pi5-b", "pi4-a"])
    return folder


@pytest.fixture
def worker(tmp_path, keys):
    """pi5-a's worker with --idle-timeout 1: (address, its public key, the process)."""
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "edgec.runtime.device.worker", "--listen", "tcp://127.0.0.1:0",
                             "--keys", str(keys), "--name", "pi5-a", "--cache", str(tmp_path / "cache"),
                             "--idle-timeout", "1", "--threads", "1"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    m = re.fullmatch(r"edgec worker: listening on (tcp://127\.0\.0\.1:\d+)\n", line)
    assert m, line
    yield m.group(1), Keyring.load(keys, "pi5-a").public, proc, tmp_path / "worker.log"
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        log.close()


class Client:
    """A DEALER to the worker's control socket with `ring`'s key: a coordinator, or a device posing as one."""

    def __init__(self, ctx: zmq.Context, address: str, server_key: bytes, ring: Keyring):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        ring.connect_to(self.sock, server_key)
        self.sock.connect(address)

    def send(self, **msg) -> None:
        self.sock.send_multipart([pack(msg)])

    def hello(self) -> None:
        self.send(t="hello", protocol=PROTOCOL_VERSION, edgec="test")

    def reply(self, timeout_s: float = WAIT_S) -> dict | None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        return msgpack.unpackb(self.sock.recv_multipart()[0])


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_a_device_key_cannot_start_a_run(worker, keys, ctx):
    address, server_key, proc, log = worker
    device = Client(ctx, address, server_key, Keyring.load(keys, "pi4-a"))
    device.hello()
    reply = device.reply()
    assert reply["t"] == "refused" and reply["code"] == "role", reply
    assert "'coordinator'" in reply["reason"] and "'pi4-a'" in reply["reason"]
    device.send(t="open", device="pi5-a", manifest=b"{}", path="x", inflight=1, emulate=False, compress="none",
                dilate=1.0)
    device.send(t="end")
    assert device.reply(0.5) is None  # dropped: nothing answers a key that is not the coordinator's
    # The worker is still free: the coordinator's key is welcomed at once.
    coordinator = Client(ctx, address, server_key, Keyring.load(keys, COORDINATOR))
    coordinator.hello()
    assert coordinator.reply()["t"] == "welcome"
    coordinator.send(t="end")
    assert proc.poll() is None


def test_a_silent_coordinator_loses_its_claim(worker, keys, ctx):
    address, server_key, proc, log = worker
    ring = Keyring.load(keys, COORDINATOR)
    silent = Client(ctx, address, server_key, ring)
    silent.hello()
    assert silent.reply()["t"] == "welcome"  # claimed, and then not another word
    other = Client(ctx, address, server_key, ring)  # another machine sharing the coordinator's key
    other.hello()
    reply = other.reply()
    assert reply["t"] == "refused" and reply["code"] == "busy", reply
    deadline = time.monotonic() + WAIT_S
    while reply["t"] != "welcome":
        assert time.monotonic() < deadline, "the silent coordinator kept the worker"
        time.sleep(0.2)
        other.hello()
        reply = other.reply()
    assert "no word from the coordinator" in log.read_text()
    other.send(t="end")


def test_a_worker_needs_the_coordinators_public_key(tmp_path, keys):
    folder = tmp_path / "keys"
    keygen(folder, ["pi5-a"])
    with pytest.raises(InputError, match=r"public/coordinator.key: missing; a worker accepts runs only from"):
        from edgec.runtime.device.cache import FragmentCache
        from edgec.runtime.wire.net import parse_endpoint
        from edgec.runtime.device.worker import Daemon

        Daemon(parse_endpoint("tcp://127.0.0.1:0", "--listen", allow_any_port=True),
               cache=FragmentCache(tmp_path / "cache", 1 << 20), keys=Keyring.load(folder, "pi5-a"))


def test_a_run_with_the_coordinators_key_still_works(worker, keys, tmp_path):
    address = worker[0]
    out = tmp_path / "build"
    edgec.compile(MODELS / "tinychain.onnx", CLUSTERS / "two.yaml", out)
    report = edgec.run(out, random_inputs=True, verify=True, keys=keys, addresses={"pi5-a": address}, timeout=60)
    assert report["verify"]["passed"]


def test_keys_on_stdin_must_be_keys(tmp_path):
    from click.testing import CliRunner

    from edgec.runtime.device.worker import worker as worker_cmd

    for given in ("garbage\n", '{"name": "a", "public": "x", "secret": "y", "trusted": {}}\n'):
        res = CliRunner().invoke(worker_cmd, ["--listen", "tcp://127.0.0.1:0", "--keys-stdin", "--once", "--cache",
                                              str(tmp_path / "cache")], input=given)
        lines = res.stderr.splitlines()
        assert res.exit_code == 2 and len(lines) == 1, res.output
        assert lines[0].startswith("edgec: stdin: not the keys of `edgec worker --keys-stdin`"), lines
