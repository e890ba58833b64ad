"""The CPU share this process gets: a cgroup's CFS quota, read, and a spinning thread's share, measured (the
profile's `cpu_quota:`).

A container or a Kubernetes pod with a CPU limit (`resources.limits.cpu`), or a testbed host (tests/netbed_limits.py),
runs under a CFS quota: so many microseconds of CPU per period, then nothing until the next period.  A
micro-benchmark sample shorter than a period either runs at full speed or stalls for most of one, depending on
where in the period it starts, so short samples time the machine's speed, not the device's: a 0.25-core device
would profile as fast as a whole core.  When the share is below the thread count, each timing's samples last
SAMPLE_PERIODS periods (timing.Policy.long_samples: runs counted over the whole stretch), so every sample holds
the stalls in their proportion and the figures follow the share.

Where the quota is: /proc/self/cgroup names this process's cgroup per hierarchy, /proc/self/mountinfo where
each hierarchy is mounted; v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: no limit), v2 `cpu.max` ("max
100000": none).  The tightest of the cgroup and its ancestors counts.  Where the files cannot be read (inside
`ip netns exec`, which remounts /sys; not Linux) the measured share decides alone: a thread spinning for
SPIN_S seconds gets (CPU time / wall time) of a core, and below LIMITED the samples are made long
(UNKNOWN_PERIOD_SAMPLE_S, the period being unknown).  The measured share also sees other processes taking our
core: the load check (load.py) says whether the machine was busy meanwhile.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["CpuQuota", "read_cgroup_quota", "throttle_reader", "spin_share", "see_quota", "burst", "SAMPLE_PERIODS", "LIMITED",
           "UNKNOWN_PERIOD_SAMPLE_S", "MAX_SAMPLE_S", "parse_cgroups", "parse_mountinfo"]

SAMPLE_PERIODS = 10  # periods per sample: a sample's CPU then lies within a tenth of its share's
MAX_SAMPLE_S = 0.25  # at the kernel's default period (100 ms) samples span 2.5 periods: noisier, not minutes long
UNKNOWN_PERIOD_SAMPLE_S = 0.05  # 10 periods of 5 ms (the testbed's), half of the kernel's default 100 ms
LIMITED = 0.9  # a spinning thread that gets less of a core than this is limited (when no quota file says so)
SPIN_S = {False: 0.5, True: 0.25}  # the share's spin (quick: shorter)
BURST_TRIALS = {False: 9, True: 5}  # the burst probe's trials (median)
BURST_IDLE_PERIODS = 4  # each trial starts after this many periods asleep (the kernel's 100 ms when unknown)
BURST_MAX_PERIODS = 8  # a trial spins at most this many periods' quota of CPU before it gives up on a stall
STALL_MS = 0.25  # a gap in a spinning thread's clock this long is a stall (a time slice elsewhere is shorter here)


@dataclass(frozen=True)
class CpuQuota:
    """What limits this process's CPU: the cgroup's quota in cores (None: none, or unreadable) and period, where
    it was read (or why not), and the share a spinning thread measured."""

    cores: float | None
    period_us: int | None
    source: str
    measured_share: float | None
    read: bool = True  # the cgroup files were read (then they decide, and the measured share is recorded only)
    burst_ms: float | None = None  # CPU ms a thread ran at full speed after idle before its first stall (`burst`)

    def sample_s(self, threads: int) -> float | None:
        """How long each sample of a timing at `threads` intra-op threads must last to follow the share (None:
        the share is not below the thread count, and samples keep their own length)."""
        if self.cores is not None:
            if self.cores >= threads:
                return None
            return min(SAMPLE_PERIODS * self.period_us / 1e6, MAX_SAMPLE_S)
        if not self.read and self.measured_share is not None and self.measured_share < LIMITED:
            return UNKNOWN_PERIOD_SAMPLE_S
        return None

    def share(self) -> float | None:
        """The cores this process may use: the quota read, else (files unreadable) the measured share where it is
        below LIMITED; None: no limit seen."""
        if self.cores is not None:
            return self.cores
        if not self.read and self.measured_share is not None and self.measured_share < LIMITED:
            return self.measured_share
        return None

    def entry(self, counts: list[int]) -> dict:
        """The profile's `cpu_quota:`."""
        samples = {n: self.sample_s(n) for n in counts}
        return {"cores": None if self.cores is None else round(self.cores, 4), "period_us": self.period_us,
                "source": self.source, "read": self.read,
                "measured_share": None if self.measured_share is None else round(self.measured_share, 3),
                "burst_ms": None if self.burst_ms is None else round(self.burst_ms, 3),
                "sample_ms": {n: round(s * 1e3, 3) for n, s in samples.items() if s is not None} or None}

    def said(self) -> str:
        quota = "no CPU quota" if self.cores is None else \
            f"a CPU quota of {self.cores:g} cores ({self.period_us} us period)"
        share = "" if self.measured_share is None else f", a spinning thread got {self.measured_share:.2f} of a core"
        burst = "" if self.burst_ms is None else f", {self.burst_ms:.2f} ms at full speed after idle"
        return f"{quota} ({self.source}){share}{burst}"


def parse_cgroups(text: str) -> dict[str, str]:
    """{controller or "" (v2): cgroup path} from /proc/self/cgroup."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for c in controllers.split(",") if controllers else [""]:
            out.setdefault(c, path)
    return out


def parse_mountinfo(text: str) -> list[tuple[str, Path, str, list[str]]]:
    """(root inside the filesystem, mount point, fs type, super options) of each cgroup mount in mountinfo."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append((fields[3], Path(fields[4].replace("\\040", " ")), tail[0], tail[2].split(",")))
    return mounts


def _limit_at(folder: Path, version: int) -> tuple[float, int] | None:
    """(cores, period_us) of one cgroup folder; None without a limit there."""
    try:
        if version == 1:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        else:
            q, p = (folder / "cpu.max").read_text().split()
            if q == "max":
                return None
            quota, period = int(q), int(p)
    except FileNotFoundError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period, period


def read_cgroup_quota(proc: Path = Path("/proc")) -> tuple[float | None, int | None, str, bool]:
    """(cores, period_us, where, read) of the tightest CFS quota over this process's cgroup and its ancestors;
    cores None when there is none, `where` saying where it looked, or why it could not (then `read` is False)."""
    return _tightest(proc)[:4]


def throttle_reader(proc: Path = Path("/proc")) -> Callable[[], int] | None:
    """A reader of how long the cgroup of this process's tightest CFS quota has been throttled in all (its
    cpu.stat: v1 `throttled_time` in ns, v2 `throttled_usec`; any unit, only differences count); None where
    there is no quota or its cpu.stat cannot be read. A span over which it does not move met no stall of the
    quota (the kernel adds a stall when it ends)."""
    cores, _, _, read, folder, version = _tightest(proc)
    if cores is None or not read or folder is None:
        return None
    stat, key = folder / "cpu.stat", ("throttled_time" if version == 1 else "throttled_usec")

    def throttled() -> int:
        for line in stat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
        raise ValueError(f"no {key} in {stat}")

    try:
        throttled()
    except (OSError, ValueError):
        return None
    return throttled


def _tightest(proc: Path) -> tuple[float | None, int | None, str, bool, Path | None, int | None]:
    """read_cgroup_quota's figures, and the folder of the tightest quota's cgroup and its hierarchy's version."""
    try:
        groups = parse_cgroups((proc / "self" / "cgroup").read_text())
        mounts = parse_mountinfo((proc / "self" / "mountinfo").read_text())
    except OSError as e:
        return None, None, f"unreadable: {e.strerror or e}", False, None, None
    for root, point, fstype, options in mounts:
        version = 2 if fstype == "cgroup2" else 1
        if version == 1 and "cpu" not in options:
            continue
        path = groups.get("cpu" if version == 1 else "")
        if path is None:
            continue
        rel = os.path.relpath(path, root)
        if rel.startswith(".."):
            continue  # this mount shows another part of the tree
        folder = (point / rel).resolve()
        if not folder.is_dir():
            continue
        tightest, where = None, folder
        try:
            for f in [folder, *folder.parents]:
                limit = _limit_at(f, version)
                if limit is not None and (tightest is None or limit[0] < tightest[0]):
                    tightest, where = limit, f
                if f == point:
                    break
        except (OSError, ValueError) as e:
            return None, None, f"unreadable: {e}", False, None, None
        files = "cpu.cfs_quota_us" if version == 1 else "cpu.max"
        if tightest is None:
            return None, None, f"cgroup v{version}: no limit in {files} of {folder} or its parents", True, None, None
        return tightest[0], tightest[1], f"cgroup v{version} {files} of {where}", True, where, version
    return (None, None, "no cgroup with a cpu controller mounted here (e.g. inside `ip netns exec`, which remounts "
            "/sys)", False, None, None)


def spin_share(seconds: float) -> float | None:
    """The share of a core a thread spinning for `seconds` gets: its CPU time over the wall time; None where the
    thread's CPU time cannot be read."""
    try:
        c0, t0 = time.thread_time(), time.perf_counter()
    except (AttributeError, OSError):
        return None
    while time.perf_counter() - t0 < seconds:
        pass
    wall = time.perf_counter() - t0
    share = (time.thread_time() - c0) / wall
    return share if math.isfinite(share) else None


def burst(period_us: int | None, trials: int, stall_ms: float = STALL_MS) -> float | None:
    """The CPU ms a thread runs at full speed, after idle, before the quota's first stall: the median over `trials`
    of (sleep BURST_IDLE_PERIODS periods, then spin until the thread's clock jumps by `stall_ms` or more, counting
    the CPU time spun until then).  None where no trial stalled within BURST_MAX_PERIODS periods' worth of CPU (or
    a thread's CPU time cannot be read).

    Why it is measured: a quota is a budget of CPU per period, and a run that starts after idle spends the
    budget at full speed before its first stall; the kernel's per-CPU slices can hold up to about one more
    quota from an earlier period (tests/netbed_limits.py measured about two quotas).  A lone request whose
    work on a device fits that burst takes its full-speed time, not its time at the share: the cost model
    times lone requests with it (cost/quota_burst.py), where the figures, which follow the share, time streams."""
    period_s = (period_us or 100_000) / 1e6
    found: list[float] = []
    try:
        for _ in range(trials):
            time.sleep(BURST_IDLE_PERIODS * period_s)
            limit = BURST_MAX_PERIODS * period_s
            c0 = time.thread_time()
            prev = t0 = time.perf_counter()
            while True:
                now = time.perf_counter()
                if now - prev >= stall_ms / 1e3:
                    found.append((time.thread_time() - c0) * 1e3)
                    break
                prev = now
                if now - t0 > limit:
                    break
    except (AttributeError, OSError):
        return None
    if len(found) * 2 <= trials:  # most trials never stalled: no quota bites a single thread here
        return None
    return float(sorted(found)[len(found) // 2])


def see_quota(quick: bool) -> CpuQuota:
    """The quota read, the share measured, and (where either says one thread is limited) its burst."""
    cores, period, where, read = read_cgroup_quota()
    share = spin_share(SPIN_S[quick])
    limited = (cores is not None and cores < 1) or (not read and share is not None and share < LIMITED)
    return CpuQuota(cores, period, where, share, read, burst(period, BURST_TRIALS[quick]) if limited else None)
