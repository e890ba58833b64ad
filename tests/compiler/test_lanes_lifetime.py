"""A forked search lane never outlives the compiler, even one killed by SIGKILL (no cleanup runs)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, sys, time
from edgec.compiler.plan import lanes

def work(lane):
    if lane:  # the forked lane: say where it is, then search "forever"
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(120)
    return lane

lanes.run_lanes(work, [0, 1], workers=2)
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")
def test_a_lane_dies_with_its_parent_killed_by_sigkill(tmp_path):
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", SCRIPT, str(pid_file)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and parent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        child = int(pid_file.read_text())
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(child)
    finally:
        parent.kill()
        parent.wait()
