"""Is the machine busy?  CPU time taken by other processes, from /proc, and the rule that decides.

A benchmark measures what the machine gives it.  Other processes that take CPU while a micro-benchmark runs
make its figure too slow, and not reproducibly so (issue 11: 24 against 142 GFLOP/s for the same conv
between a busy and a quiet moment).  So every measurement records what the others took meanwhile:

  other CPUs = (busy jiffies of the whole machine - this process's own jiffies) / all jiffies x CPUs

over the measurement's interval: busy jiffies from the `cpu` line of /proc/stat (user, nice, system, irq,
softirq, steal: time a hypervisor gave to other guests counts as taken), this process's own from
/proc/self/stat (utime + stime, all its threads, so onnxruntime's thread pool is ours, and cutime + cstime,
its reaped children: the runtime workers it starts to time the runtime's own costs, with the zygote that
forks them and the workers it reaped, device/zygote.py), both in USER_HZ.

The rule (`is_busy`): the machine is busy when other processes used more than BUSY_FRACTION (10%) of its
CPU time, i.e. more than 0.1 x CPUs CPUs on average.  Why 10%: onnxruntime's intra-op threads meet at a
barrier after every operator, so a core taken from one of them stalls them all; what others take goes
about one for one into our times, and 10% is the agreement the profile must reach (two runs within 10%).
The rule is applied to an idle window before measuring (nothing of ours runs, so every busy jiffy is
another process's) and to the whole measurement.

The load average (/proc/loadavg) is recorded beside it for the reader but does not decide: it is an
exponential average over a minute, so it still shows a compile that ended 30 s ago, and while we measure
it counts our own threads.

LoadWatch applies the rule to a profile: an idle look before anything of ours runs, then the whole
measurement; check_load turns a busy verdict into a warning, or with --strict a refusal.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgec.runtime.errors import InputError
from edgec.runtime.device.zygote import zygote_pids

__all__ = ["BUSY_FRACTION", "CpuTimes", "LoadSample", "LoadProbe", "parse_proc_stat", "parse_self_stat",
           "parse_loadavg", "other_cpus", "is_busy", "describe_load", "LoadWatch", "check_load", "IDLE_WINDOW_S"]

BUSY_FRACTION = 0.10
IDLE_WINDOW_S = {False: 0.5, True: 0.2}  # the look at the machine before anything of ours runs


@dataclass(frozen=True)
class CpuTimes:
    busy: int  # jiffies the whole machine spent busy
    total: int  # all jiffies, busy and idle, of every CPU
    own: int  # jiffies of this process (all threads)
    cpus: int  # CPUs /proc/stat counts


@dataclass(frozen=True)
class LoadSample:
    """One reading of the machine: load average (1, 5, 15 min) and CPU times; None where unreadable."""

    loadavg: tuple[float, float, float] | None
    cpu: CpuTimes | None


def parse_proc_stat(text: str) -> tuple[int, int, int]:
    """(busy jiffies, total jiffies, CPU count) from the text of /proc/stat."""
    busy = total = cpus = 0
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "cpu":
            v = [int(x) for x in fields[1:]] + [0] * 10
            user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
            # guest and guest_nice are already inside user and nice: not added again
            busy = user + nice + system + irq + softirq + steal
            total = busy + idle + iowait
        elif fields[0].startswith("cpu") and fields[0][3:].isdigit():
            cpus += 1
    if total <= 0:
        raise ValueError("no aggregate cpu line in /proc/stat")
    return busy, total, max(cpus, 1)


def parse_self_stat(text: str) -> int:
    """utime + stime + cutime + cstime jiffies from the text of /proc/<pid>/stat (fields 14 to 17: the
    process's own and its waited-for children's, such as the runtime's local workers that the profile
    starts to measure the runtime's costs and then reaps; the command name in field 2 may hold spaces and
    parentheses, so fields are counted after its last ')')."""
    rest = text[text.rindex(")") + 2:].split()
    return sum(int(x) for x in rest[11:15])  # rest[0] is field 3 (state)


def parse_loadavg(text: str) -> tuple[float, float, float]:
    a, b, c = text.split()[:3]
    return float(a), float(b), float(c)


class LoadProbe:
    """Reads /proc.  Tests replace it with a scripted probe (same two methods)."""

    def sample(self) -> LoadSample:
        return LoadSample(self._loadavg(), self._cpu())

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    @staticmethod
    def _loadavg() -> tuple[float, float, float] | None:
        try:
            return parse_loadavg(Path("/proc/loadavg").read_text())
        except (OSError, ValueError):
            try:
                return os.getloadavg()
            except OSError:
                return None

    @staticmethod
    def _cpu() -> CpuTimes | None:
        try:
            busy, total, cpus = parse_proc_stat(Path("/proc/stat").read_text())
            own = parse_self_stat(Path("/proc/self/stat").read_text())
            for pid in zygote_pids():  # the local workers' zygote and the workers it reaped are ours too
                try:
                    own += parse_self_stat(Path(f"/proc/{pid}/stat").read_text())
                except FileNotFoundError:  # ended meanwhile
                    pass
        except (OSError, ValueError, IndexError):
            return None  # not Linux: other processes' CPU use is unknown, and said so
        return CpuTimes(busy, total, own, cpus)


def other_cpus(a: LoadSample, b: LoadSample) -> float | None:
    """Average CPUs other processes used between two samples; None when unknown (no /proc, or no jiffy
    elapsed)."""
    if a.cpu is None or b.cpu is None:
        return None
    elapsed = b.cpu.total - a.cpu.total
    if elapsed <= 0:
        return None
    others = (b.cpu.busy - a.cpu.busy) - (b.cpu.own - a.cpu.own)
    # Jiffy accounting of the machine and of the process round differently: never below zero.
    return max(others, 0) / elapsed * b.cpu.cpus


def is_busy(others: float | None, cpus: int) -> bool:
    """The rule (module docstring): others took more than BUSY_FRACTION of the machine.  Unknown is not
    busy: the profile then says that the load could not be read."""
    return others is not None and others > BUSY_FRACTION * cpus


def describe_load(others: float | None, cpus: int, loadavg: tuple[float, float, float] | None) -> str:
    used = "other processes' CPU use unknown (no /proc/stat)" if others is None else \
        f"other processes used {others:.2f} of {cpus} CPUs"
    avg = "" if loadavg is None else f", load average {loadavg[0]:.2f} {loadavg[1]:.2f} {loadavg[2]:.2f}"
    return used + avg


class LoadWatch:
    """What the machine's other processes did: an idle look before, then the whole measurement."""

    def __init__(self, probe: LoadProbe, quick: bool):
        self.probe = probe
        self.idle_s = IDLE_WINDOW_S[quick]
        a = probe.sample()
        probe.wait(self.idle_s)
        self.start = probe.sample()
        self.before = other_cpus(a, self.start)
        self.t0 = time.perf_counter()
        self.end: LoadSample | None = None
        self.during: float | None = None

    @property
    def cpus(self) -> int:
        return self.start.cpu.cpus if self.start.cpu else 0

    def busy_before(self) -> bool:
        return is_busy(self.before, self.cpus)

    def finish(self) -> None:
        self.end = self.probe.sample()
        self.during = other_cpus(self.start, self.end)

    def busy_during(self) -> bool:
        return is_busy(self.during, self.cpus)

    def said_before(self) -> str:
        return f"{describe_load(self.before, self.cpus, self.start.loadavg)} in the {self.idle_s:g} s before profiling"

    def said_during(self) -> str:
        return f"{describe_load(self.during, self.cpus, self.end.loadavg if self.end else None)} while profiling"

    def section(self) -> dict[str, Any]:
        unknown = self.before is None and self.during is None
        return {
            "cpus": self.cpus,
            "busy_rule": f"busy when other processes use more than {BUSY_FRACTION:.0%} of the CPUs' time "
                         f"({BUSY_FRACTION * self.cpus:g} of {self.cpus} CPUs), from /proc/stat less this "
                         "process's own jiffies (/proc/self/stat); the load average is recorded, not used",
            "before": {"seconds": self.idle_s, "other_cpus": _round(self.before), "loadavg": _avg(self.start)},
            "during": {"seconds": round(time.perf_counter() - self.t0, 1), "other_cpus": _round(self.during),
                       "loadavg": _avg(self.end)},
            "verdict": "unknown" if unknown else "busy" if self.busy_before() or self.busy_during() else "quiet",
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _avg(s: LoadSample | None) -> list[float] | None:
    return None if s is None or s.loadavg is None else [round(v, 2) for v in s.loadavg]


def check_load(busy: bool, said: str, tense: str, strict: bool, warnings: list[str]) -> None:
    """A busy machine (before or during the run) refuses with --strict, else becomes a warning."""
    if not busy:
        return
    if strict:
        raise InputError(f"the machine {tense} busy: {said}; profile on a quiet machine, or without "
                        "--strict to write the profile with a warning")
    warnings.append(f"the machine {tense} busy: {said}; the figures may be too slow")
