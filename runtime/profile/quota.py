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

__all__ = ["CpuQuota", "read_cgroup_quota", "spin_share", "see_quota", "SAMPLE_PERIODS", "LIMITED",
           "UNKNOWN_PERIOD_SAMPLE_S", "MAX_SAMPLE_S", "parse_cgroups", "parse_mountinfo"]

SAMPLE_PERIODS = 10  # periods per sample: a sample's CPU then lies within a tenth of its share's
MAX_SAMPLE_S = 0.25  # at the kernel's default period (100 ms) samples span 2.5 periods: noisier, not minutes long
UNKNOWN_PERIOD_SAMPLE_S = 0.05  # 10 periods of 5 ms (the testbed's), half of the kernel's default 100 ms
LIMITED = 0.9  # a spinning thread that gets less of a core than this is limited (when no quota file says so)
SPIN_S = {False: 0.5, True: 0.25}  # the share's spin (quick: shorter)


@dataclass(frozen=True)
class CpuQuota:
    """What limits this process's CPU: the cgroup's quota in cores (None: none, or unreadable) and period, where
    it was read (or why not), and the share a spinning thread measured."""

    cores: float | None
    period_us: int | None
    source: str
    measured_share: float | None
    read: bool = True  # the cgroup files were read (then they decide, and the measured share is recorded only)

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

    def entry(self, counts: list[int]) -> dict:
        """The profile's `cpu_quota:`."""
        samples = {n: self.sample_s(n) for n in counts}
        return {"cores": None if self.cores is None else round(self.cores, 4), "period_us": self.period_us,
                "source": self.source, "read": self.read,
                "measured_share": None if self.measured_share is None else round(self.measured_share, 3),
                "sample_ms": {n: round(s * 1e3, 3) for n, s in samples.items() if s is not None} or None}

    def said(self) -> str:
        quota = "no CPU quota" if self.cores is None else \
            f"a CPU quota of {self.cores:g} cores ({self.period_us} us period)"
        share = "" if self.measured_share is None else f", a spinning thread got {self.measured_share:.2f} of a core"
        return f"{quota} ({self.source}){share}"


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
    try:
        groups = parse_cgroups((proc / "self" / "cgroup").read_text())
        mounts = parse_mountinfo((proc / "self" / "mountinfo").read_text())
    except OSError as e:
        return None, None, f"unreadable: {e.strerror or e}", False
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
            return None, None, f"unreadable: {e}", False
        files = "cpu.cfs_quota_us" if version == 1 else "cpu.max"
        if tightest is None:
            return None, None, f"cgroup v{version}: no limit in {files} of {folder} or its parents", True
        return tightest[0], tightest[1], f"cgroup v{version} {files} of {where}", True
    return None, None, "no cgroup with a cpu controller mounted here (e.g. inside `ip netns exec`, which remounts /sys)", \
        False


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


def see_quota(quick: bool) -> CpuQuota:
    """The quota read, and the share measured."""
    cores, period, where, read = read_cgroup_quota()
    return CpuQuota(cores, period, where, spin_share(SPIN_S[quick]), read)
