"""measure_host: check the load, run the micro-benchmarks at each thread count, assemble the profile dict."""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import onnxruntime as ort

from edgec.runtime.errors import InputError
from edgec.runtime.providers import CPU, Provider

from . import host, kernels, tables
from . import shared as shared_mod
from .bench import DRAM_ROUNDS, Bench, threads_label
from .figures import measure_figures
from .drift import DRIFT_LIMIT, check_drift, halves
from .fixed import measure_runtime_costs
from .fixed import source as runtime_source
from .load import LoadProbe, LoadWatch, check_load
from .nodes import measure_layers, measure_layers_on
from .quota import LIMITED, MAX_SAMPLE_S, SAMPLE_PERIODS, SPIN_S, UNKNOWN_PERIOD_SAMPLE_S, CpuQuota, see_quota
from .shared import CoRunnerError, CoRunners
from .timing import DEFAULT, QUICK, Figure, Policy, measure_with, rand, session, sig

__all__ = ["measure_host", "thread_counts"]

logger = logging.getLogger("edgec.runtime.profile")



def thread_counts(threads: int | Iterable[int] | None, cores: int) -> list[int]:
    """The thread counts to measure, ascending and distinct; None: 1 and all cores."""
    if threads is None:
        return sorted({1, cores})
    if isinstance(threads, Iterable) and not isinstance(threads, (str, bytes)):
        items = list(threads)
    else:
        items = [threads]
    if not items or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in items):
        raise InputError(f"threads must be a positive integer or a list of them, got {threads!r}")
    return sorted(set(items))


SHORT = 100  # a warning's first line: the rest is logged at INFO, which `edgec profile --verbose` prints


def warn(text: str) -> None:
    """`text` as a warning line of at most SHORT characters: cut, when longer, after its last clause that
    fits (at "; ", ": ", " (" or ", "), or else a word; the whole text is then logged at INFO after it."""
    if len(text) <= SHORT:
        logger.warning(text)
        return
    room = SHORT - len(MORE)
    cuts = [i for sep in ("; ", ": ", " (", ", ") for i in [text.rfind(sep, 0, room)] if i >= 10]
    head = text[:max(cuts)] if cuts else text[:room].rsplit(" ", 1)[0]
    logger.warning(head + MORE)
    logger.info(text)


MORE = " (more with --verbose)"


def _runtime_rss_mb() -> int:
    """Resident set of python + numpy + onnx + onnxruntime with one small session, in MB rounded up to 10."""
    import numpy as np

    sess = session(kernels.relu_chain(1), 1)
    sess.run(None, {"x": rand(np.random.default_rng(0), 1, 16)})
    rss = host.rss_mb()
    return math.ceil((rss or 100.0) / 10) * 10


def _sources(stamp: str, counts: list[int], quick: bool, policy: Policy, power_given: bool) -> list[str]:
    top = counts[-1]
    return [
        f"edgec profile on {host.host_name()} at {stamp}, onnxruntime {ort.__version__}, intra-op threads "
        f"{', '.join(map(str, counts))}; top-level figures at {top} thread{'s' if top > 1 else ''}, `threads:` per count"
        + (" (quick mode: small benchmarks, noisy)" if quick else ""),
        f"every timing in {policy.rounds} rounds, interleaved with the other timings' (seconds apart), each a fresh "
        "session with inputs and outputs bound to buffers allocated once (kernel time, no per-run output copy), "
        f"warmed up for at least {policy.warmup_s:g} s, then repeated until (p90 - p10) / median of its last "
        f"{policy.window} samples is at most {policy.max_spread:g}, or {policy.round_seconds:g} s passed (then "
        "its calmest window, unstable); the figure is the fastest stable round's median (other load only adds "
        "time), and `measurement:` spread is the larger of that window's spread and the distance to the nearest "
        "other round (stable: at most max_spread)",
        "gflops: conv = 3x3 Conv 128->128 ch on 56x56, depthwise_conv = 3x3 depthwise Conv 192 ch on 28x28 in a "
        f"chain (the time of {kernels.DEPTHWISE_CHAIN} less one's, per conv: without the layout conversions at its "
        "ends), "
        "gemm = MatMul 512x1024x1024, other = slower of ConvTranspose 2x2/s2 and batch-1 LSTM, conv_int8 and "
        "gemm_int8 = the conv and gemm ones as QLinearConv and QLinearMatMul (uint8 x int8); FLOPs = 2 x MACs"
        + (" (quick mode uses smaller shapes)" if quick else ""),
        "memory_gbps: elementwise Add of two 8M-float tensors, (2 inputs + 1 output) bytes / time"
        if not quick else
        "memory_gbps: elementwise Add of two 2M-float tensors (may partly fit in cache), (2 inputs + 1 output) bytes / time",
        "weight_gbps: a batch-1 MatMul 1x4096 by 4096x4096 (64 MB of weights, more than any cache holds), "
        "weight bytes / time" + (" (quick mode: 2048x2048, 16 MB, may partly fit in cache)" if quick else ""),
        f"gemm_weight_gbps: a chain of {kernels.GEMM_COLD_LAYERS} MatMuls {kernels.GEMM_COLD_ROWS}x1024 by 1024x1024, "
        "each its own weights (48 MB), less that many runs of one of them with its weights hot: weight bytes / "
        "the extra time (not written when there was none)",
        "shared_weight_gbps: weight_gbps's MatMul at 1 thread while every other core runs it too, each in a process "
        f"of its own with its own copy of the weights (paused between rounds), in {DRAM_ROUNDS} rounds per pass "
        "spread through the 1-thread timings' as weight_gbps' are: weight_gbps times the ratio of each such round's "
        "time to the weight_gbps round beside it, the median of the pairs that contended for memory (more sets at "
        "the profile's end where too few did; not written on one core)",
        *_relayout_sources(),
        "op_overhead_us: the larger of (a) the dispatch floor, (200-node tiny Relu chain - 1 node) / 199, and (b) small "
        "layers, (chain of 50 x [3x3 Conv 16 ch on 7x7 -> Relu] - one pair - their Conv FLOPs at the measured conv "
        "rate) / 98 nodes, default optimisation (Conv+Relu fuse as in the runtime)",
        "op_ms_per_melem: ms per million output elements of one node beyond op_overhead_us, at the shapes of the zoo's "
        "models (LRN size 5 on 64x56x56, Softmax 12x128x128, LayerNormalization 128x768, `LayerNormalization:skip` "
        "a residual Add and a LayerNormalization on 128x768 (onnxruntime fuses them), Erf 128x3072, Resize 2x "
        "of 64x56x56: `Resize` nearest, `Resize:linear` linear, Clip to [0, 6] (ReLU6) on 144x56x56)"
        + (" (quick mode halves every dimension)" if quick else ""),
        "efficiency: conv_positions: [output positions, fraction of the largest point's rate] of a 3x3 Conv "
        f"{tables.conv_positions_channels(quick)} ch computing "
        f"{'/'.join(f'{h}x{w}' for h, w in (tables.CONV_POSITION_TILES_QUICK if quick else tables.CONV_POSITION_TILES))}"
        " output rows x columns (halo rows in the input); depthwise_conv, gemm: [output elements, fraction of the "
        "largest point's rate / gflops.gemm] of a depthwise 3x3 Conv 144 ch, 56 wide, at "
        f"{'/'.join(map(str, tables.CONV_HEIGHTS))} output rows (halo rows in the input), and a MatMul "
        f"{'/'.join(map(str, kernels.GEMM_ROWS))} x 1024 x 1024; fraction = FLOPs at that rate / (time - "
        f"op_overhead_us), at most {tables.MAX_EFFICIENCY:g}"
        + (" (quick mode: depthwise 72 ch, 28 wide; MatMul x 512 x 512)" if quick else ""),
        "memory_mb: MemTotal; usable_memory_fraction: MemAvailable/MemTotal at profiling time, rounded down to 0.05; "
        "runtime_overhead_mb: resident set of the profiling process (python+numpy+onnx+onnxruntime, one small session)",
        "measurement.memory_drift: per thread count, memory_gbps' rate over the first and the second half of its "
        f"rounds (each at the fastest quarter of its stable rounds); a move beyond {DRIFT_LIMIT:.0%} is a warning "
        "(--strict: an error): the machine's memory rate moved under the DRAM figures",
        "power_w: not measurable by edgec profile; " + ("given by the caller" if power_given else "null = unknown"),
        "cpu_quota: the cgroup's CFS quota (v1 cpu.cfs_quota_us / cpu.cfs_period_us, v2 cpu.max; the tightest of the "
        "process's cgroup and its ancestors) in cores, and the share of a core a thread spinning for "
        f"{SPIN_S[quick]:g} s got; at a thread count above the quota (or, where no cgroup file can be read, with "
        f"a measured share below {LIMITED:g}) every sample lasts sample_ms ({SAMPLE_PERIODS} periods, at most "
        f"{MAX_SAMPLE_S * 1e3:g} ms; {UNKNOWN_PERIOD_SAMPLE_S * 1e3:g} ms when the period is unknown), its runs "
        "counted over the stretch, so that the figures follow the share",
    ]


def _relayout_sources() -> list[str]:
    return ["layout_conversions: whether onnxruntime optimises a 1x1 Conv -> Relu into a graph with ReorderInput/"
            "ReorderOutput nodes (its blocked layout; the cost model prices each conversion as a read and a write "
            "of every byte at memory_gbps)"]


def _layers_per_thread(model_path: str, counts: list[int], quick: bool, per_thread: dict[int, dict],
                       sources: list[str], say: Callable[[str], None]) -> dict[str, dict[str, float]]:
    """The model's per-node table at each thread count, into its `threads:` entry; returns the largest
    count's, for the top level (like every other figure)."""
    runs = 3 if quick else 5
    for n in counts:
        say(f"  per-node times of {model_path} at {n} thread{'s' if n > 1 else ''}")
        digest, table = measure_layers(model_path, threads=n, runs=runs, progress=say)
        per_thread[n]["layers"] = {digest: table}
    sources.append(f"layers: onnxruntime profiler kernel times (median of {runs} runs, ORT_ENABLE_ALL), keyed by "
                   f"ONNX node name, of {Path(model_path).name} (sha256 {digest[:12]}...), per thread count")
    return {digest: table}


def measure_host(
    model_path: str | None = None,
    threads: int | Iterable[int] | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    quick: bool = False,
    strict: bool = False,
    power_idle_w: float | None = None,
    power_busy_w: float | None = None,
    name: str | None = None,
    policy: Policy | None = None,
    probe: LoadProbe | None = None,
    runtime_costs: bool = True,
    shared_weights: bool = True,
    quota: CpuQuota | None = None,
    providers: list[str] | None = None,
) -> dict[str, Any]:
    """Measure this machine and return a profile dict in the profile file format.

    threads: the intra-op thread counts to measure (an int or a list); None: 1 and all cores.  The
      top-level figures are those of the largest count; `threads:` holds every count's.
    quick: smaller benchmarks and a shorter time per timing (for tests; noisier figures).
    strict: refuse (InputError) when the machine is busy or a timing's spread stays above the policy's
      max_spread; otherwise those are warnings (logged, and listed under measurement.warnings).
    power_idle_w / power_busy_w: watts from a meter, if the caller has them; None is written as null.
    policy / probe: the timing policy and the load probe (tests inject scripted ones).
    runtime_costs: also measure the runtime's own costs (fixed.py) into `runtime:`; without, the profile
      has none and the cost model prices them 0.
    shared_weights: also measure shared_weight_gbps (shared.py) where 1 thread is among the counts and the
      machine has 2 cores or more; without, tiles of devices sharing a host pay their weights at weight_gbps.
    quota: the CPU share this process gets (quota.py); None: read and measured here.  Where it is below a thread
      count, that count's samples span many CFS periods, so that its figures follow the share.
    """
    if providers and providers != [CPU]:
        return _with_providers(providers, model_path, locals())
    say = progress or (lambda s: None)
    cpu = host.cpuinfo()
    counts = thread_counts(threads, host.all_cores(cpu))
    policy = policy or (QUICK if quick else DEFAULT)
    probe = probe or LoadProbe()
    mem_total, mem_avail = host.meminfo_mb()
    started = time.perf_counter()
    warnings: list[str] = []

    say(f"profiling {host.host_name()}: onnxruntime {ort.__version__}, threads {', '.join(map(str, counts))}"
        f"{' (quick)' if quick else ''}")
    load = LoadWatch(probe, quick)
    check_load(load.busy_before(), load.said_before(), "is", strict, warnings)
    say(f"  {load.said_before()}")
    quota = quota or see_quota(quick)
    say(f"  {quota.said()}")
    runtime_mb = _runtime_rss_mb()
    per_thread: dict[int, dict] = {}
    entries: dict[int, dict] = {}
    unstable: list[str] = []  # the timings whose spread stayed large, named for the one-line warning
    details: list[str] = []  # the same, each with the load it saw, for measurement.warnings
    shared = None
    drifts: dict[int, dict] = {}  # measurement.memory_drift, per thread count (drift.py)
    if shared_weights and quota.cores is not None and quota.cores < host.all_cores(cpu):
        # its co-runners would run inside the same quota: they would time the quota's share, not the memory path
        shared_weights = False
        details.append(f"shared_weight_gbps not measured: the CPU quota ({quota.cores:g} cores) is below this machine's "
                       f"{host.all_cores(cpu)} cores, and co-runners would share the quota, not the memory path")
    # shared_weight_gbps' co-runners, paused but alive until the end: CoRunners.later may time more pairs there
    with contextlib.ExitStack() as stack:
        co, gbps = None, None
        for n in counts:
            b = Bench(n, quick, _within(policy, quota, n, say), probe, strict, say)
            sharing = n == 1 and shared_weights and host.all_cores(cpu) > 1
            co_n = stack.enter_context(_co_runners(host.all_cores(cpu) - 1 if sharing else 0, quick, strict, say,
                                                   details, unstable))
            per_thread[n] = measure_figures(b, {shared_mod.NAME: co_n.add_to} if co_n else None)
            drift = halves(b.figures["memory_gbps"], kernels.memory_bytes(quick))
            if drift is not None:
                drifts[n] = drift.entry()
                say(f"    memory rate {drift.first_gbps:.3g} GB/s in the first half of the pass, "
                    f"{drift.second_gbps:.3g} in the second ({drift.moved:+.1%})")
                check_drift(drift, n, strict, warnings)
            entries[n] = b.entries
            details.extend(b.unstable)
            unstable.extend(b.unstable_names)
            if co_n:
                co, gbps = co_n, per_thread[n].pop(shared_mod.NAME)
        conversions = kernels.blocked_layout(counts[-1])
        say(f"  onnxruntime runs convolutions in a blocked layout: {'yes' if conversions else 'no'} "
            "(layout_conversions)")
        runtime, runtime_entries = (_runtime_costs(policy, quick, strict, say, details, unstable, quota.share())
                                    if runtime_costs else ({}, {}))
        if co:
            shared = _shared_weights(gbps, co, strict, say, details, unstable)
    load.finish()  # the co-runners reaped: their CPU is this process's children's, not another's
    check_load(load.busy_during(), load.said_during(), "was", strict, warnings)
    say(f"  {load.said_during()}")

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    sources = _sources(stamp, counts, quick, policy, power_idle_w is not None or power_busy_w is not None)
    layers = {} if model_path is None else _layers_per_thread(model_path, counts, quick, per_thread, sources, say)
    for w in warnings:
        warn(w)
    if unstable:  # one line for all of them; measurement.warnings has each with the load it saw
        warn(f"spread stayed above {policy.max_spread:.0%} for {len(unstable)} timing{'s' if len(unstable) > 1 else ''}; "
             f"those figures may be off: {', '.join(unstable)} (measurement.warnings in the profile says more)")
    say(f"  done in {time.perf_counter() - started:.1f} s")

    frac = 0.75
    if mem_avail is not None and mem_total > 0:
        frac = max(0.05, math.floor(mem_avail / mem_total * 20) / 20)
    top = per_thread[counts[-1]]
    return {
        "name": name or host.host_name(),
        "description": host.describe(cpu, mem_total, counts)
        + ("" if quota.cores is None else f"; CPU quota {quota.cores:.3g} cores"),
        "memory_mb": int(round(mem_total)),
        "usable_memory_fraction": frac,
        "runtime_overhead_mb": runtime_mb,
        "op_overhead_us": top["op_overhead_us"],
        "gflops": dict(top["gflops"]),
        "memory_gbps": top["memory_gbps"],
        "weight_gbps": top["weight_gbps"],
        **({"gemm_weight_gbps": top["gemm_weight_gbps"]} if "gemm_weight_gbps" in top else {}),
        **({"shared_weight_gbps": shared} if shared is not None else {}),
        "layout_conversions": conversions,
        "op_ms_per_melem": dict(top["op_ms_per_melem"]),
        "efficiency": {k: [list(p) for p in v] for k, v in top["efficiency"].items()},
        "power_w": {"idle": power_idle_w, "busy": power_busy_w},
        "threads": per_thread,
        "measurement": {
            "max_spread": policy.max_spread,
            "window": policy.window,
            "max_seconds": policy.max_seconds,
            "load": load.section(),
            **({"memory_drift": drifts} if drifts else {}),
            "threads": entries,
            "warnings": warnings + details,
            **({"runtime": runtime_entries} if runtime_entries else {}),
        },
        "sources": sources + ([fixed_source(quick)] if runtime else []),
        "layers": layers,
        **({"runtime": runtime} if runtime else {}),
        "cpu_quota": quota.entry(counts),
    }


def _with_providers(providers: list[str], model_path: str | None, args: dict) -> dict[str, Any]:
    """measure_host with every micro-benchmark session on `providers` (`edgec profile --providers`), the profile
    saying so (`providers:`), and the CPU provider's own figures beside them (`cpu:`, measured with it alone: what
    the compiler prices the nodes an accelerator leaves to the CPU at). With a model, its per-node times on the
    providers (`layers:`; the CPU provider's alone in `cpu:`) and the nodes the CPU provider ran among them
    (`cpu_nodes:`, claims.py). Not measured under the providers: layout_conversions (the CPU provider's blocked
    layout) and shared_weight_gbps (its co-runners are CPU sessions)."""
    available = ort.get_available_providers()
    missing = next((p for p in providers if p not in available), None)
    if missing is not None:
        raise InputError(f"--providers: this onnxruntime does not have {missing} (it has {', '.join(available)})")
    say = args.get("progress") or (lambda s: None)
    args = {k: v for k, v in args.items() if k not in ("providers", "model_path")}
    say("the CPU provider alone first (the profile's `cpu:`), in plain runs as under the others (timing.bound_run)")
    measure_with([CPU], plain=True)
    try:
        cpu = measure_host(**(args | {"runtime_costs": False, "shared_weights": False}), model_path=model_path)
    finally:
        measure_with([CPU])
    say(f"then {', '.join(providers)}")
    measure_with(providers)
    try:
        prof = measure_host(**(args | {"shared_weights": False}))
    finally:
        measure_with([CPU])
    prof["layout_conversions"] = False
    prof["measurement"]["warnings"].extend(
        ["measured with " + ", ".join(providers) + ": layout_conversions (the CPU provider's) and shared_weight_gbps "
         "are not measured"] + [f"cpu: {w}" for w in cpu["measurement"]["warnings"]])
    prof["description"] = prof["description"].replace("CPU EP", ", ".join(providers), 1)
    prof["sources"].append("cpu: the same figures measured with CPUExecutionProvider alone, before the others "
                           "(the compiler prices the nodes the CPU provider runs beside " + ", ".join(providers)
                           + " at them)")
    prof["cpu"] = {k: cpu[k] for k in CPU_FIGURES if k in cpu} | {"threads": cpu["threads"]}
    if model_path is not None:
        _claimed_layers(model_path, [Provider(p) for p in providers], prof, cpu, args.get("quick", False), say)
    return {**prof, "providers": list(providers)}


# The figures of a profile's `cpu:` block: the top level's that onnxruntime's kernels decide.
CPU_FIGURES = ("op_overhead_us", "gflops", "memory_gbps", "weight_gbps", "gemm_weight_gbps", "op_ms_per_melem",
               "efficiency", "layers")


def _claimed_layers(model_path: str, providers: list[Provider], prof: dict, cpu: dict, quick: bool,
                    say: Callable[[str], None]) -> None:
    """The model's per-node times on `providers` at each thread count (`layers:`, top level and `threads:`) and
    the nodes the CPU provider ran (`cpu_nodes:`), into `prof`; `cpu` holds the CPU provider's own tables."""
    runs = 3 if quick else 5
    digest, claimed = "", frozenset()
    for n in sorted(prof["threads"]):
        say(f"  per-node times of {model_path} on {', '.join(p.name for p in providers)} at {threads_label(n)}")
        cpu_table = next(iter(cpu["threads"][n]["layers"].values()))
        digest, table, claimed = measure_layers_on(model_path, threads=n, runs=runs, progress=say,
                                                   providers=providers, cpu_table=cpu_table)
        prof["threads"][n]["layers"] = {digest: table}
    prof["layers"] = {digest: prof["threads"][max(prof["threads"])]["layers"][digest]}
    prof["cpu_nodes"] = {digest: sorted(claimed)}
    say(f"  the CPU provider ran {len(claimed)} of the model's nodes beside {providers[0].name}")
    prof["sources"].append(
        f"layers: onnxruntime profiler kernel times (median of {runs} runs) on {', '.join(p.name for p in providers)} "
        f"at ORT_ENABLE_BASIC (the claims as at the default level, the CPU's nodes under their names), of "
        f"{Path(model_path).name} (sha256 {digest[:12]}...), per thread count: the CPU provider's nodes their own "
        "times, each accelerator subgraph's time shared among the nodes the CPU did not run in proportion to their "
        "times in `cpu:`; cpu_nodes: the nodes whose kernels the CPU provider ran (args.provider of the profiler's "
        "events)")


def _within(policy: Policy, quota: CpuQuota, threads: int, say: Callable[[str], None]) -> Policy:
    """The policy at `threads`: as it is, or where the share is below the thread count, samples of
    quota.sample_s each (runs counted over the stretch) and time enough for a window of them per round."""
    sample_s = quota.sample_s(threads)
    if sample_s is None:
        return policy
    say(f"  {threads_label(threads)} on a share below {threads} core{'s' if threads > 1 else ''}: samples of "
        f"{sample_s * 1e3:.0f} ms, so that each holds the quota's stalls in proportion")
    return replace(policy, min_sample_s=max(policy.min_sample_s, sample_s), long_samples=True,
                   max_seconds=max(policy.max_seconds, policy.rounds * policy.window * sample_s))


def fixed_source(quick: bool) -> str:
    return runtime_source(quick)


def _entry(f: Figure) -> dict:
    """A timing's `measurement:` entry (the load, where known, is the caller's to add)."""
    return {"runs": f.runs, "rounds": len(f.round_medians), "median_ms": sig(f.median_s * 1e3, 4),
            "spread": sig(f.spread, 2) if math.isfinite(f.spread) else 1e9, "stable": f.stable}


def _spread_said(f: Figure, policy: Policy) -> str:
    return f"spread {f.spread:.0%} over {f.runs} runs in {f.seconds:.1f} s stayed above {policy.max_spread:.0%}"


def _unsettled(what: str, short: str, strict: bool, details: list[str], unstable: list[str]) -> None:
    """A timing whose spread stayed large: refused with strict, else a warning (`what` in measurement.warnings,
    `short` in the one-line warning)."""
    if strict:
        raise InputError(f"{what}; profile on a quiet machine, or without --strict to write the profile with a warning")
    details.append(what)
    unstable.append(short)


@contextlib.contextmanager
def _co_runners(count: int, quick: bool, strict: bool, say: Callable[[str], None], details: list[str],
                unstable: list[str]) -> Iterator[CoRunners | None]:
    """shared_weight_gbps' co-runners (shared.py) while the 1-thread micro-benchmarks run; None when there are
    none to start, or when one fails to (refused with strict, else a warning and the figure is left out)."""
    if count < 1:
        yield None
        return
    say(f"  shared_weight_gbps: the weights' MatMul at 1 thread beside {count} other process"
        f"{'es' if count > 1 else ''} running it, its rounds among the 1-thread timings'")
    try:
        co = CoRunners(count, quick)
    except CoRunnerError as e:
        if strict:
            raise InputError(f"shared_weight_gbps: {e}") from None
        details.append(f"shared_weight_gbps not written: {e}")
        unstable.append("shared_weight_gbps (no co-runner)")
        yield None
        return
    with co:
        yield co


def _shared_weights(gbps: float, co: CoRunners, strict: bool, say: Callable[[str], None], details: list[str],
                    unstable: list[str]) -> float | None:
    """The figure, or None when no round had its co-runners on the CPU: nothing ran beside it (refused with
    strict, else a warning in measurement.warnings; the Bench has listed it as unstable)."""
    if co.idle_rounds == co.rounds:
        what = f"shared_weight_gbps not written: a co-runner was off the CPU in every one of its {co.rounds} rounds"
        if strict:
            raise InputError(f"{what}; profile on a quiet machine, or without --strict to write the profile without it")
        details.append(what)  # the one-line warning names it already: the Bench found no stable round
        return None
    later = co.later(say)
    if later is not None:
        gbps = sig(later)
        if not co.enough:
            details.append(f"shared_weight_gbps: {co.contended} of its {co.counted} pairs contended for memory "
                           f"(rate ratio {co.paired_ratio:g} over all); a machine whose cores share a memory path "
                           "may give a lower figure when profiled again")
    say(f"  shared_weight_gbps {gbps:g} GB/s per core with every core streaming")
    return gbps


def _runtime_costs(policy: Policy, quick: bool, strict: bool, say: Callable[[str], None], details: list[str],
                   unstable: list[str], quota_cores: float | None = None) -> tuple[dict, dict]:
    """The runtime's costs and their `measurement.runtime` entries; an unstable timing is refused with
    strict, else a warning like any other figure's."""
    costs, figures, notes = measure_runtime_costs(policy, quick, say, quota_cores)
    details.extend(notes)
    entries = {}
    for name, f in figures.items():
        entries[name] = _entry(f)
        if not f.stable:
            _unsettled(f"runtime {name}: {_spread_said(f, policy)}", f"runtime {name} ({f.spread:.0%})", strict,
                       details, unstable)
    say(f"  runtime: {costs['message_ms']:g} ms per message + {costs['message_ms_per_mb']:g} ms per MB, "
        f"{costs['request_ms']:g} ms per request, {costs['run_ms']:g} ms per tile fragment run"
        + (f"; CPU {costs.get('message_cpu_ms_per_mb', 'not measured')} ms per MB, {costs['request_cpu_ms']:g} ms "
           "per request" if "request_cpu_ms" in costs else ""))
    if "request_cpu_ms" not in costs:
        details.append("runtime CPU figures not measured: this system has no /proc/PID/task/*/schedstat; a "
                       "machine several devices share (cluster hosts:) is priced with the time figures")
    return costs, entries
