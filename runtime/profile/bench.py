"""The Bench: every micro-benchmark model of one intra-op thread count is added to it (`Bench.add`), then it
times them all (`Bench.run`); kernels.py and tables.py add the models and compute the figures from the times,
figures.py runs the three steps.  Timing them all together lets the rounds interleave: round 1 of every model,
then round 2 of every model, ..., so that a model's rounds are seconds apart, and a burst of load or a slow
moment of the process spoils at most one of them (timing.combine keeps the fastest stable round).  Each timing
leaves a measurement entry (runs, median, spread, stable, the load meanwhile).  What each figure is: see the
package docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Protocol

import numpy as np
import onnxruntime as ort

from edgec.runtime.errors import InputError

from .load import LoadProbe, LoadSample, describe_load
from .timing import Figure, Policy, Series, combine, sig, time_model

__all__ = ["Bench", "Job", "Beside", "Timer", "Times", "Formula", "DRAM_ROUNDS", "SPREAD_ROUNDS", "SPREAD_QUANTILE",
           "pass_order", "threads_label", "other_cpus_over"]

_ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL

Times = dict[str, float]  # timing name -> seconds per run
Formula = Callable[[Times], float]  # a figure from the times

@dataclass(frozen=True)
class Job:
    name: str
    data: bytes  # the serialized model
    feeds: dict[str, np.ndarray]
    opt: ort.GraphOptimizationLevel = _ALL
    per_pass: int = 1  # rounds in each pass over the models, spread through it (`pass_order`)
    pick: float | None = None  # which stable round gives the figure (timing.combine's quantile); None: `quantile`
    beside: "Beside | None" = None  # processes its rounds run beside (shared.py's co-runners)

    @property
    def quantile(self) -> float:
        """Which stable round gives the figure (timing.combine): `pick` if given, else the fastest, or for a
        spread timing the one at SPREAD_QUANTILE."""
        if self.pick is not None:
            return self.pick
        return SPREAD_QUANTILE if self.per_pass > 1 else 0.0


# Timings that read beyond the core's own caches (DRAM, or the last-level cache the machine's other tenants
# share) move with those tenants' memory traffic and with where their buffers land in memory, which the load
# check cannot see (it is not CPU time).  Timed here as a profile times them (a fresh session per round),
# alternating for 200 s: memory_gbps 23-40 GB/s, weight_gbps 15-25, in phases of seconds to tens of seconds
# and from round to round.  They get more rounds per pass, spread through it, each as much shorter (same time
# in all), and their figure is the round at the fastest quarter (SPREAD_QUANTILE), not the fastest: over that
# run's 337 pairs of back-to-back 26 s windows, the figures of the two windows differed by more than 10%
#   4 rounds, the fastest (as before):        memory_gbps 40 pairs, weight_gbps 91
#   12 rounds, the fastest:                             22             64
#   24 rounds, the fastest:                              6             37
#   24 rounds, the fastest quarter's (nearest rank):    12             23
# The op table's (0.4-1.6 MB working sets, beyond a core's L2) moved less: 12 rounds.
DRAM_ROUNDS = 6
SPREAD_ROUNDS = 3
SPREAD_QUANTILE = 0.25


# One round of one model: (model, feeds, threads, policy, optimisation level) -> its Series; tests script it.
Timer = Callable[[bytes, dict, int, Policy, ort.GraphOptimizationLevel], Series]


class Beside(Protocol):
    """Processes a job's rounds run beside (shared.CoRunners): `timer` times its rounds (resuming them around
    each), `jiffies` is their CPU time so far (counted as this process's own in the job's load; None where
    unreadable), and `note` goes into the warning of the job's figure when it is unstable."""

    timer: Timer

    def jiffies(self) -> int | None: ...

    def note(self) -> str: ...


class Bench:
    """Collects models (`add`), then times them all in interleaved rounds (`run`), recording each timing
    under its name in `entries`."""

    def __init__(self, threads: int, quick: bool, policy: Policy, probe: LoadProbe, strict: bool,
                 progress: Callable[[str], None], timer: Timer = time_model):
        self.threads, self.quick, self.policy, self.probe, self.strict = threads, quick, policy, probe, strict
        self.say = progress
        self.timer = timer
        self.rng = np.random.default_rng(0)  # fixed: the same inputs and weights in every profile
        self.jobs: list[Job] = []
        self.entries: dict[str, dict] = {}
        self.figures: dict[str, Figure] = {}  # each timing's, once run
        self.unstable: list[str] = []  # one line per timing whose spread stayed large
        self.unstable_names: list[str] = []  # "<timing> at <threads> thr (<spread>)" for the one-line warning

    def add(self, name: str, data: bytes, feeds: dict, opt=_ALL, per_pass: int = 1, *, pick: float | None = None,
            beside: Beside | None = None) -> None:
        """A model to time under `name`; `per_pass` > 1: that many shorter rounds in each pass, spread through
        it (for the timings that follow the machine's memory traffic: DRAM_ROUNDS, SPREAD_ROUNDS). `pick`,
        `beside`: see Job."""
        if any(j.name == name for j in self.jobs):
            raise ValueError(f"benchmark {name!r} added twice")
        if per_pass < 1:
            raise ValueError(f"benchmark {name!r}: per_pass must be at least 1, got {per_pass}")
        self.jobs.append(Job(name, data, feeds, opt, per_pass, pick, beside))

    def run(self) -> Times:
        """Seconds per run of every added model: policy.rounds rounds, each a pass over all models in the
        order added, then up to policy.retries passes over those still unstable (timing.py), combined per
        model by timing.combine.  An unstable timing is refused with strict (the
        first in that order), else a warning."""
        rounds: dict[str, list[Series]] = {j.name: [] for j in self.jobs}
        spans: dict[str, list[tuple[LoadSample, LoadSample]]] = {j.name: [] for j in self.jobs}
        # a job of k rounds per pass has the same time in all as any other: each round is 1/k as long
        policies = {j.name: self.policy if j.per_pass == 1 else
                    replace(self.policy, max_seconds=self.policy.max_seconds / j.per_pass) for j in self.jobs}

        def one_round(job: Job) -> None:
            before = self._sample(job)
            timer = job.beside.timer if job.beside else self.timer
            rounds[job.name].append(timer(job.data, job.feeds, self.threads, policies[job.name], job.opt))
            spans[job.name].append((before, self._sample(job)))

        for _ in range(self.policy.rounds):
            for job in pass_order(self.jobs):
                one_round(job)
        for _ in range(self.policy.retries):  # timing.py: the unsettled timings' extra rounds, interleaved
            unsettled = [j for j in self.jobs if not combine(rounds[j.name], self.policy.max_spread, j.quantile).stable]
            if not unsettled:
                break
            for job in pass_order(unsettled):
                one_round(job)
        return {job.name: self._record(job, combine(rounds[job.name], self.policy.max_spread, job.quantile),
                                       spans[job.name]) for job in self.jobs}

    def _sample(self, job: Job) -> LoadSample:
        """The probe's reading, the CPU time of the processes the job runs beside counted as this process's own."""
        s = self.probe.sample()
        extra = job.beside.jiffies() if job.beside and s.cpu else None
        return s if extra is None else replace(s, cpu=replace(s.cpu, own=s.cpu.own + extra))

    def _record(self, job: Job, f: Figure, spans: list[tuple[LoadSample, LoadSample]]) -> float:
        name = job.name
        self.figures[name] = f
        others = other_cpus_over(spans)
        last = spans[-1][1]
        self.entries[name] = {
            "runs": f.runs,
            "rounds": len(f.round_medians),
            "median_ms": sig(f.median_s * 1e3, 4),
            "spread": sig(f.spread, 2) if math.isfinite(f.spread) else 1e9,
            "stable": f.stable,
            "loadavg_1m": last.loadavg[0] if last.loadavg else None,
            "other_cpus": None if others is None else round(others, 2),
        }
        if not f.stable:
            cpus = last.cpu.cpus if last.cpu else 0
            load = describe_load(others, cpus, last.loadavg) + (f"; {job.beside.note()}" if job.beside else "")
            if f.spread > self.policy.max_spread:
                said = (f"spread {f.spread:.0%} over {f.runs} runs in {f.seconds:.1f} s stayed above "
                        f"{self.policy.max_spread:.0%} (its round's window {f.window_spread:.0%}, nearest other of "
                        f"{len(f.round_medians)} rounds {f.rounds_apart:.0%} away; {load})")
            else:  # each round agreed with itself, but none counted (a round the Beside left out, a short one)
                said = f"none of its {len(f.round_medians)} rounds was stable ({f.runs} runs in {f.seconds:.1f} s; {load})"
            what = f"{threads_label(self.threads)}, {name}: {said}"
            if self.strict:
                raise InputError(f"{what}; profile on a quiet machine, or without --strict to write the profile "
                                "with a warning")
            self.unstable.append(what)
            said_short = f"{f.spread:.0%}" if f.spread > self.policy.max_spread else "no stable round"
            self.unstable_names.append(f"{name} at {self.threads} thr ({said_short})")
        return f.median_s


def pass_order(jobs: list[Job]) -> list[Job]:
    """One pass over the jobs: each once, in the order added, and a job of k rounds per pass k times, at even
    intervals through the pass, so that its rounds sample the whole of the profile's time rather than one
    moment of it.  The s-th of S such jobs has its m-th round after the fraction (m + (s + 1/2) / S) / k of
    the others: staggered, so that they do not all sample the same moments."""
    single = [j for j in jobs if j.per_pass == 1]
    spread = [j for j in jobs if j.per_pass > 1]
    keyed = [((i + 1.0, 0, i), j) for i, j in enumerate(single)]
    for s, j in enumerate(spread):
        keyed += [(((m + (s + 0.5) / len(spread)) * len(single) / j.per_pass, 1, s), j) for m in range(j.per_pass)]
    return [j for _, j in sorted(keyed, key=lambda kj: kj[0])]


def threads_label(n: int) -> str:
    return f"{n} thread{'s' if n > 1 else ''}"


def other_cpus_over(spans: list[tuple[LoadSample, LoadSample]]) -> float | None:
    """Average CPUs other processes used over several intervals (a timing's rounds), as load.other_cpus does
    over one; None when unknown (no /proc, or no jiffy elapsed in them all)."""
    others = total = 0
    cpus = 0
    for a, b in spans:
        if a.cpu is None or b.cpu is None:
            return None
        others += (b.cpu.busy - a.cpu.busy) - (b.cpu.own - a.cpu.own)
        total += b.cpu.total - a.cpu.total
        cpus = b.cpu.cpus
    if total <= 0:
        return None
    return max(others, 0) / total * cpus
