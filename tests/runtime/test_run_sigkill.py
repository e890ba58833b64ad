"""`edgec run` killed with SIGKILL mid-run leaves nothing behind: no key material on disk (the run's own keys
live in memory and reach its local workers on their stdin), and the local workers stop by themselves."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import edgec
from tests.runtime.procs import local_workers

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = REPO / "tests" / "e2e" / "clusters"
WAIT_S = 60.0  # a liveness deadline on a busy machine, not a timing: everything normally happens in about a second


def _running(pid: int) -> bool:
    """Alive and not a zombie (a reparented child that exited may wait for a reaper that never comes)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _files(folder: Path) -> list[Path]:
    return [Path(root) / name for root, dirs, files in os.walk(folder) for name in [*dirs, *files]]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pipeline") / "build"
    edgec.compile(MODELS / "tinychain.onnx", CLUSTERS / "four.yaml", out, strategy="pipeline", objective="throughput")
    return out


def test_a_killed_run_leaves_no_keys_and_no_workers(pipeline, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "EDGEC_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "edgec.runtime", str(pipeline), "--random-inputs", "--repeat",
                             "1000000", "--inflight", "1", "--verbose"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env, cwd=REPO)
    try:
        deadline, seen = time.monotonic() + WAIT_S, b""
        while b"request 1/" not in seen:  # the workers are up and requests flow: mid-run
            assert proc.poll() is None and time.monotonic() < deadline, seen.decode(errors="replace")
            if select.select([proc.stderr], [], [], 0.2)[0]:
                seen += os.read(proc.stderr.fileno(), 65536)
        workers = local_workers(proc.pid)
        assert len(workers) == 2, workers  # pi5-a's and pi5-b's local workers
        # What the run wrote under its TMPDIR while running: no key file, and no folder a key could hide in.
        assert not [p for p in _files(tmp) if "key" in p.name], _files(tmp)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    deadline = time.monotonic() + WAIT_S
    while any(_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [w for w in workers if _running(w)]
    for w in left:  # do not leave them behind even when the test fails
        os.kill(w, signal.SIGKILL)
    assert not left, "local workers outlived their run"
    assert not [p for p in _files(tmp) if p.is_dir() or "key" in p.name], _files(tmp)  # was edgec-run-keys-*/
    for path in _files(tmp_path):
        if path.is_file() and path.stat().st_size < 1 << 20:
            data = path.read_bytes()
            assert b"secret-key" not in data and b"curve" not in data.lower(), path
