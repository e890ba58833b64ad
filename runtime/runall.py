"""`edgec run-all OUTDIR`: the builds of an `edgec allocate` run at once, each on its own devices; and the
reader of OUTDIR/allocation.json (the contract between the two: strict, one-line errors).

allocation.json::

    {"format": "edgec-allocation/1",
     "services": {NAME: {"devices": [...], "manifest": "NAME/manifest.json", "sla_ms": 300, "rate_ips": null,
                         "priority": 1, "strategy": "pipeline", "predicted_latency_ms": 113.1,
                         "predicted_throughput_ips": 8.8, "utility": 0.62, "normalised_utility": 1.0,
                         "memory_mb": {DEVICE: MB}, "latency_fit": {...} or null}},
     "status": "OPTIMAL", "gap": 0.0, "solve_seconds": 0.01, "planning_seconds": 3.2,
     "objective": "weighted" or "fairness", "dropped": [{"name": ..., "reason": ...}], "cluster": "cluster.yaml"}

Each service runs as `edgec run` runs one build (api.execute), in a thread of its own driving its own
coordinator and workers; no device is in two services, so the runs share no worker.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from .coordinator import available_cores
from .errors import EdgecRuntimeError, InputError
from .manifest import load_manifest

__all__ = ["ALLOCATION_FORMAT", "Allocation", "ServiceEntry", "load_allocation", "parse_allocation", "run_all"]

logger = logging.getLogger(__name__)

ALLOCATION_FORMAT = "edgec-allocation/1"
MAX_BYTES = 16 << 20  # a few KB per service: anything far larger is not an allocation


@dataclass(frozen=True)
class ServiceEntry:
    name: str
    devices: tuple[str, ...]
    manifest: Path  # absolute: OUTDIR / the entry's relative path
    sla_ms: float
    rate_ips: float | None
    predicted_latency_ms: float


@dataclass(frozen=True)
class Allocation:
    path: Path
    services: tuple[ServiceEntry, ...]
    status: str


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _positive(v: Any) -> bool:
    return _number(v) and v > 0


def _nonneg(v: Any) -> bool:
    return _number(v) and v >= 0


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _str(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


# key: (check, what it must be). Every key is required; None is allowed where the check says so.
_TOP = {
    "format": (lambda v: v == ALLOCATION_FORMAT, repr(ALLOCATION_FORMAT)),
    "services": (lambda v: isinstance(v, dict) and bool(v), "a non-empty mapping of services"),
    "status": (lambda v: v in ("OPTIMAL", "FEASIBLE"), "OPTIMAL or FEASIBLE"),
    "gap": (_opt(_nonneg), "a non-negative number or null"),
    "solve_seconds": (_nonneg, "a non-negative number"),
    "planning_seconds": (_nonneg, "a non-negative number"),
    "objective": (lambda v: v in ("weighted", "fairness"), "weighted or fairness"),
    "dropped": (lambda v: isinstance(v, list) and all(isinstance(d, dict) and set(d) == {"name", "reason"}
                                                      and all(_str(x) for x in d.values()) for d in v),
                "a list of {name, reason} strings"),
    "cluster": (_str, "a non-empty string"),
}
_SERVICE = {
    "devices": (lambda v: isinstance(v, list) and bool(v) and all(_str(d) for d in v) and len(set(v)) == len(v),
                "a non-empty list of distinct device names"),
    "manifest": (_str, "a path relative to the allocation's folder"),
    "sla_ms": (_positive, "a positive number"),
    "rate_ips": (_opt(_positive), "a positive number or null"),
    "priority": (_positive, "a positive number"),
    "strategy": (_str, "a non-empty string"),
    "predicted_latency_ms": (_nonneg, "a non-negative number"),
    "predicted_throughput_ips": (_nonneg, "a non-negative number"),
    "utility": (_number, "a number"),
    "normalised_utility": (_number, "a number"),
    "memory_mb": (lambda v: isinstance(v, dict) and all(_nonneg(x) for x in v.values()),
                  "a mapping of device names to megabytes"),
    "latency_fit": (lambda v: v is None or isinstance(v, dict), "a mapping or null"),
}


def load_allocation(path: str | Path) -> Allocation:
    """OUTDIR/allocation.json (or OUTDIR itself) read and checked; InputError naming the file otherwise."""
    p = Path(path)
    p = p / "allocation.json" if p.is_dir() else p
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{p}: no allocation here (expected the allocation.json of `edgec allocate`)") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read the allocation ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise InputError(f"{p}: larger than {MAX_BYTES >> 20} MiB: not an allocation")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{p}: not valid JSON ({exc})") from None
    return parse_allocation(data, p)


def parse_allocation(data: Any, path: Path) -> Allocation:
    """The allocation in decoded JSON `data` (from file `path`, whose folder holds the builds)."""
    if not isinstance(data, dict):
        raise InputError(f"{path}: an allocation must be a JSON object")
    _keys(data, _TOP, "allocation", path)
    services, owner = [], {}
    for name, entry in data["services"].items():
        where = f"services[{name!r}]"
        if not isinstance(entry, dict):
            raise InputError(f"{path}: {where} must be an object")
        _keys(entry, _SERVICE, where, path)
        rel = PurePosixPath(entry["manifest"])
        if rel.is_absolute() or ".." in rel.parts or "\\" in entry["manifest"]:
            raise InputError(f"{path}: {where}.manifest {entry['manifest']!r} must stay inside the allocation's folder")
        for d in entry["devices"]:
            if d in owner:
                raise InputError(f"{path}: device {d!r} is given to both {owner[d]!r} and {name!r}")
            owner[d] = name
        services.append(ServiceEntry(name, tuple(entry["devices"]), path.parent / rel, float(entry["sla_ms"]),
                                     None if entry["rate_ips"] is None else float(entry["rate_ips"]),
                                     float(entry["predicted_latency_ms"])))
    return Allocation(path, tuple(services), data["status"])


def _keys(obj: dict, spec: dict, where: str, path: Path) -> None:
    for key in obj:
        if key not in spec:
            raise InputError(f"{path}: unknown key {key!r} in {where} (allowed: {', '.join(spec)})")
    for key, (check, what) in spec.items():
        if key not in obj:
            raise InputError(f"{path}: missing key {key!r} in {where}")
        if not check(obj[key]):
            raise InputError(f"{path}: {where}.{key} must be {what}, got {json.dumps(obj[key])[:80]}")


def check_builds(allocation: Allocation) -> None:
    """Every service's build is there and runs on the devices the allocation gives it, no others."""
    for s in allocation.services:
        m = load_manifest(s.manifest)
        working = {name for name, steps in m.steps.items() if steps}
        if not working <= set(s.devices):
            extra = ", ".join(sorted(working - set(s.devices)))
            raise InputError(f"{s.manifest}: runs on {extra}, which {allocation.path} does not give to {s.name!r}")


def default_threads(allocation: Allocation) -> int:
    """onnxruntime threads per local worker when all services run at once: the cores shared out."""
    devices = sum(len(s.devices) for s in allocation.services)
    return max(1, available_cores() // max(devices, 1))


def run_all(outdir: str | Path, *, repeat: int = 1, verify: bool = False, tolerance: float = 1e-4,
            threads: int | None = None, emulate: bool = False, timeout: float = 60.0, seed: int = 0) -> dict:
    """Run every service of OUTDIR's allocation at once (random inputs), each `repeat` timed requests after
    a warm-up; return the `edgec run-all --json` object: per service, its measured median latency against
    its SLA (and --verify's verdict). A service whose run fails raises its error, prefixed by its name,
    once every run has ended."""
    from .api import execute, report  # api imports the coordinator's whole stack: only when running

    allocation = load_allocation(outdir)
    check_builds(allocation)
    threads = default_threads(allocation) if threads is None else threads
    results: dict[str, Any] = {}

    def one(s: ServiceEntry) -> None:
        try:
            results[s.name] = execute(s.manifest, random_inputs=True, seed=seed, verify=verify, tolerance=tolerance,
                                      repeat=repeat, threads=threads, emulate=emulate, timeout=timeout)
        except BaseException as exc:  # reported by the main thread, which owns the exit code
            results[s.name] = exc

    # Daemon threads: a signal ends the main thread's wait, and the process (with its local workers) then.
    runs = [threading.Thread(target=one, args=(s,), name=f"run-all {s.name}", daemon=True)
            for s in allocation.services]
    for t in runs:
        t.start()
    for t in runs:
        while t.is_alive():
            t.join(0.2)
    for s in allocation.services:
        if isinstance(results[s.name], BaseException):
            exc = results[s.name]
            if isinstance(exc, EdgecRuntimeError):
                raise type(exc)(f"service {s.name!r}: {exc}") from None
            raise exc
    return _report(allocation, {s.name: report(*results[s.name]) for s in allocation.services}, threads)


def _report(allocation: Allocation, runs: dict[str, dict], threads: int) -> dict:
    services = {}
    for s in allocation.services:
        r = runs[s.name]
        met = r["latency_ms"] <= s.sla_ms and (s.rate_ips is None or r["throughput_ips"] >= s.rate_ips)
        services[s.name] = {"devices": list(s.devices), "manifest": str(s.manifest), "sla_ms": s.sla_ms,
                            "rate_ips": s.rate_ips, "predicted_latency_ms": s.predicted_latency_ms,
                            "latency_ms": r["latency_ms"], "latencies_ms": r["latencies_ms"],
                            "throughput_ips": r["throughput_ips"], "sla_met": met, "verify": r["verify"],
                            "emulation": r["emulation"]}
    verdicts = [v["verify"]["passed"] for v in services.values() if v["verify"] is not None]
    return {"allocation": str(allocation.path), "threads": threads, "services": services,
            "all_sla_met": all(v["sla_met"] for v in services.values()),
            "verify_passed": all(verdicts) if verdicts else None}
