"""`edgec run-all OUTDIR`: the builds of an `edgec allocate` run at once, each on its own devices; and the
reader of OUTDIR/allocation.json (the contract between the two: strict, one-line errors).

allocation.json::

    {"format": "edgec-allocation/1",
     "services": {NAME: {"devices": [...], "manifest": "NAME/manifest.json", "sla_ms": 300, "rate_ips": null,
                         "priority": 1, "strategy": "pipeline", "predicted_latency_ms": 113.1,
                         "predicted_throughput_ips": 8.8, "predicted_energy_mj": 820.5 or null,
                         "utility": 0.62, "normalised_utility": 1.0,
                         "memory_mb": {DEVICE: MB}, "latency_fit": {...} or null}},
     "status": "OPTIMAL", "gap": 0.0, "solve_seconds": 0.01, "planning_seconds": 3.2,
     "objective": "weighted" or "fairness", "dropped": [{"name": ..., "reason": ...}], "cluster": "cluster.yaml",
     "share": null or {"devices": {DEVICE: {"services": [NAME, ...], "memory_mb", "usable_mb",
                                            "held_ms_per_s", "budget_ms_per_s"}}}}

"share" (`edgec allocate --share`), each service's "held_ms_per_s" ({DEVICE: ms per s}) and
"predicted_energy_mj" may be missing (allocations written before they existed): no device is shared then. Only with "share" may a device
be given to more than one service.

Each service runs as `edgec run` runs one build, in a thread of its own driving its own coordinator and
workers. A device shared by two services (--share) gets a worker per service: locally two worker
processes under one device name; on real hardware two `edgec worker` daemons on that host, at different
ports (the addresses in each service's manifest). Progress lines on stderr name their service. SIGINT or
SIGTERM stops every service at its next step (a request, or the end of its start-up): each closes its own
coordinator and workers before run_all raises Interrupted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from ..machine import available_cores
from ..errors import EdgecRuntimeError, InputError
from ..interrupts import Interrupted, check_interrupted
from ..manifest.load import load_manifest

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
    shared: bool = False  # devices may serve more than one service


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
    "share": (lambda v: v is None or (isinstance(v, dict) and set(v) == {"devices"} and isinstance(v["devices"], dict)),
              "null or {\"devices\": {...}}"),
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
    "predicted_energy_mj": (_opt(_nonneg), "a non-negative number or null"),
    "utility": (_number, "a number"),
    "normalised_utility": (_number, "a number"),
    "memory_mb": (lambda v: isinstance(v, dict) and all(_nonneg(x) for x in v.values()),
                  "a mapping of device names to megabytes"),
    "latency_fit": (lambda v: v is None or isinstance(v, dict), "a mapping or null"),
    "held_ms_per_s": (lambda v: isinstance(v, dict) and all(_nonneg(x) for x in v.values()),
                      "a mapping of device names to ms per s"),
}
_OPTIONAL = {"share", "held_ms_per_s", "predicted_energy_mj"}  # absent from allocations written before them


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
    shared = data.get("share") is not None
    for name, entry in data["services"].items():
        where = f"services[{name!r}]"
        if not isinstance(entry, dict):
            raise InputError(f"{path}: {where} must be an object")
        _keys(entry, _SERVICE, where, path)
        rel = PurePosixPath(entry["manifest"])
        if rel.is_absolute() or ".." in rel.parts or "\\" in entry["manifest"]:
            raise InputError(f"{path}: {where}.manifest {entry['manifest']!r} must stay inside the allocation's folder")
        for d in entry["devices"]:
            if d in owner and not shared:
                raise InputError(f"{path}: device {d!r} is given to both {owner[d]!r} and {name!r} (only an "
                                 "allocation with \"share\" shares devices)")
            owner[d] = name
        services.append(ServiceEntry(name, tuple(entry["devices"]), path.parent / rel, float(entry["sla_ms"]),
                                     None if entry["rate_ips"] is None else float(entry["rate_ips"]),
                                     float(entry["predicted_latency_ms"])))
    return Allocation(path, tuple(services), data["status"], shared)


def _keys(obj: dict, spec: dict, where: str, path: Path) -> None:
    for key in obj:
        if key not in spec:
            raise InputError(f"{path}: unknown key {key!r} in {where} (allowed: {', '.join(spec)})")
    for key, (check, what) in spec.items():
        if key not in obj and key in _OPTIONAL:
            continue
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


def run_all(outdir: str | Path, *, repeat: int = 1, verify: bool = False, tolerance: float | None = None,
            threads: int | None = None, emulate: bool = False, timeout: float = 60.0, seed: int = 0,
            warmup: int = 1) -> dict:
    """Run every service of OUTDIR's allocation at once (random inputs), each `repeat` timed requests after
    `warmup` untimed ones (as `edgec run --warmup`); return the `edgec run-all --json` object: per service,
    its measured median latency against its SLA (and --verify's verdict). A service whose run fails raises its error, prefixed by its name,
    once every run has ended. Interrupted (SIGINT, SIGTERM under interrupt_on_signals) reaches every
    service's thread at its next step; each closes its coordinator and workers, and then it is raised."""
    from .api import check_options  # api imports the coordinator's whole stack: only when running

    check_options(repeat, threads, timeout, tolerance, warmup=warmup, seed=seed)
    allocation = load_allocation(outdir)
    check_builds(allocation)
    threads = default_threads(allocation) if threads is None else threads
    results: dict[str, Any] = {}
    stop = threading.Event()

    done = {s.name: threading.Event() for s in allocation.services}

    def one(s: ServiceEntry) -> None:
        try:
            results[s.name] = _run_service(s, stop, repeat=repeat, verify=verify, tolerance=tolerance,
                                           threads=threads, emulate=emulate, timeout=timeout, seed=seed,
                                           warmup=warmup)
        except BaseException as exc:  # reported by the main thread, which owns the exit code
            results[s.name] = exc
        finally:
            done[s.name].set()

    # Daemon threads only so that a second signal, during the wait for the services to close, ends the
    # process at once; the first one is waited for: each service closes its own workers.
    runs = [threading.Thread(target=one, args=(s,), name=f"run-all {s.name}", daemon=True)
            for s in allocation.services]
    with _named_records(logging.getLogger("edgec.runtime")):
        started = []
        try:
            for t in runs:
                t.start()
                started.append(t.name[len("run-all "):])
            _wait(done.values())
        finally:  # an interrupt (or any error) here: every service stops and closes its workers first
            stop.set()
            _wait(done[name] for name in started)
    for s in allocation.services:
        if isinstance(results[s.name], BaseException):
            exc = results[s.name]
            if isinstance(exc, EdgecRuntimeError):
                raise type(exc)(f"service {s.name!r}: {exc}") from None
            raise exc
    return _report(allocation, results, threads, warmup)


def _wait(events) -> None:
    """Until every event is set. Not Thread.join: a signal handler's exception inside join() (Python 3.11)
    marks the thread joined although it still runs, and the wait after the interrupt would not wait."""
    for e in events:
        while not e.wait(0.2):
            pass


def _run_service(s: ServiceEntry, stop: threading.Event, *, repeat: int, verify: bool, tolerance: float,
                 threads: int, emulate: bool, timeout: float, seed: int, warmup: int) -> dict:
    """What api.execute does for one build on random inputs, with its progress logged under its name
    and a stop check at every step: `stop` set (the main thread was interrupted) raises Interrupted here,
    which unwinds run_manifest's cluster (its workers closed)."""
    from .api import Checker, report
    from .api import run_manifest
    from ..coordinator.inputs import load_inputs
    from ..coordinator.verify import check_model, plan_tolerance, reference_outputs

    def step() -> None:
        if stop.is_set():
            check_interrupted()  # with the signal that stopped the run, when one did
            raise Interrupted(signal.SIGTERM)

    def say(msg: str) -> None:
        step()
        logger.info("%s", msg)

    m = load_manifest(s.manifest)
    if verify:
        check_model(m)
    given = load_inputs(m, random=True, seed=seed)
    checker = Checker(reference_outputs(m, given, model_checked=True),
                      plan_tolerance(m) if tolerance is None else tolerance) if verify else None

    def check(outputs) -> None:
        step()
        if checker is not None:
            checker.add(outputs)

    step()
    try:
        result = run_manifest(m, given, repeat=repeat, warmup=warmup, threads=threads, emulate=emulate,
                              timeout=timeout, progress=say, check=check)
    except Interrupted:
        logger.info("stopped (its workers closed)")  # run_manifest's cluster has unwound
        raise
    return report(m, result, None if checker is None else checker.result())


class _ServiceName(logging.Filter):
    """Prefixes a record logged in a service's thread ("run-all NAME") with "NAME: "."""

    def filter(self, record: logging.LogRecord) -> bool:
        name = threading.current_thread().name
        if name.startswith("run-all ") and not getattr(record, "_service_named", False):
            record.msg, record.args = f"{name[len('run-all '):]}: {record.getMessage()}", None
            record._service_named = True
        return True


@contextlib.contextmanager
def _named_records(log: logging.Logger):
    """Within: the records that `log`'s handlers (and its parents', while it propagates) print from a
    service's thread name that service."""
    named, handlers, current = _ServiceName(), [], log
    while current is not None:
        handlers += current.handlers
        current = current.parent if current.propagate else None
    for h in handlers:
        h.addFilter(named)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(named)


def _report(allocation: Allocation, runs: dict[str, dict], threads: int, warmup: int) -> dict:
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
    return {"allocation": str(allocation.path), "threads": threads, "warmup": warmup, "services": services,
            "all_sla_met": all(v["sla_met"] for v in services.values()),
            "verify_passed": all(verdicts) if verdicts else None}
