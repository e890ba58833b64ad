"""shared_weight_gbps: the rate one core streams a layer's weights at while every other core of this machine
streams weights of its own.

Devices that share a machine (a cluster's `hosts:`) and run tiles of one spatial segment at once each stream
all of the segment's weights at the same moment, and the machine's memory serves them together. On this
2-core machine (2026-11-26) the weight_gbps MatMul (1x4096 by 4096x4096, 64 MB) ran 1.57-1.67x slower while
a second process ran it, where a compute-bound conv ran 1.01x slower; a 7x7 ResNet-50 tile fragment (17.9 MB
of weights) ran 1.12-1.20x slower beside a second one, and in a two-device plan 0.20-0.23 ms over its
price (cost/table.py prices the weights of such a tile at this figure).

How: cores - 1 other processes (plain Python with onnxruntime, no edgec; `CoRunners`) each load the MatMul
into their own memory and wait. The figure is a timing of the 1-thread micro-benchmarks (`CoRunners.add_to`):
each of its rounds resumes the co-runners, times the MatMul at 1 thread the way weight_gbps is timed while they
run it back to back, and pauses them again. Its rounds are spread through the micro-benchmarks' passes as
weight_gbps' are (bench.DRAM_ROUNDS per pass), and each is paired with the weight_gbps round beside it: the
other tenants' traffic moves both rounds of a pair alike, and their ratio cancels it.

This machine gives two streams their share of memory in phases. Over 10 minutes of alternating rounds (scratch
phase.py, 2026-11-26; shared, then weight_gbps alone, 0.5 s apart), in a contended phase a shared round ran at
0.40-0.69 of the rate of the round beside it (the median over 30 s at 0.53-0.65, drifting by minutes); in an
uncontended one, 20-75 s long and 30% of the time, at 0.75-1.2; a stretch in between gives both. So the
figure is weight_gbps' figure times the median ratio of the pairs that contended (a rate ratio at most
UNCONTENDED; `pick_ratio`), once they are NEED of the pairs: an uncontended pair times a moment in which the
machine did not share its memory, and any quantile over every pair moved with the share of such pairs. Where
fewer contended, the profile takes more sets of as many pairs at its end (`CoRunners.later`, after the runtime's
figures), LATER_GAP_S apart, up to LATER_SETS until the contended pairs over every set are enough, and the
figure is their median. A machine whose cores never contend (no shared memory path) takes every set (about a
minute here) and gets the median of all its pairs, with a warning.

A pair counts where its shared round had the co-runners on the CPU (below), whether or not the runs of its
rounds settled (`Figure.round_stable`): in a noisy stretch most rounds do not, and a profile that counted only
settled pairs kept 3 of 24 here (2026-11-27, w62). Replayed on three such traces (scratch/sq/sim7s.py and
sim8s.py, 2026-11-27), the ratios of two profiles taken back to back differed by more than 10% in 8.4%, 2.1% and
0% of the simulated pairs of profiles; counting only settled pairs, 12.7%, 21.0% and 0%; the previous figure (the
slower quarter of the settled pairs, then up to three later sets back to back), 39.0%, 22.7% and 0%. The later
sets took no time in the median profile, and at most 56 s.

A round in which a co-runner had less than BUSY of a CPU (/proc/PID/schedstat) does not count (marked
unstable); when none counts, the figure is not written. The co-runners stop when their stdin closes, so none
outlives the profile. Not measured on a machine of one core (nothing shares it).
"""

from __future__ import annotations

import math
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from . import bench, kernels
from .load import parse_self_stat
from .timing import Figure, Policy, Series, sig, time_model

__all__ = ["CoRunners", "CoRunnerError", "SHARED_QUANTILE", "UNCONTENDED", "NEED", "LATER_SETS", "LATER_GAP_S",
           "BUSY", "pair_ratios", "pick_ratio"]

SHARED_QUANTILE = 0.75  # the shared rounds' own figure (where no pair is): the slower quarter's round
# A pair whose shared round streamed at more than this share of the rate alone did not contend (module docstring).
UNCONTENDED = 0.7
NEED = 1 / 3  # the figure is the contended pairs' median once they are this share of the micro-benchmarks' pairs
LATER_SETS = 5  # at most this many more sets of as many pairs (about 3 s each here) where fewer contended
LATER_GAP_S = 10.0  # between two later sets (none in a quick profile): an uncontended phase lasted 20-75 s here
BUSY = 0.8  # a round counts when its co-runners had at least this share of a CPU each meanwhile
# A running process's CPU time advances at the scheduler's ticks (up to 10 ms apart at HZ 100): in rounds of
# 20 ms (quick) a co-runner on its CPU throughout read 0.77-1.16 of the round, so that much is not held against it.
TICK_S = 0.01
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
READY_TIMEOUT_S = 60.0  # a co-runner loads onnxruntime and 64 MB of weights in about a second here

# A co-runner: no edgec import (it runs the weights' model as the benchmark does and nothing else). It reads
# one byte at a time from stdin: "g" runs the model back to back until the next byte, "p" waits for the next
# byte, anything else or end of file (the profile closed it, or died) ends it.
_CO_RUNNER = """
import os, select, sys
import numpy as np
import onnxruntime as ort
o = ort.SessionOptions()
o.intra_op_num_threads = 1
o.inter_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
feeds = {"a": np.ones((1, int(sys.argv[2])), dtype=np.float32)}
s.run(None, feeds)
print("ready", flush=True)
running = False
while True:
    if not running or select.select([0], [], [], 0)[0]:
        c = os.read(0, 1)
        if c not in (b"g", b"p"):
            break
        running = c == b"g"
    else:
        s.run(None, feeds)
"""


class CoRunnerError(RuntimeError):
    """A co-runner process did not start (its last line of stderr is in the message)."""


NAME = "shared_weight_gbps"


class CoRunners:
    """`count` co-runner processes of weight_gbps' MatMul (kernels.weights_matmul), started paused, for a
    bench.Bench job (`add_to`): its `timer` times a round beside them (bench.Beside). A context manager: they
    are gone when it exits, or when starting one raises CoRunnerError."""

    def __init__(self, count: int, quick: bool):
        self.data, self.feeds, self.nbytes = kernels.weights_matmul(np.random.default_rng(7), quick)
        self.rounds = 0  # rounds timed
        self.idle_rounds = 0  # of those, rounds in which a co-runner was off the CPU for part of the round
        self.on_cpu: list[bool] = []  # each round's (timer's), in the order taken: its co-runners on the CPU
        self.time_model = time_model  # what times a round beside them (timing.time_model)
        self.procs: list[subprocess.Popen] = []
        self._bench: bench.Bench | None = None  # add_to's
        self.quick = quick  # later sets without a gap
        # add_to's formula's (and later's): weight_gbps' figure's time, every pair's time ratio (sorted), the
        # contended pairs the figure wants, and the time ratio it is at
        self._solo_s = 0.0
        self._ratios: list[float] = []
        self._need = 1
        self._ratio: float | None = None
        folder = Path(tempfile.mkdtemp(prefix="edgec-profile-shared-"))
        try:
            path = folder / "weights.onnx"
            path.write_bytes(self.data)
            width = str(self.feeds["a"].shape[1])
            for _ in range(count):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-c", _CO_RUNNER, str(path), width], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"}))
            for p in self.procs:
                _wait_ready(p)
        except BaseException:
            self.close()
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # each co-runner has its own copy loaded by now

    def __enter__(self) -> "CoRunners":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add_to(self, b: bench.Bench) -> bench.Formula:
        """Add the timing to the Bench (1 thread: a device beside others runs 1 thread; after weight_gbps'), its
        rounds spread through the passes like weight_gbps'; returns its formula (GB/s: weight_gbps' time times
        the pairs' `pick_ratio`), which also writes into the timing's `measurement:` entry the pairs counted,
        those that contended, and the ratio of rates the figure is at (0.51-0.65 in this machine's profiles of
        2026-11-27). `later` may take more sets."""
        b.add(NAME, self.data, self.feeds, per_pass=bench.DRAM_ROUNDS, pick=SHARED_QUANTILE, beside=self)
        self._bench = b

        def formula(t: bench.Times) -> float:
            self._solo_s = t[kernels.WEIGHTS]
            shared = b.figures[NAME]
            self._ratios = pair_ratios(shared, b.figures[kernels.WEIGHTS], self.on_cpu[:len(shared.round_medians)])
            self._need = max(1, math.ceil(NEED * len(shared.round_medians)))
            self._ratio = pick_ratio(self._ratios, self._need)
            b.entries[NAME].update(pairs=len(self._ratios), contended_pairs=self.contended,
                                   paired_ratio=_rates(self._ratio))
            return self._gbps(self._ratio, b.figures[NAME])

        return formula

    @property
    def counted(self) -> int:
        """The pairs counted so far, over every set (the entry's `pairs` are the micro-benchmarks' alone)."""
        return len(self._ratios)

    @property
    def contended(self) -> int:
        """The pairs counted so far that contended for memory."""
        return sum(r * UNCONTENDED >= 1 for r in self._ratios)

    @property
    def enough(self) -> bool:
        """Whether the pairs that contended are NEED of the micro-benchmarks' pairs: the figure is their median."""
        return self.contended >= self._need

    def later(self, say: Callable[[str], None], sleep: Callable[[float], None] = time.sleep) -> float | None:
        """When fewer of the Bench's pairs contended than NEED, more sets of as many pairs now, LATER_GAP_S apart
        (none when quick), up to LATER_SETS until the contended pairs over every set are enough; each pair a
        weight_gbps round alone (the Bench's timer) then one beside the co-runners. Returns the figure (GB/s) at
        the pick over every pair, and writes `later_pairs` (over the sets), `contended_pairs` (over every set)
        and `paired_ratio` (the figure's) into the timing's entry. None when enough contended (the figure
        stands) or the Bench had no pair."""
        b = self._bench
        if self._ratio is None or self.enough:
            return None
        solo_job = next(j for j in b.jobs if j.name == kernels.WEIGHTS)
        policy = replace(b.policy, max_seconds=b.policy.max_seconds / bench.DRAM_ROUNDS)  # a Bench round's
        count = len(b.figures[NAME].round_medians)
        pairs = 0
        for k in range(LATER_SETS):
            say(f"  shared_weight_gbps: {self.contended} of its {self.counted} pairs contended for memory, "
                f"{self._need} wanted; {count} more pairs ({k + 1} of at most {LATER_SETS})")
            if k and not self.quick:
                sleep(LATER_GAP_S)
            for _ in range(count):
                solo = b.timer(solo_job.data, solo_job.feeds, 1, policy, solo_job.opt)
                beside = self.timer(self.data, self.feeds, 1, policy, solo_job.opt)
                if self.on_cpu[-1] and solo.median_s > 0:
                    self._ratios.append(beside.median_s / solo.median_s)
                    pairs += 1
            if self.enough:
                break
        self._ratios.sort()
        self._ratio = pick_ratio(self._ratios, self._need)
        b.entries[NAME].update(later_pairs=pairs, contended_pairs=self.contended, paired_ratio=_rates(self._ratio))
        return self._gbps(self._ratio, b.figures[NAME])

    @property
    def paired_ratio(self) -> float | None:
        """The rates the figure is at, shared over alone."""
        return _rates(self._ratio)

    def _gbps(self, ratio: float | None, shared: Figure) -> float:
        """weight_gbps' time times the pick's ratio; the shared rounds' own figure where no pair is."""
        return self.nbytes / (shared.median_s if ratio is None else self._solo_s * ratio) / 1e9

    def note(self) -> str:
        return (f"{self.idle_rounds} of {self.rounds} rounds with a co-runner off the CPU, not counted"
                if self.idle_rounds else "its co-runners on the CPU in every round")

    def _send(self, byte: bytes) -> None:
        for p in self.procs:
            try:
                os.write(p.stdin.fileno(), byte)
            except OSError:  # it has exited: its CPU time stops, and the rounds say so (idle)
                pass

    def jiffies(self) -> int | None:
        """CPU jiffies the co-runners have used (/proc/PID/stat); None where unreadable."""
        try:
            return sum(parse_self_stat(Path(f"/proc/{p.pid}/stat").read_text()) for p in self.procs)
        except (OSError, ValueError, IndexError):
            return None

    def _ran_s(self) -> float | None:
        """CPU seconds the co-runners have run: /proc/PID/schedstat (nanoseconds; a round lasts tens of
        milliseconds, a few jiffies), else their jiffies; None where neither is readable."""
        try:
            return sum(int(Path(f"/proc/{p.pid}/schedstat").read_text().split()[0]) for p in self.procs) / 1e9
        except (OSError, ValueError, IndexError):
            j = self.jiffies()
            return None if j is None else j / _CLK_TCK

    def timer(self, data: bytes, feeds: dict, threads: int, policy: Policy, opt) -> Series:
        """One round of the model (`time_model`) while the co-runners run theirs; unstable, and not paired
        (`on_cpu`), when one of them had less than BUSY of a CPU meanwhile (the hypervisor, another tenant),
        since the round then did not time the shared rate."""
        self._send(b"g")
        try:
            r0, t0 = self._ran_s(), time.monotonic()
            series = self.time_model(data, feeds, threads, policy, opt)
            r1, t1 = self._ran_s(), time.monotonic()
        finally:
            self._send(b"p")
        # a round shorter than TICK_S / BUSY cannot show a shortfall; one in which they did not run at all is off
        off = bool(self.procs) and r0 is not None and r1 is not None and (
            r1 - r0 < (BUSY * (t1 - t0) - TICK_S) * len(self.procs) or r1 <= r0)
        self.rounds += 1
        self.idle_rounds += off
        self.on_cpu.append(not off)
        return replace(series, stable=False) if off else series

    def close(self) -> None:
        """Close every co-runner's stdin (its signal to stop) and wait for it; kill what does not stop."""
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for stream in (p.stdout, p.stderr):
                stream.close()
        self.procs = []


def pair_ratios(shared: Figure, solo: Figure, on_cpu: list[bool]) -> list[float]:
    """The ratios of each shared round's time to the weight_gbps round of the same index, over the pairs whose
    shared round had its co-runners on the CPU (`on_cpu`, per shared round in the order taken), sorted. A round
    whose runs did not settle still counts: its median is a time of the shared rate, and the contended pairs'
    median does not follow one round (module docstring). pass_order puts the two rounds of a pair within one
    DRAM_ROUNDS-th of a pass of each other."""
    return sorted(m / s for m, s, ok in zip(shared.round_medians, solo.round_medians, on_cpu) if ok and s > 0)


def pick_ratio(ratios: list[float], need: int) -> float | None:
    """The median of the time ratios of the pairs that contended for memory (a rate ratio at most UNCONTENDED)
    when there are at least `need` of them, else every pair's median; None without any pair."""
    contended = [r for r in ratios if r * UNCONTENDED >= 1]
    chosen = contended if len(contended) >= need else ratios
    return statistics.median(chosen) if chosen else None


def _rates(ratio: float | None) -> float | None:
    """A pair's rates, shared over alone (the reciprocal of its times'): the figure is weight_gbps times it."""
    return None if ratio is None else sig(1 / ratio)


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
