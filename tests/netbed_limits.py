"""CPU and memory limits for testbed hosts (tests/netbed.py), through cgroups v1 or v2.

    with Testbed(["coord", "a"], 100, limits={"a": HostLimits(cpus=0.25, memory_mb=512)}) as tb:
        tb.popen("a", [...])  # runs in a's namespace and in a's cgroup

Each limited host gets one cgroup per hierarchy that holds a controller it needs (v1: cpu/ and memory/ are
separate hierarchies; v2: one directory), at the top of the hierarchy and named like the host's namespace
(netbed-<pid>-<seq>-h<i>), so `netbed.remove_stale()` finds the cgroups of dead runs by the same rule.
- cpus (cores, may exceed 1): a CFS quota of cpus x period per period of PERIOD_US; v1 `cpu.cfs_period_us` and
  `cpu.cfs_quota_us`, v2 `cpu.max`. The quota cannot be under 1 ms, so cpus >= 1000 / PERIOD_US.
- cpu_weight (1-10000, the kernel's default 100): how much CPU the host gets against every other process of the
  machine when the cores are contended; v2 `cpu.weight`, v1 `cpu.shares` (weight x 1024 / 100). With a quota, a
  heavy weight lets a host have its whole quota while other jobs load the machine: a benchmark's devices then
  run at their profiled share whatever else runs (they still share the memory bandwidth and the caches).
- memory_mb (MiB, as cluster.yaml's `memory_mb`): v1 `memory.limit_in_bytes`, and the same figure in
  `memory.memsw.limit_in_bytes` (RAM + swap) where the kernel accounts swap, so swapping cannot dodge the limit
  (without swap accounting, `memory.swappiness` 0); v2 `memory.max`, and `memory.swap.max` 0 where it exists.
  A process that needs more is killed by the kernel's OOM killer (SIGKILL), as on a device.

A process joins its host's cgroups before it enters the namespace: `ip netns exec` remounts /sys, so from
inside the namespace the cgroup files are out of reach. `join_argv` wraps a command in a `sh` that writes its
own pid into each cgroup's `cgroup.procs`, then execs the command: the pid stays the same, children inherit
the cgroups, and no tool beyond sh is needed.

The period. A quota is spent as the process runs and refilled at each period's start: with the kernel's
100 ms default, a 0.25-core host runs 25 ms and then stalls 75 ms, so a short piece of work either finishes
at full speed or waits most of a period, depending on where in the period it starts. Measured on this
machine (2 cores shared with other jobs, load 2-3), in a 0.25-core host, wall ms as median / 90th percentile
/ max, for onnxruntime running ShuffleNet at 1 thread (3.4 ms on a free core, so 13.6 ms at a quarter core):

    period   back to back            one run after 30 ms idle   busy loop, cores over 2 s
    4 ms     15.8 / 15.9 / 24.6      7.9 / 12.1 / 12.4          0.250
    5 ms     14.9 / 19.2 / 22.2      6.0 / 11.2 / 15.4          0.249
    10 ms    17.9 / 20.8 / 28.0      3.9 / 13.1 / 15.9          0.248
    20 ms    18.7 / 19.9 / 32.0      3.9 /  8.0 /  8.0          0.249
    100 ms    3.4 / 79.1 / 79.8      3.7 /  3.9 /  4.0          0.251

(a Python loop needing 2 ms of CPU, back to back: 10.3 / 17.4 / 20.9 ms at 5 ms, 7.3 / 18.1 / 29.4 at 10 ms,
2.0 / 2.1 / 77.6 at 100 ms, against 8 ms at a quarter core). The share holds at every period; what the period
sets is how a run's time scatters around its share: at 100 ms most runs are full speed and some stall 75 ms,
at 4-5 ms sustained runs take about the quarter-core time. After idle, a run gets up to about two quotas at
full speed before its first stall (the period's own and what a CPU kept from an earlier one: the kernel hands
runtime out in per-CPU slices that outlive a period), so a short run alone is faster than the share says:
2.1-2.3 ms for the 2 ms loop after 30 ms idle, at every period. PERIOD_US is 5 ms: as close as 4 ms within
this machine's noise, and it allows shares down to 0.2 cores (the quota cannot be under 1 ms).

Needs root and the cpu and memory controllers; `unavailable_reason()` says why not in one line.
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

PERIOD_US = 5_000
MIN_WEIGHT, MAX_WEIGHT = 1, 10_000  # cgroup v2's cpu.weight range (v1 cpu.shares: x 1024 / 100)
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller CFS quota
MiB = 1 << 20
CONTROLLERS = ("cpu", "memory")
_PROBED: list[str | None] = []


class CgroupError(RuntimeError):
    """Creating, filling or removing a cgroup failed; the message names the path and the error."""


@dataclass(frozen=True)
class HostLimits:
    """What one host may use: cpus in cores (a CFS quota), memory_mb in MiB (OOM kill beyond); None = no limit.
    cpu_weight: its weight when the cores are contended (None: the kernel's default)."""

    cpus: float | None = None
    memory_mb: float | None = None
    cpu_weight: int | None = None

    def __post_init__(self):
        for what, value in (("cpus", self.cpus), ("memory_mb", self.memory_mb)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise ValueError(f"HostLimits.{what} must be a positive number or None, not {value!r}")
        if self.cpus is not None and self.cpus * PERIOD_US < MIN_QUOTA_US:
            raise ValueError(f"HostLimits.cpus must be at least {MIN_QUOTA_US / PERIOD_US:g} (a CFS quota of "
                             f"{MIN_QUOTA_US} us per {PERIOD_US} us period), not {self.cpus!r}")
        if self.cpu_weight is not None and (isinstance(self.cpu_weight, bool) or not isinstance(self.cpu_weight, int)
                                            or not MIN_WEIGHT <= self.cpu_weight <= MAX_WEIGHT):
            raise ValueError(f"HostLimits.cpu_weight must be an integer from {MIN_WEIGHT} to {MAX_WEIGHT}, "
                             f"not {self.cpu_weight!r}")
        if self.memory_mb is not None and self.memory_mb * MiB < 4096:
            raise ValueError(f"HostLimits.memory_mb must be at least one page, not {self.memory_mb!r}")

    def controllers(self) -> list[str]:
        cpu = self.cpus is not None or self.cpu_weight is not None
        return [c for c, wanted in (("cpu", cpu), ("memory", self.memory_mb is not None)) if wanted]


@dataclass(frozen=True)
class Controller:
    name: str  # "cpu" or "memory"
    version: int  # 1 or 2
    root: Path  # the mount point of the hierarchy that holds it


def find_controllers(mounts: str | None = None) -> dict[str, Controller]:
    """The cpu and memory controllers and where their hierarchies are mounted (/proc/self/mounts): a v1
    hierarchy that has the controller, else a v2 one that offers it in cgroup.controllers."""
    if mounts is None:
        mounts = Path("/proc/self/mounts").read_text()
    v1: dict[str, Path] = {}
    v2: list[Path] = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        where, fstype, options = Path(fields[1].replace("\\040", " ")), fields[2], fields[3].split(",")
        if fstype == "cgroup":
            for name in CONTROLLERS:
                if name in options:
                    v1.setdefault(name, where)
        elif fstype == "cgroup2":
            v2.append(where)
    found = {name: Controller(name, 1, root) for name, root in v1.items()}
    for root in v2:
        try:
            offered = (root / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        for name in CONTROLLERS:
            if name in offered:
                found.setdefault(name, Controller(name, 2, root))
    return found


def settings(limits: HostLimits, ctl: Controller, *, exists: Callable[[str], bool] = lambda f: True,
             period_us: int = PERIOD_US) -> list[tuple[str, str]]:
    """The (file, value) writes, in order, that set `limits` for controller `ctl`; `exists(file)` says whether
    an optional file (swap accounting) is there."""
    if ctl.name == "cpu":
        out = []
        if limits.cpus is not None:
            quota = max(MIN_QUOTA_US, round(limits.cpus * period_us))
            out += [("cpu.cfs_period_us", str(period_us)), ("cpu.cfs_quota_us", str(quota))] if ctl.version == 1 \
                else [("cpu.max", f"{quota} {period_us}")]
        if limits.cpu_weight is not None:
            out.append(("cpu.shares", str(limits.cpu_weight * 1024 // 100)) if ctl.version == 1
                       else ("cpu.weight", str(limits.cpu_weight)))
        return out
    if limits.memory_mb is None:
        return []
    limit = str(math.ceil(limits.memory_mb * MiB))
    if ctl.version == 1:
        # memsw (RAM + swap) may not be below limit_in_bytes: set the RAM limit first.
        swap = [("memory.memsw.limit_in_bytes", limit)] if exists("memory.memsw.limit_in_bytes") \
            else [("memory.swappiness", "0")]
        return [("memory.limit_in_bytes", limit), *swap]
    return [("memory.max", limit), *([("memory.swap.max", "0")] if exists("memory.swap.max") else [])]


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise CgroupError(f"cannot write {value!r} to {path}: {e.strerror or e}") from None


def _enable_v2(ctl: Controller) -> None:
    """A v2 child gets a controller only if its parent's cgroup.subtree_control lists it."""
    control = ctl.root / "cgroup.subtree_control"
    if ctl.name not in control.read_text().split():
        _write(control, f"+{ctl.name}")


def create(name: str, limits: HostLimits, found: Mapping[str, Controller], made: list[Path]) -> list[Path]:
    """Make cgroup `name` in each hierarchy `limits` needs and write the limits; every directory made is
    appended to `made` as soon as it exists (so a failure half-way leaves nothing the caller cannot remove).
    Returns the directories whose cgroup.procs a process must join."""
    missing = [c for c in limits.controllers() if c not in found]
    if missing:
        raise CgroupError(f"no {' or '.join(missing)} cgroup controller mounted (see /proc/self/mounts)")
    for cname in limits.controllers():  # all before the directory: a v2 cgroup gets the files its parent enables
        if found[cname].version == 2:
            _enable_v2(found[cname])
    dirs: list[Path] = []
    for cname in limits.controllers():
        ctl = found[cname]
        path = ctl.root / name
        if path not in dirs:
            try:
                path.mkdir()
            except OSError as e:
                raise CgroupError(f"cannot create cgroup {path}: {e.strerror or e}") from None
            made.append(path)
            dirs.append(path)
        for file, value in settings(limits, ctl, exists=lambda f: (path / f).exists()):  # v2's root lacks them
            _write(path / file, value)
    return dirs


def pids(path: Path) -> list[int]:
    """The processes in cgroup `path` (empty once it is gone)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def remove(path: Path, timeout: float = 5.0) -> None:
    """SIGKILL what the cgroup holds and delete it: a cgroup with processes cannot be removed."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in pids(path):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise CgroupError(f"cannot remove cgroup {path}: {e.strerror or e} (processes: {pids(path)})") \
                    from None
        time.sleep(0.02)  # a killed process leaves its cgroup when the kernel has finished its exit


def stale(is_stale: Callable[[str], bool]) -> list[Path]:
    """The cgroups, in every hierarchy with a cpu or memory controller, whose names `is_stale` accepts."""
    roots = {ctl.root for ctl in find_controllers().values()}
    return sorted(p for root in roots for p in root.iterdir() if p.is_dir() and is_stale(p.name))


def join_argv(dirs: list[Path], argv: list[str]) -> list[str]:
    """argv run by a sh that first moves itself (and so argv, which it execs in place) into the cgroups."""
    if not dirs:
        return list(argv)
    joins = " && ".join(f'echo $$ > "${i}"' for i in range(1, len(dirs) + 1))
    script = f'{joins} || {{ echo "netbed: cannot join cgroup $1" >&2; exit 125; }}; shift {len(dirs)}; exec "$@"'
    return ["sh", "-c", script, "netbed-join", *(str(d / "cgroup.procs") for d in dirs), *argv]


_PROBE_SEQ = itertools.count()


def unavailable_reason() -> str | None:
    """One line saying why hosts cannot be limited here, or None: needs root and the cpu and memory
    controllers, tried on a throwaway cgroup (cached)."""
    if not _PROBED:
        _PROBED.append(_probe())
    return _PROBED[0]


def _probe() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "host limits need root (cgroups)"
    found = find_controllers()
    missing = [c for c in CONTROLLERS if c not in found]
    if missing:
        return f"host limits need the {' and '.join(missing)} cgroup controller(s), not mounted here"
    made: list[Path] = []
    try:
        create(f"netbed-{os.getpid()}-{next(_PROBE_SEQ)}-probe", HostLimits(cpus=0.5, memory_mb=64), found, made)
        return None
    except CgroupError as e:
        return f"host limits: {e}"
    finally:
        for path in reversed(made):
            remove(path)
