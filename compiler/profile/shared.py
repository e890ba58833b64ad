"""shared_weight_gbps: the rate one core streams a layer's weights at while every other core of this machine
streams weights of its own.

Devices that share a machine (a cluster's `hosts:`) and run tiles of one spatial segment at once each stream
all of the segment's weights at the same moment, and the machine's memory serves them together. On this
2-core machine (2026-11-26) the weight_gbps MatMul (1x4096 by 4096x4096, 64 MB) ran 1.57-1.67x slower while
a second process ran it, where a compute-bound conv ran 1.01x slower; a 7x7 ResNet-50 tile fragment (17.9 MB
of weights) ran 1.12-1.20x slower beside a second one, and in a two-device plan 0.20-0.23 ms over its
price (cost/table.py prices the weights of such a tile at this figure).

How: cores - 1 other processes (plain Python with onnxruntime, no edgec) each load the same model file into
their own memory and run it at 1 intra-op thread, back to back, until their stdin closes; meanwhile this
process times the MatMul at 1 thread the way weight_gbps is timed (bench.py bench_weights), in
ROUNDS_FACTOR x policy.rounds rounds (more while unstable), the figure the median round's. A round in which
a co-runner had less than BUSY of a CPU (/proc/PID/stat) is not counted: in one profile of six the figure came
out at weight_gbps's own rate (45.2 GB/s against 21.9-25.8), as if nothing ran beside it. Five measurements
back to back gave 24.6-29.0 GB/s with 4 rounds, hence the longer series. Not measured on a machine of one
core (nothing shares it).
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from . import bench
from .load import LoadProbe, LoadSample, parse_self_stat
from .timing import Figure, Policy, Series, settle, time_model

__all__ = ["measure_shared_weights", "Shared", "CoRunnerError", "SHARED_QUANTILE"]

SHARED_QUANTILE = 0.5  # the median round
ROUNDS_FACTOR = 3  # rounds (and time) over the policy's: five measurements back to back gave 24.6-29.0 GB/s
BUSY = 0.8  # a round counts when its co-runners had at least this share of a CPU each meanwhile
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
READY_TIMEOUT_S = 60.0  # a co-runner loads onnxruntime and 64 MB of weights in about a second here

# A co-runner: no edgec import (it runs the weights' model as the benchmark does and nothing else).
_CO_RUNNER = """
import select, sys
import numpy as np
import onnxruntime as ort
o = ort.SessionOptions()
o.intra_op_num_threads = 1
o.inter_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
feeds = {"a": np.ones((1, int(sys.argv[2])), dtype=np.float32)}
s.run(None, feeds)
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    s.run(None, feeds)
"""


class CoRunnerError(RuntimeError):
    """A co-runner process did not start (its last line of stderr is in the message)."""


@dataclass(frozen=True)
class Shared:
    gbps: float
    figure: Figure
    others: float | None  # CPUs that processes other than this one and its co-runners used meanwhile
    last: LoadSample  # the machine after the timing
    idle_rounds: int = 0  # rounds left out because a co-runner was off the CPU for part of them


def measure_shared_weights(policy: Policy, quick: bool, cores: int, say: Callable[[str], None],
                           probe: LoadProbe | None = None) -> Shared | None:
    """The weights' MatMul at 1 thread beside cores - 1 co-runners; None on one core. CoRunnerError when a
    co-runner fails to start; the co-runners are gone when this returns or raises."""
    probe = probe or LoadProbe()
    if cores < 2:
        return None
    data, feeds, nbytes = bench.weights_matmul(np.random.default_rng(7), quick)
    say(f"  shared_weight_gbps: the weights' MatMul at 1 thread beside {cores - 1} other process"
        f"{'es' if cores > 2 else ''} running it")
    folder = Path(tempfile.mkdtemp(prefix="edgec-profile-shared-"))
    procs: list[subprocess.Popen] = []
    try:
        path = folder / "weights.onnx"
        path.write_bytes(data)
        for _ in range(cores - 1):
            procs.append(subprocess.Popen([sys.executable, "-c", _CO_RUNNER, str(path), str(feeds["a"].shape[1])],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          env={**os.environ, "OMP_NUM_THREADS": "1"}))
        for p in procs:
            _wait_ready(p)
        idle: list[bool] = []
        longer = replace(policy, rounds=policy.rounds * ROUNDS_FACTOR, max_seconds=policy.max_seconds * ROUNDS_FACTOR)

        def take_round() -> Series:
            j0, t0 = _jiffies(procs), time.monotonic()
            series = time_model(data, feeds, 1, longer)
            j1, t1 = _jiffies(procs), time.monotonic()
            # a co-runner off the CPU for part of the round (the hypervisor, another tenant): not the shared rate
            off = j0 is not None and j1 is not None and (j1 - j0) < BUSY * (t1 - t0) * _CLK_TCK * len(procs)
            idle.append(off)
            return replace(series, stable=False) if off else series

        before, ran_before = probe.sample(), _jiffies(procs)
        figure = settle(take_round, longer, SHARED_QUANTILE)
        after, ran_after = probe.sample(), _jiffies(procs)
    finally:
        _stop(procs)
        shutil.rmtree(folder, ignore_errors=True)
    others = _others(before, after, None if ran_before is None or ran_after is None else ran_after - ran_before)
    return Shared(nbytes / figure.median_s / 1e9, figure, others, after, sum(idle))


def _jiffies(procs: list[subprocess.Popen]) -> int | None:
    """CPU jiffies the co-runners have used (/proc/PID/stat); None where unreadable."""
    try:
        return sum(parse_self_stat(Path(f"/proc/{p.pid}/stat").read_text()) for p in procs)
    except (OSError, ValueError, IndexError):
        return None


def _others(a: LoadSample, b: LoadSample, co_runners: int | None) -> float | None:
    """load.other_cpus between a and b, less what the co-runners took (they are ours); None when unknown."""
    if co_runners is None or a.cpu is None or b.cpu is None or b.cpu.total <= a.cpu.total:
        return None
    others = (b.cpu.busy - a.cpu.busy) - (b.cpu.own - a.cpu.own) - co_runners
    return max(others, 0) / (b.cpu.total - a.cpu.total) * b.cpu.cpus


def _wait_ready(p: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CoRunnerError(f"a co-runner process did not start within {READY_TIMEOUT_S:g} s")
        if select.select([p.stdout], [], [], min(left, 1.0))[0]:
            line = p.stdout.readline()
            if line.strip() == b"ready":
                return
            p.wait(timeout=10)
            err = [s for s in p.stderr.read().decode(errors="replace").splitlines() if s.strip()]
            raise CoRunnerError(f"a co-runner process exited ({p.returncode}): "
                                f"{err[-1] if err else 'no message'}")


def _stop(procs: list[subprocess.Popen]) -> None:
    """Close every co-runner's stdin (its signal to stop) and wait for it; kill what does not stop."""
    for p in procs:
        try:
            p.stdin.close()
        except OSError:
            pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for stream in (p.stdout, p.stderr):
            stream.close()
