"""What `edgec run` prints for people: a progress bar on a terminal and no line per request elsewhere
(those come with --verbose), and a throughput only when enough requests measured one."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

import edgec

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = Path(__file__).resolve().parents[1] / "e2e" / "clusters"


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run-output") / "build"
    edgec.compile(MODELS / "tinychain.onnx", CLUSTERS / "two.yaml", out, strategy="pipeline", objective="throughput")
    return out


def _run(build: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgec.runtime", str(build), "--random-inputs", *args],
                          capture_output=True, text=True, timeout=120)


def test_no_line_per_request_off_a_terminal_unless_verbose(build):
    quiet = _run(build, "--repeat", "6")
    assert quiet.returncode == 0, quiet.stderr
    assert "request 1/6" not in quiet.stderr and "throughput: " in quiet.stdout
    assert "not measured" not in quiet.stdout
    loud = _run(build, "--repeat", "6", "--verbose")
    assert [f"request {i}/6:" in loud.stderr for i in range(1, 7)] == [True] * 6


def test_a_lone_request_reports_no_throughput(build):
    res = _run(build, "--repeat", "1")
    assert res.returncode == 0, res.stderr
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("throughput:")]
    assert line == "throughput: not measured over 1 request(s) (--repeat 5 or more measures it)"


def test_a_terminal_gets_a_progress_bar_instead(build):
    """stderr a terminal (a pty): the timed requests are a bar (rich), not a line each."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "edgec.runtime", str(build), "--random-inputs", "--repeat", "40"],
                            stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    seen, deadline = b"", time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.5)[0]:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=60) == 0, seen.decode(errors="replace")
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
    text = seen.decode(errors="replace")
    assert "edgec: requests" in text and "/40" in text, text[-2000:]
    assert "request 1/40:" not in text
