"""`edgec.run(...)`: the runtime for build scripts, returning what `edgec run --json` prints."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np

from ..coordinator.accuracy import build_report, check_report_path, write_report
from ..coordinator.adapt import THRESHOLD, Adapter, kept_plans
from ..wire.compress import parse_mode
from ..coordinator.liveness import HEARTBEAT_MS
from ..coordinator.failover import FailoverPool
from ..coordinator.connect import load_keys
from ..coordinator.window import steady_throughput
from ..coordinator.emulate import Overruns, undilated_offsets
from ..errors import InputError
from ..files import write_atomically
from ..coordinator.inputs import check_inputs, check_memory, load_inputs
from ..machine import MAX_THREADS_HERE
from ..manifest.types import Manifest
from ..manifest.load import load_manifest
from ..wire.keys import Keyring
from ..wire.protocol import MAX_DILATE
from ..serve.session import Cluster
from ..device.session import MAX_INFLIGHT
from ..coordinator.trace import Trace, check_trace_path, write_trace
from ..coordinator.verify import VerifyResult, check_model, compare_outputs, plan_tolerance, reference_outputs

__all__ = ["run", "execute", "report", "RunResult", "write_npz", "parse_addresses", "parse_slow", "check_options",
           "Checker", "RequestsChecked", "run_manifest", "MAX_INFLIGHT", "MIN_HEARTBEAT_MS", "MAX_HEARTBEAT_MS",
           "MAX_DILATE", "MAX_TIMEOUT_S"]

logger = logging.getLogger(__name__)
# One record per timed request ("request N/REPEAT: LATENCY ms", with `done` and `total`): `edgec run` prints
# them with --verbose, draws a progress bar from them on a terminal, and leaves them out otherwise.
request_log = logging.getLogger("edgec.runtime.requests")

# Faster than 10 ms, heartbeats only add traffic; slower than a minute, a hung device stalls the run for long.
MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS = 10, 60_000
MAX_WARMUP = 1000
# zmq takes its send timeout in int32 milliseconds (24.8 days): a day is far beyond any start-up or request.
MAX_TIMEOUT_S = 86_400.0


@dataclasses.dataclass
class RunResult:
    """What run_manifest measured: the outputs, the timings and what the coordinator reports of the run."""

    outputs: dict[str, np.ndarray]
    latencies_ms: list[float]
    device_run_ms: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per device, one entry per request
    threads: int = 0  # onnxruntime intra-op threads per local worker (0 = onnxruntime's default)
    inflight: int = 1
    throughput_ips: float = 0.0  # steady state: outputs after the first / (last output - first); see run_manifest
    devices: dict[str, dict] = dataclasses.field(default_factory=dict)  # per worker: address, bytes counted, memory
    compress: str = "none"  # the --compress mode of device-to-device tensors
    completed: int = 0  # timed requests whose outputs came back (the warm-up is not counted)
    warmup: int = 1  # untimed requests run one at a time before the timed ones
    lost: int = 0  # timed requests asked for and not completed
    failovers: list[dict] = dataclasses.field(default_factory=list)  # [{device, at_request, plan}] (FailoverPool)
    accuracy: dict | None = None  # run_manifest(timings=True): the --report object (coordinator/accuracy.py)
    trace: dict | None = None  # run_manifest(trace=True): the --trace object (coordinator/trace.py)
    emulation: dict | None = None  # run_manifest(emulate=True): {dilate, overruns} (emulate.Overruns.as_json)
    adaptations: list[dict] = dataclasses.field(default_factory=list)  # run_manifest(adapt=...): adapt.Adapter.as_json

    @property
    def latency_ms(self) -> float:
        return statistics.median(self.latencies_ms)


def run(manifest: str | os.PathLike, *, inputs: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
        random_inputs: bool = False, seed: int = 0, verify: bool = False, model: str | os.PathLike | None = None,
        tolerance: float | None = None, repeat: int = 1, warmup: int = 1, threads: int | None = None, emulate: bool = False,
        timeout: float = 60.0, output: str | os.PathLike | None = None, addresses: Mapping[str, str] | None = None,
        keys: str | os.PathLike | None = None, inflight: int | None = None, compress: str = "none",
        heartbeat_ms: int = HEARTBEAT_MS, report: str | os.PathLike | None = None,
        dilate: float | None = None, trace: str | os.PathLike | None = None, adapt: bool = False,
        adapt_threshold: float = THRESHOLD, adapt_for: str | None = None,
        slow: Mapping[str, tuple[int, float]] | None = None) -> dict:
    """Run a compiled build (its manifest.json, or the folder holding it); return the `--json` report.

    `inputs` is an .npz file or `{input name: array}`; or pass `random_inputs=True`. With `verify`, the
    source model (the manifest's, or `model`) runs whole in onnxruntime and `report["verify"]["passed"]`
    says whether every output of every request (the warm-up's too) matched. `addresses` ({device: "tcp://HOST:PORT"}) overrides the manifest's
    worker addresses; `keys` is the cluster's keys folder (`edgec keygen`); `inflight` the number of
    requests kept in flight (default: the plan's pipeline depth; 1 = one request at a time); `compress`
    how devices send tensors to each other: "none", "lz4", "zstd" or "auto" (compress where the link's
    bandwidth in the manifest makes it pay, judged from this machine's measured codec speeds);
    `heartbeat_ms` the heartbeat interval on every worker connection (a device silent for 5 of them is
    lost, and a build compiled with fallbacks finishes on the devices left); `report` a JSON file to write
    the accuracy report into, predicted against measured per fragment and transfer (`--report`, schema
    in edgec.runtime.coordinator.accuracy; its folder must exist); `trace` a JSON file to write the timed requests'
    measured timeline into, in Chrome's trace event format (`--trace`, edgec.runtime.coordinator.trace; it opens in
    Perfetto); `dilate` (1 to MAX_DILATE, with `emulate` only)
    stretches every emulated time by that factor and divides every reported time by it, so that a host
    slower than the emulated devices keeps their timeline (`report["emulation"]` lists the fragment runs
    that still took longer than their padding). With `adapt`, the run switches between the plans the build
    kept (`compile --keep N`, `--shifts`, and the `--fallbacks` without one device each) when the plan in use, re-costed with the measured figures, moves
    more than `adapt_threshold` (relative) from what it was chosen under, to the best when re-costed so, by
    `adapt_for` ("latency" or "throughput"; default the build's objective) (edgec.runtime.coordinator.adapt;
    `report["adaptations"]` lists each decision). `slow`
    ({device: (request, factor)}, with `emulate` only) emulates a device slowing down: from the timed
    request of that index (from 0) on, its fragment runs take factor x their predicted time. Bad input raises
    `edgec.runtime.errors.InputError`; a failed run, `RunError`. The other arguments are the command's
    options.

        >>> import edgec
        >>> report = edgec.run("build/tinychain", random_inputs=True, verify=True)  # doctest: +SKIP
        >>> report["verify"]["passed"]                                              # doctest: +SKIP
        True
    """
    common = dict(random_inputs=random_inputs, seed=seed, verify=verify, model=model, tolerance=tolerance,
                  repeat=repeat, warmup=warmup, threads=threads, emulate=emulate, timeout=timeout,
                  addresses=addresses, keys=keys, inflight=inflight, compress=compress, heartbeat_ms=heartbeat_ms,
                  report=report, dilate=dilate, trace=trace, adapt=adapt, adapt_threshold=adapt_threshold,
                  adapt_for=adapt_for, slow=slow)
    if isinstance(inputs, Mapping):
        loaded = execute(manifest, arrays=inputs, **common)
    else:
        loaded = execute(manifest, npz=None if inputs is None else os.fspath(inputs), **common)
    m, result, checked = loaded
    if output is not None:
        write_npz(os.fspath(output), result.outputs)
    return _json_report(m, result, checked)


def execute(manifest: str | os.PathLike, *, npz: str | None = None, pairs: Iterable[str] = (),
            arrays: Mapping[str, np.ndarray] | None = None, random_inputs: bool = False, seed: int = 0,
            verify: bool = False, model: str | os.PathLike | None = None, tolerance: float | None = None, repeat: int = 1,
            warmup: int = 1, threads: int | None = None, emulate: bool = False, timeout: float = 60.0,
            addresses: Mapping[str, str] | None = None, keys: str | os.PathLike | None = None,
            inflight: int | None = None, compress: str = "none", heartbeat_ms: int = HEARTBEAT_MS,
            report: str | os.PathLike | None = None, dilate: float | None = None,
            trace: str | os.PathLike | None = None, adapt: bool = False, adapt_threshold: float = THRESHOLD,
            adapt_for: str | None = None, slow: Mapping[str, tuple[int, float]] | None = None
            ) -> tuple[Manifest, RunResult, RequestsChecked | None]:
    """Load, check and run a manifest on its inputs; verify every request's outputs when asked; write the
    accuracy report to `report` (result.accuracy holds it) and the measured timeline to `trace`
    (result.trace). What `edgec run` and `run` share."""
    check_options(repeat, threads, timeout, tolerance, inflight, heartbeat_ms, warmup, seed)
    dilate = _check_dilate(dilate, emulate)
    if report is not None:  # before the run: a report that cannot be written fails in a second
        check_report_path(report)
    if trace is not None:
        check_trace_path(trace)
    compress = parse_mode(compress)
    keyring = load_keys(keys)
    path = Path(manifest)
    m = load_manifest(path / "manifest.json" if path.is_dir() else path)
    if model is not None:
        if not verify:
            raise InputError(f"--model {model}: the source model is used by --verify only; add --verify")
        m = dataclasses.replace(m, model_path=Path(model))
    if verify:  # before the run: a moved or changed model fails in a second, not after the whole run
        check_model(m)
    slow = _check_slow(slow, m, emulate)
    adapter = kept_plans(m, adapt_threshold, adapt_for) if adapt else None
    if arrays is not None:
        if random_inputs:
            raise InputError("random inputs cannot be combined with given inputs")
        given = {str(k): np.asarray(v) for k, v in arrays.items()}
        check_inputs(m, given, {}, origin="inputs")
        check_memory(m)
    else:
        given = load_inputs(m, npz=npz, pairs=pairs, random=random_inputs, seed=seed)
    checker = None
    if verify:  # the reference first: every request's outputs are compared with it as they arrive
        logger.info("verifying against %s", m.model_path)
        checker = Checker(reference_outputs(m, given, model_checked=True),
                          plan_tolerance(m) if tolerance is None else tolerance)
    result = run_manifest(m, given, repeat=repeat, warmup=warmup, threads=threads, emulate=emulate,
                          timeout=timeout, progress=logger.info, addresses=addresses, keys=keyring, inflight=inflight,
                          compress=compress, heartbeat_ms=heartbeat_ms, timings=report is not None, dilate=dilate,
                          check=None if checker is None else checker.add, trace=trace is not None,
                          adapter=adapter, slow=slow)
    if report is not None:
        write_report(report, result.accuracy)
    if trace is not None:
        write_trace(trace, result.trace)
    return m, result, None if checker is None else checker.result()


def run_manifest(manifest: Manifest, inputs: Mapping[str, np.ndarray], *, repeat: int = 1, threads: int | None = None,
                 emulate: bool = False, timeout: float = 60.0, warmup: int = 1,
                 progress: Callable[[str], None] | None = None, addresses: Mapping[str, str] | None = None,
                 keys: Keyring | None = None, inflight: int | None = None, compress: str = "none",
                 heartbeat_ms: int = HEARTBEAT_MS, timings: bool = False, dilate: float = 1.0,
                 check: Callable[[dict[str, np.ndarray]], None] | None = None, trace: bool = False,
                 adapter: Adapter | None = None, slow: Mapping[str, tuple[int, float]] | None = None) -> RunResult:
    """A run as a client of the serving session (edgec.Cluster): reach the workers, run `warmup` untimed
    requests one at a time and then `repeat` timed requests with up to `inflight` in flight (default: the
    plan's pipeline depth), end the run. A device lost on the way is replaced by the manifest's fallback
    plan without it, when there is one (FailoverPool). With `timings`, `result.accuracy` is the --report
    object (coordinator/accuracy.py) of the timed requests; with `trace`, `result.trace` is the --trace
    object (coordinator/trace.py) of the same requests. `check` is called with every request's outputs as
    they arrive (the warm-up's too). With `emulate`, every time is stretched by `dilate` during the run and
    reported divided by it (coordinator/emulate.py); fragment runs that overran their padding are logged as
    warnings and listed in `result.emulation`. With an `adapter`, the run switches between the build's kept
    plans as the measured figures drift (coordinator/adapt.py), and `result.adaptations` lists its decisions;
    `slow` ({device: (timed request index, factor)}, with `emulate`) slows a device down from that request on."""
    say = progress or (lambda _msg: None)
    overruns = Overruns(dilate) if emulate else None
    recorder = Trace(emulated=emulate) if trace else None
    with Cluster.open(manifest, threads=threads, emulate=emulate, timeout=timeout, addresses=addresses, keys=keys,
                      inflight=inflight, compress=compress, heartbeat_ms=heartbeat_ms,
                      timings=timings or adapter is not None, dilate=dilate, overruns=overruns, trace=recorder,
                      adapter=adapter, slow=slow) as session:
        pool = session.pool
        say(f"{len(pool.workers)} worker(s) ready ({sum(w.local for w in pool.workers.values())} local), "
            f"up to {pool.inflight} request(s) in flight")
        for i in range(warmup):  # first runs allocate and fill caches: they are no steady-state figure
            say(f"warm-up request {i + 1}/{warmup}")
            outputs = session.infer(inputs)
            if check is not None:
                check(outputs)
        session.call(lambda p: _forget_warmup(p, adapter, recorder, overruns)).result()
        # device_report, not workers: a device lost as the run started is reported too
        result = RunResult(outputs={}, latencies_ms=[], device_run_ms={n: [] for n in pool.device_report()},
                           threads=pool.threads, inflight=pool.inflight, compress=pool.compress, warmup=warmup)
        start = time.perf_counter()
        done_at: list[float] = []  # when each timed request's outputs came back
        waiting: deque = deque()
        outstanding = session.queue_size + pool.inflight  # futures held at once: memory stays bounded

        def take() -> None:
            future = waiting.popleft()
            outputs = future.result()
            done_at.append(future.done_at)
            if check is not None:
                check(outputs)
            result.outputs = outputs
            result.latencies_ms.append(future.latency_ms / dilate)
            for name, ms in future.run_ms.items():
                result.device_run_ms.setdefault(name, []).append(ms / dilate)  # a fallback may bring in a device
            request_log.info("request %d/%d: %.2f ms", len(done_at), repeat, future.latency_ms / dilate,
                             extra={"done": len(done_at), "total": repeat})

        for _ in range(repeat):
            while waiting and (waiting[0].done() or len(waiting) >= outstanding):
                take()
            waiting.append(session.submit(inputs, block=True))
        while waiting:
            take()
        result.throughput_ips = steady_throughput(start, done_at) * dilate
        result.completed, result.lost = len(done_at), repeat - len(done_at)
        result.failovers = list(pool.failovers)
        result.adaptations = [] if adapter is None else adapter.as_json()
        if timings:
            result.accuracy = session.call(lambda p: build_report(
                p.manifest, repeat=repeat, latency_ms=result.latency_ms, throughput_ips=result.throughput_ips,
                samples=p.samples, offsets=undilated_offsets(p.offsets, dilate), failovers=result.failovers)).result()
        if recorder is not None:
            result.trace = recorder.as_json()
    result.devices = pool.device_report()
    if overruns is not None:
        result.emulation = overruns.as_json()
        for line in overruns.warnings():
            logger.warning("%s", line)
    return result


def _forget_warmup(pool: FailoverPool, adapter: Adapter | None, recorder: Trace | None,
                   overruns: Overruns | None) -> None:
    """On the session's I/O thread, between requests: the warm-up is neither counted, timed nor judged."""
    pool.completed = pool.handed = 0  # completed, handed and at_request count the timed requests
    if adapter is not None:
        adapter.forget()
    if pool.samples is not None:
        pool.samples.clear()
    if recorder is not None:
        recorder.clear()
    if overruns is not None:
        overruns.clear()  # first runs allocate


@dataclasses.dataclass
class RequestsChecked(VerifyResult):
    """--verify over a whole run: the worst difference of every output over all the requests checked."""

    requests_checked: int = 0

    def as_json(self) -> dict:
        return {**super().as_json(), "requests_checked": self.requests_checked}


class Checker:
    """Compares each request's outputs with the reference as they arrive, keeping per output only the
    outputs that differ most so far (all requests have the same inputs, so one reference serves them all)."""

    def __init__(self, reference: dict[str, np.ndarray], tolerance: float):
        self.reference, self.tolerance = reference, tolerance
        self.worst: dict[str, tuple[float, np.ndarray | None]] = {}
        self.count = 0

    def add(self, outputs: Mapping[str, np.ndarray]) -> None:
        diffs = compare_outputs(outputs, self.reference, self.tolerance).per_output
        for name, diff in diffs.items():
            if name not in self.worst or diff > self.worst[name][0]:
                self.worst[name] = (diff, outputs.get(name))  # missing: compare_outputs counts it as infinite
        self.count += 1

    def result(self) -> RequestsChecked:
        """compare_outputs of the worst outputs: its verdict is that of the worst request of each output."""
        v = compare_outputs({name: arr for name, (_, arr) in self.worst.items() if arr is not None}, self.reference,
                            self.tolerance)
        return RequestsChecked(**dataclasses.asdict(v), requests_checked=self.count)


def parse_addresses(pairs: Iterable[str]) -> dict[str, str]:
    """`NAME=tcp://HOST:PORT` pairs (the repeatable --addresses) as {device: address}."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, address = pair.partition("=")
        if not sep or not name or not address:
            raise InputError(f"--addresses {pair!r}: expected NAME=tcp://HOST:PORT")
        if name in out:
            raise InputError(f"--addresses: device {name!r} given twice")
        out[name] = address
    return out


def parse_slow(specs: Iterable[str]) -> dict[str, tuple[int, float]]:
    """`NAME=FACTOR[@REQUEST]` (the repeatable --slow) as {device: (request, factor)}; request 0 if not given."""
    out: dict[str, tuple[int, float]] = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        factor, at, request = rest.partition("@")
        try:
            parsed = (int(request) if at else 0, float(factor))
        except ValueError:
            parsed = None
        if not sep or not name or parsed is None:
            raise InputError(f"--slow {spec!r}: expected NAME=FACTOR or NAME=FACTOR@REQUEST (e.g. pi-a=3@50)")
        if name in out:
            raise InputError(f"--slow: device {name!r} given twice")
        out[name] = parsed
    return out


def _check_slow(slow: Mapping[str, tuple[int, float]] | None, m: Manifest, emulate: bool
                ) -> dict[str, tuple[int, float]]:
    """The emulated slow-downs, checked: emulation only, devices of the manifest, a factor the padding can
    take, a request index from 0."""
    if not slow:
        return {}
    if not emulate:
        raise InputError("--slow emulates a device slowing down: it needs --emulate")
    for name, (request, factor) in slow.items():
        if name not in m.device_names:
            raise InputError(f"--slow {name}: {m.path} has no device {name!r} (devices: {', '.join(m.device_names)})")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
                or not 1.0 / MAX_DILATE <= factor <= MAX_DILATE:
            raise InputError(f"--slow {name}: factor {factor!r}, expected {1 / MAX_DILATE:g} to {MAX_DILATE:g}")
        if isinstance(request, bool) or not isinstance(request, int) or request < 0:
            raise InputError(f"--slow {name}: request {request!r}, expected a timed request's index, from 0")
    return {name: (int(r), float(f)) for name, (r, f) in slow.items()}


def _check_dilate(dilate: float | None, emulate: bool) -> float:
    """The dilation to run at: 1 unless given (with emulate only, 1 to MAX_DILATE)."""
    if dilate is None:
        return 1.0
    if not emulate:
        raise InputError(f"--dilate {dilate!r} stretches emulated time: it needs --emulate")
    if isinstance(dilate, bool) or not isinstance(dilate, (int, float)) or not 1.0 <= dilate <= MAX_DILATE:
        raise InputError(f"--dilate {dilate!r}: expected a number from 1 (real time) to {MAX_DILATE:g}")
    return float(dilate)


def check_options(repeat: int, threads: int | None, timeout: float, tolerance: float,
                  inflight: int | None = None, heartbeat_ms: int = HEARTBEAT_MS, warmup: int = 1,
                  seed: int = 0) -> None:
    """InputError (one line) for an option outside what a run can take: the CLI's ranges, for API callers."""
    if not isinstance(heartbeat_ms, int) or isinstance(heartbeat_ms, bool) \
            or not MIN_HEARTBEAT_MS <= heartbeat_ms <= MAX_HEARTBEAT_MS:
        raise InputError(f"heartbeat_ms {heartbeat_ms!r}: expected {MIN_HEARTBEAT_MS} to {MAX_HEARTBEAT_MS} "
                         "milliseconds")
    if inflight is not None and (not isinstance(inflight, int) or isinstance(inflight, bool)
                                 or not 1 <= inflight <= MAX_INFLIGHT):
        raise InputError(f"inflight {inflight!r}: expected 1 (one request at a time) to {MAX_INFLIGHT}")
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        raise InputError(f"repeat {repeat!r}: expected a positive integer")
    if not isinstance(warmup, int) or isinstance(warmup, bool) or not 0 <= warmup <= MAX_WARMUP:
        raise InputError(f"warmup {warmup!r}: expected 0 to {MAX_WARMUP} untimed requests")
    if threads is not None and (not isinstance(threads, int) or not 0 <= threads <= MAX_THREADS_HERE):
        raise InputError(f"threads {threads!r}: expected 0 (onnxruntime's default) to {MAX_THREADS_HERE} "
                         "(4 x this machine's cores)")
    if not _number(timeout) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise InputError(f"timeout {timeout!r}: expected a number of seconds above 0, at most {MAX_TIMEOUT_S:g}")
    if tolerance is not None and (not _number(tolerance) or not 0 <= tolerance < math.inf):
        raise InputError(f"tolerance {tolerance!r}: expected a finite number >= 0")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"seed {seed!r}: expected an integer >= 0")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def report(manifest: Manifest, result: RunResult, checked: VerifyResult | None) -> dict:
    """The `edgec run --json` object (keys are stable; documented by docs/gen/jsonout.py)."""
    return {
        "manifest": str(manifest.path),
        "latency_ms": result.latency_ms,
        "latencies_ms": result.latencies_ms,
        "warmup": result.warmup,
        "throughput_ips": result.throughput_ips,
        "inflight": result.inflight,
        "completed": result.completed,
        "lost": result.lost,
        "failovers": result.failovers,
        "adaptations": result.adaptations,
        "compress": result.compress,
        "outputs": [{"name": o.name, "shape": list(result.outputs[o.name].shape),
                     "dtype": result.outputs[o.name].dtype.name} for o in manifest.outputs],
        "verify": None if checked is None else _finite(checked.as_json()),
        "emulation": result.emulation,
        "devices": {name: {"fragments_run_ms": statistics.median(ms) if ms else 0.0, **result.devices.get(name, {})}
                    for name, ms in result.device_run_ms.items()},
    }


_json_report = report  # run() has a keyword of that name


def _finite(d: dict) -> dict:
    """Strict JSON has no Infinity/NaN: an unbounded difference (shape mismatch, NaN) becomes null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}


def write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically (never a half-written archive)."""
    write_atomically(path, "the outputs", lambda fh: np.savez(fh, **arrays))
