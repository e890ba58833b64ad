"""Run a fixed list of lanes of work, the later lanes in forked processes when this machine has the cores.

A lane is a deterministic unit: what it computes does not depend on where or when it runs, so the
result is the same with one process or several (`workers`). Results cross the process boundary as
msgpack (no pickle anywhere), and results computed in this process make the same round trip, so both
ways hand the caller exactly the same values.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from typing import Callable, Sequence

import msgpack

from edgec.runtime.interrupts import check_interrupted

__all__ = ["run_lanes", "available_workers"]

logger = logging.getLogger(__name__)


def available_workers() -> int:
    """Processes worth using here: the cores this process may run on, and 1 where forking is unsafe
    (no fork, or other Python threads that a child would inherit mid-lock)."""
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _roundtrip(value):
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False, strict_map_key=False)


def run_lanes(fn: Callable, lanes: Sequence, workers: int | None = None) -> list:
    """[fn(lane) for lane in lanes], each result a msgpack-able value (tuples come back as lists).

    With `workers` > 1 (default: available_workers()), lanes after the first run in forked children
    while this process runs the first. A child that fails to report (killed, out of memory) has its lane
    rerun here, so an error in `fn` surfaces in this process with its own traceback."""
    workers = available_workers() if workers is None else workers
    children: list[tuple[int, int] | None] = [None] * len(lanes)
    try:
        for k in range(1, min(workers, len(lanes))):
            children[k] = _fork(fn, lanes[k])
        out = [_roundtrip(fn(lanes[0]))] if lanes else []
        for k in range(1, len(lanes)):
            check_interrupted()
            got = _collect(children[k]) if children[k] else None
            children[k] = None
            out.append(got["ok"] if got is not None else _roundtrip(fn(lanes[k])))
        return out
    finally:
        for child in children:
            if child is not None:  # this process failed first: stop the others
                _stop(*child)


def _fork(fn: Callable, lane) -> tuple[int, int] | None:
    try:
        r, w = os.pipe()
    except OSError as exc:  # out of file descriptors: run the lane here instead
        logger.debug("cannot open a pipe for a planner worker (%s); running its lane in this process", exc)
        return None
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:  # out of processes or memory: run the lane here instead
        os.close(r)
        os.close(w)
        logger.debug("cannot fork a planner worker (%s); running its lane in this process", exc)
        return None
    if pid == 0:  # the child: compute, write, and leave without running the parent's exit handlers
        code = 1
        try:
            _die_with(parent)
            os.close(r)
            data = msgpack.packb({"ok": fn(lane)}, use_bin_type=True)
            with os.fdopen(w, "wb") as f:
                f.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Loaded before any fork, so that a child's first step does no dynamic loading.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with(parent: int) -> None:
    """In a fresh child: the parent's signal handlers are not ours (SIGTERM and SIGINT end a worker at
    once), and on Linux the kernel kills this process when the parent dies, even by SIGKILL, when no
    `finally` of the parent can stop it. A parent that died before prctl took effect is caught by getppid."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if _LIBC is None:
        return
    if _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def _collect(child: tuple[int, int]) -> dict | None:
    pid, fd = child
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        logger.warning("a planner worker process failed (wait status %d); running its lane again here", status)
        return None
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _stop(pid: int, fd: int) -> None:
    for step in (lambda: os.close(fd), lambda: os.kill(pid, signal.SIGKILL), lambda: os.waitpid(pid, 0)):
        try:
            step()
        except OSError:  # already closed, or already gone
            pass
