"""The runtime's own costs on this machine (the profile's `runtime:`), measured through the runtime's code.

- message_ms, message_ms_per_mb: a tensor message between two local workers, started by the runtime's
  coordinator at 1 thread each like the workers of `edgec run` on one machine (two processes, CURVE sockets
  with the run's keys). A request's steps send a tensor from worker a to worker b and back; each way is
  timed as `edgec run --report` times a transfer, from the sender's send step starting to the receiver
  holding the decoded tensor, and the hand-off is the mean of both ways (a worker's clock offset adds to
  one way what it takes from the other, so it cancels). Timed for a 64-byte tensor (the fixed part) and a
  1 MiB one (quick: 256 KiB), each in requests of its own whose input is no larger than the tensor exchanged;
  the per-MB figure is the difference per 10^6 bytes. Both ends run here, so
  the figure is both ends' work. The workers keep their heap (runtime worker.keep_heap), as every worker does:
  with glibc's defaults each 1 MiB message faulted in fresh pages, and its hand-off alternated between about
  1.0 and 1.8 ms from one request to the next, so message_large's spread stayed at 26-28% (the profile warned,
  and `--strict` refused); now 4-10%, and message_ms_per_mb 0.78-0.87 against 1.07-1.26 (5 measurements each,
  2026-11-27).
  Why two workers and not two sockets in one process: a worker wakes from its poll in its own process and
  runs the runtime's send and receive steps; two sockets echoing inside one process skip both, and
  measured a 64-byte message at less than half of what the runtime pays on this 2-core machine.
  Why back to back: in a plan a message follows a fragment run, which leaves the runtime's code out of
  the caches, and the receiver's decoding then takes longer (62 us for a 57 KB halo after a ResNet-50
  tile, about 15 us back to back). Timed after a fragment run on both ends, the figures came out 10-30%
  higher, but a worker that waits a millisecond wakes late by a varying amount on this virtual machine,
  and their spread (40%) stayed far above the profile's bound; back to back they settle.
- run_ms: what a fragment run in a plan takes beyond the same run timed alone and hot, as the profile times
  everything else (`_run_build`): worker b runs `_evict_model` (two 3x3 convolutions, 128 channels at
  14 x 14, 1.2 MB of weights, about 1 ms here) right after it took a's message, as a tile runs after its
  halo arrives; the worker's own timing of that run ("run_in_plan") less the model run in this process,
  its inputs and outputs bound once, run after run ("run_alone"). Measured here: 0.09-0.11 ms on that
  fragment (0.06 on a 0.25 ms one, 0.17 on a 4 ms one: it grows slowly with the fragment), which every
  tile of a spatial stage pays (cost/tiles.py).
- request_ms: one request of a one-fragment manifest (a 64-float Relu) run by the runtime's coordinator
  with a local worker at 1 thread: the request's latency less the fragment's run, i.e. the model input in
  from the coordinator, the output out to it, and the request's control messages.
- message_cpu_ms_per_mb, request_cpu_ms: the same in CPU time, every thread of the coordinator (this
  process) and of its local workers counted (Linux: /proc/PID/task/*/schedstat). ZeroMQ's I/O threads
  encrypt and copy while the sender goes on, so a byte takes more CPU than time: what devices sharing a
  machine take of its cores. message_cpu_ms_per_mb is the difference, per message and per 10^6 bytes,
  between a request exchanging a large tensor CPU_EXCHANGES times (a to b and back each time) and one
  exchanging a 64-byte tensor as many times, on the same two workers with the same input and output (the
  messages' fixed CPU cancels); request_cpu_ms is a request of the 64-float Relu. Why several exchanges: both
  requests also carry the large input in from the coordinator, whose CPU wandered by as much as one
  exchange's (2.6-3.3 ms per request, against 1.5-2.1 ms more for one exchange of 1 MiB), and the figure
  moved by 16-18% between profiles taken back to back with one; with 4, six measurements lay within
  0.94-1.00 ms per MB, against 0.74-1.04 in nine with one (2026-11-27). The fixed CPU
  of a message is not taken: a difference of two requests' CPU that small (0.1-0.4 ms) drowned in how
  this machine's CPU per request wanders (3.6 to 5.4 ms for the same request, minutes apart); message_ms
  stands in. Left out where /proc cannot say.

Under a CPU share below a core (ONE_CPU_BELOW; the profile's quota.py reads or measures it), every thread of the
coordinator and of its workers runs on one CPU while these are timed. They stand in for two devices and the
coordinator but share one quota, and CFS hands a quota out to each CPU in slices (5 ms) larger than a small quota:
processes of one cgroup on two CPUs stall each other until the next period. Measured on this 2-core machine, in a
0.3-core cgroup (1.5 ms per 5 ms period), a 64-byte hand-off took 0.25-2.4 ms across both CPUs (bimodal, run to
run) and 0.10-0.11 ms on one CPU (0.11 with no quota), while between two testbed hosts of 0.3 cores each, each in
a cgroup of its own, it took 0.17-0.21 ms back to back (0.18 with no quota): a device's own hand-off does not meet
that stall. The requests themselves, back to back, still run the shared quota out, and where a request's CPU is
half the quota or more the median request meets a stall: at 0.25 cores a profile's request_ms came out 4.43 ms
and its message_ms 2.0. So under a quota, a timed request over which the cgroup's throttled time moved (its
cpu.stat) is taken again (`_unstalled`): a lone request on the device finds its quota so. (Idle gaps before each
request instead, so that the quota refills, were worse here: a wake from idle on this virtual machine costs about
0.2 ms, and a 0.25-core hand-off measured 0.25-2.6 ms.) The hand-offs are timed in requests of their own size
for the same reason: with the large tensor's exchange in the same request, its CPU ran the quota out and the
stall landed in the 64-byte hand-off as often as not (1.8-2.2 ms on one CPU too). The per-MB figure under a small
share is still both ends' work within one quota (8.5-8.8 ms per MB at 0.3 cores, one CPU or two), what streamed
requests pay; a lone request's hand-off between two such devices runs at full speed within their bursts (a 256 KiB
one between two idle 0.3-core testbed hosts took 0.93 ms, 0.80 with no quota, where this figure says 2.4), which
the compiler prices with message_cpu_ms_per_mb instead (compiler/cost/quota_burst.py).

Each is timed in rounds of samples until the last `window` agree (timing.py), but unlike the micro-benchmarks:
- a sample is the median of its requests (or runs), not their mean: one late wake-up of a worker is not the
  figure;
- RUNTIME_ROUNDS rounds (8; a quick profile keeps its own), spread over CLUSTERS (4) clusters of fresh workers
  started one after another (`_over_clusters`), the timings' rounds in turn within each;
- the figure is the median round (RUNTIME_QUANTILE), not the fastest.
Why: a pair of workers keeps a speed of its own, and so does a moment of this virtual machine. Over 8 pairs
started one after another, a 64-byte hand-off measured 0.138-0.187 ms per half-second window and 0.145-0.174
ms per pair; one pair for 30 s, 0.126-0.178 per half second but 0.137-0.155 per 2 s. Six runtime measurements
back to back, the old way (one cluster, 4 rounds of 0.15 s, the fastest) against this one (about 9 s longer):
message_ms 0.136-0.183 against 0.121-0.179, message_ms_per_mb 1.05-1.33 against 1.14-1.25, request_ms
0.159-0.182 against 0.161-0.167, request_cpu_ms 0.19-0.39 against 0.233-0.241, message_cpu_ms_per_mb
1.48-1.76 against 1.56-1.78. message_ms and run_ms still move by 20% and more: a 64-byte hand-off is a
worker's wake-up, and run_ms a difference of two figures 3-8% apart.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

from edgec.runtime.manifest.load import file_sha256, load_manifest

from .quota import throttle_reader
from .timing import DEFAULT, Figure, Policy, bound_run, combine, measure_stable, model, session, settle, sig, vi

__all__ = ["measure_runtime_costs", "SMALL_BYTES"]

SMALL_BYTES = 64
_LARGE_BYTES = {False: 1 << 20, True: 1 << 18}
_A, _B = "a", "b"  # the two workers of the message measurement


# Per timing: RUNTIME_ROUNDS rounds of a RUNTIME_SECONDS budget, the figure the median round's (module docstring).
RUNTIME_ROUNDS = 8
RUNTIME_SECONDS = 1.6
RUNTIME_QUANTILE = 0.5
CPU_EXCHANGES = 4  # exchanges in each of message_cpu_ms_per_mb's two requests (module docstring)
CLUSTERS = 4  # the runtime figures' rounds are spread over this many clusters of fresh workers
ONE_CPU_BELOW = 1.0  # under a CPU share below this many cores, the runtime's timings run on one CPU (docstring)


def measure_runtime_costs(policy: Policy, quick: bool, say: Callable[[str], None],
                          cores: float | None = None) -> tuple[dict, dict, list[str]]:
    """({message_ms, message_ms_per_mb, request_ms, and the CPU figures where measured}, {timing name: Figure},
    [a line per figure left out or written as 0 because noise swamped it]) on this machine; `cores`: the CPU
    share this process runs under (None: none seen), below ONE_CPU_BELOW its timings run on one CPU."""
    if policy.rounds >= DEFAULT.rounds:  # a quick profile keeps its few short rounds, in one cluster
        policy = replace(policy, max_seconds=min(policy.max_seconds * RUNTIME_ROUNDS / policy.rounds, RUNTIME_SECONDS),
                         rounds=RUNTIME_ROUNDS)
    mine = _affinity()
    if cores is None or cores >= ONE_CPU_BELOW or not mine:
        return _measure_runtime_costs(policy, quick, say)
    cpu, throttled = min(mine), throttle_reader()
    said = "" if throttled is None else ", each request that met a stall of the quota taken again"
    say(f"  runtime costs under a share of {cores:g} cores: timed on CPU {cpu} alone{said} (the coordinator and "
        "both workers share this process's quota)")
    _set_affinity(os.getpid(), {cpu})
    try:
        return _measure_runtime_costs(replace(policy, cpu=cpu), quick, say, throttled)
    finally:
        _set_affinity(os.getpid(), mine)


def _affinity() -> set[int] | None:
    """The CPUs this thread may run on; None where the OS cannot say (then nothing is pinned)."""
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None


def _set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` onto `cpus`: an affinity is a thread's, and a thread started before (ZeroMQ's
    I/O threads, a worker forked by the zygote before this process was pinned) keeps its own."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, FileNotFoundError):  # a thread that has just ended
            pass


def _measure_runtime_costs(policy: Policy, quick: bool, say: Callable[[str], None],
                           throttled: Callable[[], int] | None = None) -> tuple[dict, dict, list[str]]:
    say("  runtime costs: a message between two local workers and one request through the coordinator")
    STALLED_KEPT.clear()
    large = _LARGE_BYTES[quick]
    figures = _message_figures(policy, large, throttled)
    figures.update(_run_figures(policy))
    figures["request"] = _request_figure(policy, throttled)
    small_ms = figures["message_small"].median_s * 1e3
    per_mb = (figures["message_large"].median_s * 1e3 - small_ms) / (large - SMALL_BYTES) * 1e6
    run_ms = (figures["run_in_plan"].median_s - figures["run_alone"].median_s) * 1e3
    costs = {"message_ms": sig(small_ms), "message_ms_per_mb": sig(max(0.0, per_mb)),
             "request_ms": sig(figures["request"].median_s * 1e3), "run_ms": sig(max(0.0, run_ms))}
    notes = []
    if run_ms <= 0:
        notes.append(f"runtime run_ms written as 0: the fragment ran {-run_ms:.3g} ms faster in the plan than alone "
                     "(timing noise larger than the runtime's cost)")
    if per_mb <= 0:
        notes.append(f"runtime message_ms_per_mb written as 0: the large message took {per_mb:.3g} ms per MB more "
                     "than the 64-byte one (timing noise larger than its bytes' cost)")
    if STALLED_KEPT:
        notes.append(f"runtime costs: {len(STALLED_KEPT)} timed request(s) met a stall of the CPU quota in each of "
                     f"{STALL_TRIES} tries and were kept as they were (the figures may include the stall)")
    cpu = _cpu_figures(policy, large)
    if cpu is not None:
        figures.update(cpu)
        small_cpu, large_cpu = (cpu[k].median_s * 1e3 for k in ("cpu_small", "cpu_large"))
        costs["request_cpu_ms"] = sig(cpu["cpu_request"].median_s * 1e3)
        if large_cpu > small_cpu:
            costs["message_cpu_ms_per_mb"] = sig((large_cpu - small_cpu) / (2 * CPU_EXCHANGES) / (large - SMALL_BYTES)
                                                 * 1e6)
        else:  # the time figure stands in (RuntimeFigures.cpu), as for a profile without CPU figures
            notes.append(f"runtime message_cpu_ms_per_mb not written: a request exchanging the large tensor took "
                         f"{large_cpu:.3g} ms of CPU against {small_cpu:.3g} for the 64-byte one (how much CPU a "
                         "request takes wandered more than its bytes cost); message_ms_per_mb stands in")
    return costs, figures, notes


def source(quick: bool) -> str:
    """How the figures were taken, for the profile's `sources:`."""
    return ("runtime: message_ms = a 64-byte tensor between two local workers of the runtime (1 thread each, CURVE), "
            "from the sender's send step to the receiver holding the decoded tensor as `edgec run --report` times "
            "a transfer, the mean of both ways; "
            f"message_ms_per_mb = the same for a {'256 KiB' if quick else '1 MiB'} "
            "tensor, less message_ms, per 10^6 bytes; request_ms = latency less run time of one request of a "
            "64-float Relu through the runtime's coordinator and a local worker at 1 thread (input in, output out); "
            "run_ms = a 1 ms convolution fragment's run on a worker right after it took a message, less the same "
            "model run hot in one process with its inputs and outputs bound; "
            "message_cpu_ms_per_mb, request_cpu_ms: the same in CPU time of the coordinator and its workers, every "
            "thread (schedstat): the CPU difference per message and per 10^6 bytes between a request exchanging a "
            f"large tensor {CPU_EXCHANGES} times and one exchanging a 64-byte tensor as often between two workers, "
            "and a request of the 64-float Relu; under a CPU share below a core, all of it on one CPU")


def _rounds(sample: Callable[[], float], policy: Policy) -> Figure:
    return settle(lambda: measure_stable(sample, policy, seconds=policy.round_seconds), policy, RUNTIME_QUANTILE)


def _over_clusters(manifest, samplers: dict[str, Callable], policy: Policy, timings: bool = False) -> dict[str, Figure]:
    """{name: Figure} of `samplers` ({name: cluster -> sampler}), their rounds spread over CLUSTERS runtime
    clusters of `manifest` started one after another (fresh workers each), the figures' rounds in turn
    within each, and each figure the round at RUNTIME_QUANTILE (module docstring)."""
    from edgec.runtime.coordinator.pool import WorkerPool

    clusters = max(1, min(CLUSTERS, policy.rounds // 2))
    rounds: dict[str, list] = {name: [] for name in samplers}
    for k in range(clusters):
        per = policy.rounds // clusters + (k < policy.rounds % clusters)
        with WorkerPool(manifest, threads=1, timeout=30.0, timings=timings) as cluster:
            if policy.cpu is not None:
                for w in cluster.workers.values():
                    if w.proc is not None:
                        _set_affinity(w.proc.pid, {policy.cpu})
            made = {name: make(cluster) for name, make in samplers.items()}
            for _ in range(per):
                for name, sample in made.items():
                    rounds[name].append(measure_stable(sample, policy, seconds=policy.round_seconds))
    return {name: combine(r, policy.max_spread, RUNTIME_QUANTILE) for name, r in rounds.items()}


def _sampler(run: Callable[[], float], policy: Policy, warmup: int) -> Callable[[], float]:
    """Seconds of one `run` (which returns its own seconds), the median of enough runs to last
    policy.min_sample_s, after `warmup` runs."""
    for _ in range(warmup):
        run()
    one = max(run(), 1e-7)
    reps = max(1, min(1000, math.ceil(policy.min_sample_s / one)))
    return lambda: statistics.median(run() for _ in range(reps))


def _relu(folder: Path, floats: int) -> Path:
    """f0.onnx in `folder`: y = Relu(x), both (1, floats)."""
    from onnx import helper

    frag = folder / "f0.onnx"
    frag.write_bytes(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", (1, floats))], [vi("y", (1, floats))]))
    return frag


def _manifest(folder: Path, frag: Path, devices: list[str], floats: int, transfers: list, steps: dict) -> Path:
    """manifest.json in `folder` of the build whose model and one fragment (on the first device) is `frag`."""
    tensor = {"shape": [1, floats], "dtype": "float32"}
    doc = {
        "format": "edgec.manifest", "version": 1,
        "model": {"path": frag.name, "sha256": file_sha256(frag)},
        "inputs": [{"name": "x", **tensor}], "outputs": [{"name": "y", **tensor, "device": devices[0]}],
        "devices": [{"name": d, "profile": "this host", "memory_mb": 1024, "address": None, "threads": 1}
                    for d in devices],
        # loopback between local workers: no medium to share, and the figures measured here are the point
        "network": {"bandwidth_mbps": 10000, "latency_ms": 0, "medium": "switched", "links": []},
        "fragments": [{"id": "f0", "device": devices[0], "file": frag.name, "sha256": file_sha256(frag),
                       "inputs": ["x"], "outputs": ["y"], "predicted_ms": 0.0}],
        "transfers": transfers,
        "steps": steps,
    }
    path = folder / "manifest.json"
    path.write_text(json.dumps(doc))
    return path


def _exchange_build(folder: Path, large: int, ways: str = "sl", times: int = 1) -> Path:
    """A two-device build whose request, for each of "s" and "l" in `ways`, sends the first SMALL_BYTES of
    its input ("s") or the whole input (`large` bytes, "l") from a to b and back as a tensor of that name,
    then runs a Relu on a; returns its manifest.json. (The message and CPU figures' build.) `times` > 1: each
    exchange that many times, as "s", "s1", "s2", ... and "l", "l1", "l2", ...."""
    floats, small = large // 4, SMALL_BYTES // 4
    region = [{"axis": 1, "start": 0, "stop": small}]
    transfers, steps_a, steps_b = [], [{"op": "recv", "tensor": "x", "from": "@host"}], []
    exchanges = [(f"{way}{i or ''}", n, r) for way, n, r in (("s", small, region), ("l", floats, None)) if way in ways
                 for i in range(times)]
    for name, n, r in exchanges:
        transfers += [{"tensor": "x", "src": _A, "dst": _B, "shape": [1, n], "dtype": "float32", "bytes": n * 4,
                       "region": r},
                      {"tensor": name, "src": _B, "dst": _A, "shape": [1, n], "dtype": "float32", "bytes": n * 4,
                       "region": None}]
        steps_a += [{"op": "send", "tensor": "x", "to": _B, **({"region": r} if r else {}), "as": name},
                    {"op": "recv", "tensor": name, "from": _B}]
        steps_b += [{"op": "recv", "tensor": name, "from": _A}, {"op": "send", "tensor": name, "to": _A}]
    steps_a += [{"op": "run", "fragment": "f0"}, {"op": "send", "tensor": "y", "to": "@host"}]
    return _manifest(folder, _relu(folder, floats), [_A, _B], floats, transfers, {_A: steps_a, _B: steps_b})


EVICT_SHAPE = (1, 128, 14, 14)  # `_evict_model`'s input and output
RUN_FRAGMENT = "run-b"  # `_run_build`'s fragment whose run the run figure times


def _evict_model(out: str = "out", channels: int = EVICT_SHAPE[1]) -> bytes:
    """Two 3x3 convolutions (128 channels, 14 x 14, padded) with a Relu after each, input "e": about 1 ms at
    1 thread here, its 1.2 MB of weights more than a core's L2.  `channels`: another width, for
    tests/bench/bench_exchange.py (input and output (1, channels, 14, 14); 2 x channels^2 x 36 bytes of weights)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(1)  # fixed: every profile runs the same fragment
    c = channels
    inits = [numpy_helper.from_array(rng.standard_normal((c, c, 3, 3), dtype=np.float32) * 0.03, f"w{i}")
             for i in range(2)]
    nodes = [helper.make_node("Conv", ["e", "w0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], [out])]
    shape = (1, c, *EVICT_SHAPE[2:])
    return model(nodes, [vi("e", shape)], [vi(out, shape)], inits)


def _evict(folder: Path, device: str, fid: str, channels: int = EVICT_SHAPE[1]) -> dict:
    """`<fid>.onnx` in `folder`, `_evict_model` (of `channels`) on `device`; returns its fragment entry (input
    "e", output "<fid>.out")."""
    out = f"{fid}.out"
    path = folder / f"{fid}.onnx"
    path.write_bytes(_evict_model(out, channels))
    return {"id": fid, "device": device, "file": path.name, "sha256": file_sha256(path),
            "inputs": ["e"], "outputs": [out], "predicted_ms": 0.0}


def _run_build(folder: Path) -> Path:
    """The run figure's two-device build: a takes the model's inputs x (SMALL_BYTES) and e, b takes e; a runs
    its `_evict` fragment on e twice and sends x to b, which has run its own `_evict` once meanwhile and waits
    for it; b then runs RUN_FRAGMENT (`_evict` again) alone, the run timed, and sends x back; then a runs a
    Relu on x for the request's output. As a tile's run in a plan, RUN_FRAGMENT follows a fragment run and the
    runtime's handling of a message. Returns its manifest.json."""
    small = SMALL_BYTES // 4
    path = _manifest(folder, _relu(folder, small), [_A, _B], small, [], {})
    doc = json.loads(path.read_text())
    evict = {_A: _evict(folder, _A, "evict-a"), _B: _evict(folder, _B, "evict-b"),
             RUN_FRAGMENT: _evict(folder, _B, RUN_FRAGMENT)}
    doc["inputs"].append({"name": "e", "shape": list(EVICT_SHAPE), "dtype": "float32"})
    doc["fragments"] += list(evict.values())
    doc["transfers"] = [{"tensor": "x", "src": _A, "dst": _B, "shape": [1, small], "dtype": "float32",
                         "bytes": SMALL_BYTES, "region": None},
                        {"tensor": "ping", "src": _B, "dst": _A, "shape": [1, small], "dtype": "float32",
                         "bytes": SMALL_BYTES, "region": None}]

    def run(key: str) -> list:
        return [{"op": "run", "fragment": evict[key]["id"]}, {"op": "free", "tensors": evict[key]["outputs"]}]

    doc["steps"] = {
        _A: [{"op": "recv", "tensor": "x", "from": "@host"}, {"op": "recv", "tensor": "e", "from": "@host"},
             *run(_A), *run(_A), {"op": "send", "tensor": "x", "to": _B, "as": "ping"},
             {"op": "recv", "tensor": "ping", "from": _B}, {"op": "run", "fragment": "f0"},
             {"op": "send", "tensor": "y", "to": "@host"}],
        _B: [{"op": "recv", "tensor": "e", "from": "@host"}, *run(_B), {"op": "recv", "tensor": "ping", "from": _A},
             *run(RUN_FRAGMENT), {"op": "send", "tensor": "ping", "to": _A}],
    }
    path.write_text(json.dumps(doc))
    return path


def _cpu_seconds(pids: list[int]) -> float:
    """CPU time of this process (every thread) and of every thread of `pids`, in seconds (OSError where
    /proc cannot say)."""
    total = time.process_time()
    for pid in pids:
        task = Path(f"/proc/{pid}/task")
        for t in task.iterdir():
            total += int((t / "schedstat").read_text().split()[0]) / 1e9
    return total


def _cpu_sampler(cluster, feeds: dict, policy: Policy) -> Callable[[], float]:
    """CPU seconds per request of `cluster` (the coordinator and its local workers), averaged over enough
    requests to last 2 x policy.min_sample_s (at least 3; schedstat counts nanoseconds), after the warm-up."""
    pids = [w.proc.pid for w in cluster.workers.values() if w.proc is not None]
    for _ in range(max(policy.warmup, 5)):
        cluster.infer(feeds)
    t = time.perf_counter()
    cluster.infer(feeds)
    reps = max(3, min(200, math.ceil(2 * policy.min_sample_s / max(time.perf_counter() - t, 1e-7))))

    def sample() -> float:
        c0 = _cpu_seconds(pids)
        for _ in range(reps):
            cluster.infer(feeds)
        return (_cpu_seconds(pids) - c0) / reps

    return sample


def _cpu_figures(policy: Policy, large: int) -> dict[str, Figure] | None:
    """CPU time per request of the exchange builds ("cpu_small": CPU_EXCHANGES exchanges of a 64-byte tensor,
    "cpu_large": as many of a large one; each on two workers, so that their own idle work cancels) and of the
    tiny one ("cpu_request"); None where /proc cannot say (not Linux: the profile then has no CPU figures,
    and says so). Once /proc answered, a failure to read it is an error, not a figure left out."""
    try:
        _cpu_seconds([os.getpid()])
    except (OSError, ValueError, IndexError):
        return None
    folder = Path(tempfile.mkdtemp(prefix="edgec-profile-cpu-"))
    out: dict[str, Figure] = {}
    try:
        feeds = {"x": np.ones((1, large // 4), dtype=np.float32)}
        for name, ways in (("cpu_small", "s"), ("cpu_large", "l")):
            sub = folder / name
            sub.mkdir()
            out.update(_over_clusters(load_manifest(_exchange_build(sub, large, ways, CPU_EXCHANGES)),
                                      {name: lambda c: _cpu_sampler(c, feeds, policy)}, policy))
        sub = folder / "cpu_request"
        sub.mkdir()
        tiny = {"x": np.ones((1, 64), dtype=np.float32)}
        out.update(_over_clusters(load_manifest(_tiny_build(sub)),
                                  {"cpu_request": lambda c: _cpu_sampler(c, tiny, policy)}, policy))
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


STALL_TRIES = 20  # a request that met a stall of the quota is taken again, up to this many times (then kept)


STALLED_KEPT: list[int] = []  # one entry per request kept although every try met a stall (said in the notes)


def _unstalled(take: Callable[[], object], throttled: Callable[[], int] | None) -> Callable[[], object]:
    """`take` (one request) taken again until the quota's throttled time did not move over it, at most
    STALL_TRIES times, the last one kept then and counted in STALLED_KEPT; `take` itself where no throttled time
    can be read."""
    if throttled is None:
        return take

    def once():
        for _ in range(STALL_TRIES):
            before = throttled()
            out = take()
            if throttled() == before:
                return out
        STALLED_KEPT.append(1)
        return out

    return once


def _message_figures(policy: Policy, large: int, throttled: Callable[[], int] | None = None) -> dict[str, Figure]:
    """{"message_small": a 64-byte hand-off, "message_large": a `large`-byte one}, each in requests of its own
    exchange build whose input is as large as the tensor exchanged (module docstring: why not one request)."""
    folder = Path(tempfile.mkdtemp(prefix="edgec-profile-message-"))
    out: dict[str, Figure] = {}
    try:
        for name, size, way in (("message_small", SMALL_BYTES, "s"), ("message_large", large, "l")):
            sub = folder / name
            sub.mkdir()
            manifest = load_manifest(_exchange_build(sub, size, way))
            feeds = {"x": np.ones((1, size // 4), dtype=np.float32)}
            out.update(_over_clusters(manifest, {name: lambda c: _request_sampler(c, feeds, way, policy, throttled)},
                                      policy, timings=True))
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _request_sampler(cluster, feeds: dict, name: str, policy: Policy,
                     throttled: Callable[[], int] | None = None) -> Callable[[], float]:
    """Seconds of one hand-off of tensor `name` (the mean of a -> b and b -> a in one request), the median over
    enough requests to last policy.min_sample_s of wall time, after the warm-up; with `throttled`, of requests
    that met no stall of the quota (`_unstalled`)."""
    ways = ((_A, _B, name), (_B, _A, name))  # the report's transfer keys: (sender, receiver, received name)

    @partial(_unstalled, throttled=throttled)
    def hand_off() -> tuple[float, float]:
        """(the request's hand-off, its wall time), in seconds."""
        t = time.perf_counter()
        cluster.infer(feeds)
        wall = time.perf_counter() - t
        return sum(cluster.samples.transfer_ms[way][-1] for way in ways) / 2 / 1e3, wall

    for _ in range(max(policy.warmup, 5)):
        hand_off()
    reps = max(1, min(100, math.ceil(policy.min_sample_s / max(hand_off()[1], 1e-7))))
    return lambda: statistics.median(hand_off()[0] for _ in range(reps))


def _run_figures(policy: Policy) -> dict[str, Figure]:
    """{"run_in_plan": RUN_FRAGMENT's run in `_run_build` as its worker timed it, "run_alone": `_run_alone`}."""
    folder = Path(tempfile.mkdtemp(prefix="edgec-profile-run-"))
    try:
        manifest = load_manifest(_run_build(folder))
        feeds = {"x": np.ones((1, SMALL_BYTES // 4), dtype=np.float32), "e": np.ones(EVICT_SHAPE, dtype=np.float32)}
        in_plan = _over_clusters(manifest, {"run_in_plan": lambda c: _run_sampler(c, feeds, policy)}, policy,
                                 timings=True)["run_in_plan"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"run_in_plan": in_plan, "run_alone": _run_alone(policy)}


def _run_sampler(cluster, feeds: dict, policy: Policy) -> Callable[[], float]:
    """Seconds of one run of RUN_FRAGMENT (one per request, as its worker timed it), the median of enough
    requests to last policy.min_sample_s of wall time, after the warm-up."""
    def run() -> tuple[float, float]:
        t = time.perf_counter()
        cluster.infer(feeds)
        wall = time.perf_counter() - t
        return cluster.samples.fragment_ms[RUN_FRAGMENT][-1] / 1e3, wall

    for _ in range(max(policy.warmup, 5)):
        run()
    reps = max(1, min(100, math.ceil(policy.min_sample_s / max(run()[1], 1e-7))))
    return lambda: statistics.median(run()[0] for _ in range(reps))


def _run_alone(policy: Policy) -> Figure:
    """Seconds of one run of `_evict_model` timed as the profile times its figures: in this process, its
    inputs and outputs bound once, run after run (hot)."""
    run = bound_run(session(_evict_model(), 1), {"e": np.ones(EVICT_SHAPE, dtype=np.float32)})

    def timed() -> float:
        t = time.perf_counter()
        run()
        return time.perf_counter() - t

    return _rounds(_sampler(timed, policy, warmup=max(policy.warmup, 5)), policy)


def _tiny_build(folder: Path) -> Path:
    """A one-device, one-fragment build (64-float Relu) in `folder`; returns its manifest.json."""
    steps = {"d": [{"op": "recv", "tensor": "x", "from": "@host"}, {"op": "run", "fragment": "f0"},
                   {"op": "send", "tensor": "y", "to": "@host"}]}
    return _manifest(folder, _relu(folder, 64), ["d"], 64, [], steps)


def _request_figure(policy: Policy, throttled: Callable[[], int] | None = None) -> Figure:
    folder = Path(tempfile.mkdtemp(prefix="edgec-profile-request-"))
    try:
        manifest = load_manifest(_tiny_build(folder))
        feeds = {"x": np.ones((1, 64), dtype=np.float32)}

        def sampler(cluster) -> Callable[[], float]:
            @partial(_unstalled, throttled=throttled)
            def request() -> float:
                _, latency_ms, run_ms = cluster.infer(feeds)
                return max(0.0, latency_ms - sum(run_ms.values())) / 1e3

            return _sampler(request, policy, warmup=max(policy.warmup, 5))

        return _over_clusters(manifest, {"request": sampler}, policy)["request"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
