"""Local workers forked from the zygote (runtime/device/zygote.py): each with the coordinator's environment and
working directory at the time it was asked for, its exit code reported, signalled only while it lives; a new
zygote where a variable read at import differs. Runs end to end through it in every other runtime test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile

import pytest

from edgec.runtime.device import zygote

pytestmark = pytest.mark.skipif(not zygote.available(), reason="no pidfd on this system: local workers start as "
                                                                "processes of their own")
LISTENING = re.compile(rb"edgec worker: listening on tcp://127\.0\.0\.1:\d+")


def _log_tail(log) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")


def test_a_worker_listens_with_the_callers_directory_and_environment_and_stops_on_sigterm(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGEC_CACHE_DIR", str(tmp_path / "from-env"))
    with tempfile.TemporaryFile() as log:
        a = zygote.spawn(["--listen", "tcp://127.0.0.1:0", "--once", "--exit-with-parent"], keys=None, stderr=log,
                         timeout=60)
        b = zygote.spawn(["--listen", "tcp://127.0.0.1:0", "--once", "--exit-with-parent", "--cache", "relative"],
                         keys=None, stderr=log, timeout=60)
        for child in (a, b):
            assert LISTENING.search(child.stdout.readline()), _log_tail(log)
            assert child.poll() is None
        assert (tmp_path / "from-env").is_dir() and (tmp_path / "relative").is_dir()  # opened at start
        assert os.getppid() not in (a.pid, b.pid) and a.pid != b.pid
        for child in (a, b):
            child.terminate()
            assert child.wait(timeout=60) == 0, _log_tail(log)  # SIGTERM: a worker's clean stop
            child.stdout.close()
        a.kill()  # ended: never signals whatever has the pid now
        assert a.poll() == 0


def test_bad_arguments_are_the_workers_exit_code_2_and_its_one_line():
    with tempfile.TemporaryFile() as log:
        child = zygote.spawn(["--listen", "udp://nowhere", "--exit-with-parent"], keys=None, stderr=log, timeout=60)
        assert child.wait(timeout=60) == 2
        child.stdout.close()
        text = _log_tail(log)
        assert "--listen" in text and "Traceback" not in text, text


def test_a_wait_that_times_out_says_so_and_the_worker_lives_on():
    with tempfile.TemporaryFile() as log:
        child = zygote.spawn(["--listen", "tcp://127.0.0.1:0", "--once", "--exit-with-parent"], keys=None,
                             stderr=log, timeout=60)
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                child.wait(timeout=0.2)
            assert child.poll() is None
        finally:
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=60) == -signal.SIGKILL
            child.stdout.close()


def test_a_variable_read_at_import_gets_a_zygote_of_its_own(monkeypatch):
    with tempfile.TemporaryFile() as log:
        first = zygote.spawn(["--listen", "udp://x", "--exit-with-parent"], keys=None, stderr=log, timeout=60)
        first.wait(timeout=60)
        before = set(zygote.zygote_pids())
        monkeypatch.setenv("OMP_NUM_THREADS", "1" if os.environ.get("OMP_NUM_THREADS") != "1" else "2")
        second = zygote.spawn(["--listen", "udp://x", "--exit-with-parent"], keys=None, stderr=log, timeout=60)
        second.wait(timeout=60)
        assert len(set(zygote.zygote_pids()) - before) == 1
        for child in (first, second):
            child.stdout.close()
