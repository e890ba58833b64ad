"""Benchmark (issue 42): planning at fleet scale, time and peak memory against devices and layers.
Run: python tests/bench/bench_scale.py [--quick] [--only SUBSTRING] [--json FILE]

Every case is one `edgec compile` (or `edgec allocate`) as a user runs it, in a subprocess of its own with a
timeout: the planning time is the `--json` summary's `timings.plan`, the wall time the whole command's, and
the peak RSS the child's own (os.wait4's rusage, not the bench's). A case that runs past its timeout, or
whose processes together hold more than RSS_CAP_MB, is killed and reported as such, never waited for.

- devices: ResNet-50 and MobileNetV2, `--strategy pipeline` and `auto`, on 1 to 256 devices drawn from the
  shipped profiles in 4 to 8 kinds, and on up to 64 all-distinct devices (each its own memory_mb);
- layers: chains of 1,000 to 10,000 MatMul layers (built here with onnx.helper) on 4 devices;
- allocate: 20 services on 100 devices of 8 kinds;
- refuse: a 1x3x100000x100000 convolution, refused before any search;
- gaps: the pipeline planner's inexact paths (beyond the state budget; coarsened chains) against the exact
  DP where it finishes, in this process;
- memory: each planner `edgec compile` runs (and the energy and --generate DPs) alone, in a child process at
  the largest fleet it meets here: the peak RSS of the planning call itself (the process's high-water mark
  reset just before it, /proc/self/clear_refs), above the RSS of the model and the cost table it starts from,
  and the memory of those shared analyses (the layer graph, the cost table) as the process grew building
  them. Only these rows: --memory. docs/explanation/fleet-scale.md states each planner's bound.

Each case with a target of the issue is checked against it and reported PASS or FAIL (a timeout is a FAIL).
Clusters are built from the shipped profiles; models come from $EDGEC_MODELS_DIR (or models/build). A
markdown table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("EDGEC_MODELS_DIR", ROOT / "models" / "build"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

NET = {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}
SIX = ["rpi4", "rpi5", "jetson-nano", "jetson-orin-nano", "phone", "laptop"]
EIGHT = SIX + ["jetson-orin-nano-cuda", "edge-server"]
FOUR = SIX[:4]
MB = 1 << 20
RSS_CAP_MB = 4096  # a case past this is killed: the machine is shared


@dataclass
class Case:
    name: str
    kind: str  # compile | allocate
    model: str  # a zoo model, "chain:N" or "huge-conv"
    devices: list[dict]
    strategy: str = "auto"
    timeout_s: float = 120.0
    plan_target_s: float | None = None  # planning time target (the issue's)
    wall_target_s: float | None = None  # whole command, for the refusal
    rss_target_mb: float | None = None
    expect_exit: int = 0
    quick: bool = False
    services: list = field(default_factory=list)


def kinds(n: int, profiles: list[str], prefix: str = "d") -> list[dict]:
    """n devices, profiles taken in turn."""
    return [{"name": f"{prefix}{i}", "profile": profiles[i % len(profiles)]} for i in range(n)]


def distinct(n: int) -> list[dict]:
    """n devices no two of which are alike: the six kinds in turn, each with its own memory_mb."""
    return [{"name": f"u{i}", "profile": SIX[i % len(SIX)], "memory_mb": 3000 + 37 * i} for i in range(n)]


# The child: edgec's CLI, timed from after its imports (a refusal's target excludes interpreter start-up).
AFTER_IMPORT = """import sys, time
import edgec.compiler.api  # the driver and every pass it calls
from edgec.compiler.cli import main
t0 = time.perf_counter()
sys.argv[0] = "edgec"
try:
    main()
finally:
    print(f"bench_scale: ran {time.perf_counter() - t0:.3f} s after import", file=sys.stderr)
"""


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def cases() -> list[Case]:
    out = []
    for n in (1, 8, 16, 32, 64, 128, 256):
        out.append(Case(f"mobilenetv2 pipeline, {n} devices of 6 kinds", "compile", "mobilenetv2",
                        kinds(n, SIX), "pipeline", quick=n in (8, 32)))
    out.append(Case("resnet50 pipeline, 32 identical rpi5", "compile", "resnet50", kinds(32, ["rpi5"]), "pipeline",
                    timeout_s=60, plan_target_s=2.0, quick=True))
    out.append(Case("resnet50 pipeline, 256 devices of 8 kinds", "compile", "resnet50", kinds(256, EIGHT), "pipeline"))
    for n, k, profiles in ((8, 4, FOUR), (16, 6, SIX), (32, 6, SIX)):
        out.append(Case(f"mobilenetv2 auto, {n} devices of {k} kinds", "compile", "mobilenetv2", kinds(n, profiles),
                        timeout_s=120, quick=n == 8))
    out.append(Case("mobilenetv2 auto, 64 devices of 6 kinds", "compile", "mobilenetv2", kinds(64, SIX),
                    timeout_s=60, plan_target_s=15.0, rss_target_mb=1024))
    out.append(Case("resnet50 auto, 64 devices of 6 kinds", "compile", "resnet50", kinds(64, SIX),
                    timeout_s=60, plan_target_s=15.0, rss_target_mb=1024))
    out.append(Case("resnet50 auto, 256 devices of 8 kinds", "compile", "resnet50", kinds(256, EIGHT),
                    timeout_s=180, plan_target_s=60.0, rss_target_mb=2048))
    for n in (8, 16, 64):
        out.append(Case(f"mobilenetv2 pipeline, {n} all-distinct devices", "compile", "mobilenetv2", distinct(n),
                        "pipeline", timeout_s=120, quick=n == 8))
    out.append(Case("mobilenetv2 auto, 64 all-distinct devices", "compile", "mobilenetv2", distinct(64),
                    timeout_s=180, plan_target_s=60.0))
    for n in (1000, 2000, 5000, 10000):
        target = {5000: 5.0, 10000: 15.0}.get(n)
        out.append(Case(f"{n:,}-layer MatMul chain, pipeline, 4 devices", "compile", f"chain:{n}", kinds(4, FOUR),
                        "pipeline", timeout_s=max(60.0, 4 * (target or 0)), plan_target_s=target,
                        rss_target_mb=500 if n == 5000 else None, quick=n == 1000))
    out.append(Case("1,000-layer MatMul chain, auto, 4 devices", "compile", "chain:1000", kinds(4, FOUR),
                    timeout_s=120))
    out.append(Case("20 services on 100 devices of 8 kinds", "allocate", "", kinds(100, EIGHT), "allocate",
                    timeout_s=180, plan_target_s=60.0,
                    services=[("mobilenetv2", 400), ("squeezenet", 300), ("resnet50", 1500), ("inception_v1", 1200)]))
    out.append(Case("1x3x100000x100000 convolution, refused", "compile", "huge-conv", kinds(3, SIX), "auto",
                    timeout_s=30, wall_target_s=1.0, expect_exit=2, quick=True))
    return out


# The child of a memory row: the model loaded and priced, then one planner run in this process (jobs=1: no
# forked lane) with the resident high-water mark reset just before it, so that VmHWM after it is the planning
# call's own peak. argv: model, cluster file, planner, objective, "generate" or "".
PLAN_ALONE = """import json, sys, time
from edgec.compiler.cluster import load_cluster
from edgec.compiler.driver import _price
from edgec.compiler.ingest import load_model
from edgec.compiler.ingest.phases import GenerateOptions, load_phases
from edgec.compiler.plan.planner import EnergyGoal, InfeasibleError, PlanOptions
from edgec.compiler.plan.registry import PLANNERS

def vm():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) / 1024 for k, v in (ln.split(":", 1) for ln in f) if k in ("VmRSS", "VmHWM")}

model, devices, name, objective, generate = sys.argv[1:6]
out = {"start_mb": vm()["VmRSS"]}
phases = load_phases(model, GenerateOptions()) if generate else None  # a decode step, as compile loads it
ing = load_model(model) if phases is None else phases.decode
out["graph_mb"] = vm()["VmRSS"] - out["start_mb"]
before = vm()["VmRSS"]
cost = _price(ing, phases, load_cluster(devices))
out["cost_mb"] = vm()["VmRSS"] - before
options = PlanOptions(jobs=1, energy=EnergyGoal(1000.0) if objective == "energy" else None)
base = vm()["VmRSS"]
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
t0 = time.perf_counter()
try:
    plans = PLANNERS[name](ing.graph, cost, objective, options)
    out["result"] = f"{len(plans)} plan(s)"
except InfeasibleError as exc:
    out["result"] = "infeasible: " + str(exc)[:100]
out["plan_s"] = time.perf_counter() - t0
out["base_mb"], out["plan_peak_mb"] = base, vm()["VmHWM"] - base
print(json.dumps(out))
"""

PIPELINES = ("single", "even", "neurosurgeon", "ring-memory", "equal-layers", "pipeline")
SPATIALS = ("bbgrap", "edgeflow", "deepthings", "spatial", "hybrid")
# (model, cluster name, devices, planners, objective, generate): each planner at the largest fleet bench_scale
# runs it on (auto runs all but ring-memory and equal-layers), and the energy and generative DPs beside them
MEMORY_CASES = [
    ("resnet50", "256 devices of 8 kinds", lambda: kinds(256, EIGHT), PIPELINES + SPATIALS, "latency", False),
    ("mobilenetv2", "64 all-distinct", lambda: distinct(64), PIPELINES + SPATIALS, "latency", False),
    ("chain:10000", "4 devices of 4 kinds", lambda: kinds(4, FOUR), ("pipeline",), "latency", False),
    ("resnet50", "256 devices of 8 kinds", lambda: kinds(256, EIGHT), ("pipeline",), "energy", False),
    ("resnet50", "16 all-distinct", lambda: distinct(16), ("pipeline",), "energy", False),
    ("tinylm", "256 devices of 8 kinds", lambda: kinds(256, EIGHT), ("pipeline",), "latency", True),
]
QUICK_MEMORY = [("mobilenetv2", "8 devices of 4 kinds", lambda: kinds(8, FOUR), ("neurosurgeon", "pipeline"), "latency",
                 False)]


def memory_rows(tmp: Path, quick: bool) -> list[dict]:
    """One row per planner of MEMORY_CASES (QUICK_MEMORY with `quick`), each in a child process (PLAN_ALONE)."""
    rows = []
    for model, cname, devices, names, objective, generate in QUICK_MEMORY if quick else MEMORY_CASES:
        cluster = tmp / "memory.yaml"
        cluster.write_text(yaml.safe_dump({"devices": devices(), "network": NET}))
        for name in names:
            cmd = [sys.executable, "-c", PLAN_ALONE, str(model_path(model, tmp)), str(cluster), name, objective,
                   "generate" if generate else ""]
            code, wall, rss, stdout, stderr = run_child(cmd, 600, RSS_CAP_MB)
            row = {"model": model, "cluster": cname, "planner": name + (" --generate" if generate else ""),
                   "objective": objective, "exit": code, "rss_mb": round(rss)}
            if code == 0:
                got = json.loads(stdout.strip().splitlines()[-1])
                row.update({k: round(v, 2 if k.endswith("_s") else 1) for k, v in got.items() if k.endswith(("_mb", "_s"))},
                           result=got["result"])
            else:
                row["result"] = (stderr.strip().splitlines() or ["(no message)"])[-1][:160]
            rows.append(row)
            print(f"  {row}", file=sys.stderr, flush=True)
    return rows


def memory_table(rows: list[dict]) -> str:
    lines = ["| model | cluster | planner | objective | planning peak MB (above its start) | RSS before planning MB "
             "| graph MB | cost table MB | plan s | process peak RSS MB | result |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        f = lambda k: "-" if r.get(k) is None else r[k]  # noqa: E731
        lines.append(f"| {r['model']} | {r['cluster']} | {r['planner']} | {r['objective']} | {f('plan_peak_mb')} | "
                     f"{f('base_mb')} | {f('graph_mb')} | {f('cost_mb')} | {f('plan_s')} | {r['rss_mb']} | "
                     f"{r['result'].replace('|', '/')} |")
    return "\n".join(lines)


def chain_model(n: int, width: int = 16) -> onnx.ModelProto:
    """n MatMul layers over a [1, width] input, each with its own [width, width] weight."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) / width).astype(np.float32), f"w{i}"))
        out = "y" if i == n - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out], name=f"mm{i}"))
        prev = out
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def huge_conv() -> onnx.ModelProto:
    """The issue's convolution over a 1x3x100000x100000 input (120 GB; a 4x3x3x3 kernel is its only weight)."""
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "huge",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 100_000, 100_000])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 100_000, 100_000])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def model_path(spec: str, tmp: Path) -> Path:
    if spec.startswith("chain:"):
        path = tmp / f"chain{spec[6:]}.onnx"
        if not path.exists():
            onnx.save(chain_model(int(spec[6:])), path)
        return path
    if spec == "huge-conv":
        path = tmp / "huge.onnx"
        if not path.exists():
            onnx.save(huge_conv(), path)
        return path
    return MODELS / f"{spec}.onnx"


def group_rss_mb(pgid: int) -> float:
    """Resident MB of every process in the process group (the child and the search lanes it forks)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            with open(f"/proc/{entry.name}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return total / MB


def run_child(cmd: list[str], timeout_s: float, rss_cap_mb: float) -> tuple[int | None, float, float, str, str]:
    """(exit code, or None when killed, wall s, peak RSS MB, stdout, stderr). The peak is the larger of the
    child's own (os.wait4's rusage) and the process group's sampled every 50 ms; past `timeout_s` or
    `rss_cap_mb` the whole group is killed (the last line of stderr says which)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        code, peak, killed = None, 0.0, ""
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                break
            peak = max(peak, group_rss_mb(proc.pid))
            over = time.perf_counter() - t0 > timeout_s
            if over or peak > rss_cap_mb:
                killed = f"timeout after {timeout_s:g} s" if over else f"killed at {peak:,.0f} MB (cap {rss_cap_mb:,.0f} MB)"
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = code if code is not None else -9  # reaped here: keep Popen from waiting again
        wall = time.perf_counter() - t0
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # lanes left behind
        out.seek(0)
        err.seek(0)
        stderr = err.read().decode(errors="replace") + (f"\n{killed}" if killed else "")
        return code, wall, max(peak, usage.ru_maxrss / 1024), out.read().decode(errors="replace"), stderr


def run_case(case: Case, tmp: Path) -> dict:
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"devices": case.devices, "network": NET}))
    edgec = [sys.executable, "-c", AFTER_IMPORT]
    if case.kind == "allocate":
        services = tmp / "services.yaml"
        entries = [{"name": f"s{i}", "model": str(MODELS / f"{m}.onnx"), "sla_ms": sla}
                   for i, (m, sla) in zip(range(20), (case.services * 20)[:20])]
        services.write_text(yaml.safe_dump({"services": entries}))
        cmd = edgec + ["allocate", str(services), "--devices", str(cluster), "-o", str(tmp / f"out-{slug(case.name)}"), "--json"]
    else:
        cmd = edgec + ["compile", str(model_path(case.model, tmp)), "--devices", str(cluster),
                       "-o", str(tmp / f"out-{slug(case.name)}"), "--strategy", case.strategy, "--json"]
    code, wall, rss, stdout, stderr = run_child(cmd, case.timeout_s, RSS_CAP_MB)
    ran = [ln for ln in stderr.splitlines() if ln.startswith("bench_scale: ran ")]
    stderr = "\n".join(ln for ln in stderr.splitlines() if not ln.startswith("bench_scale: ran "))
    row = {"case": case.name, "devices": len(case.devices), "exit": code, "wall_s": round(wall, 2),
           "run_s": round(float(ran[-1].split()[2]), 2) if ran else None,
           "rss_mb": round(rss), "plan_s": None, "strategy": None, "latency_ms": None, "exact": None, "gap": None,
           "note": ""}
    if code is None:
        row["note"] = stderr.strip().splitlines()[-1]
    elif code != case.expect_exit:
        row["note"] = (stderr.strip().splitlines() or ["(no message)"])[-1][:160]
    elif code == 0:
        summary = json.loads(stdout)
        row["plan_s"] = round(summary.get("timings", {}).get("plan", wall), 2)
        row["strategy"] = summary.get("strategy")
        row["latency_ms"] = summary.get("predicted_latency_ms")
        pipe = [p for p in summary.get("planning", []) if p.get("strategy") == "pipeline"]
        if pipe and "exact" in pipe[0].get("detail", {}):
            row["exact"] = pipe[0]["detail"]["exact"]
            row["gap"] = pipe[0]["detail"].get("optimality_gap")
        row["note"] = spatial_note(summary)
    else:
        row["note"] = (stderr.strip().splitlines() or [""])[-1][:160]
    row["verdict"] = verdict(case, row)
    return row


def spatial_note(summary: dict) -> str:
    """What the spatial and hybrid searches left out, from their --json detail (spatial.py `_report`)."""
    found = [p["detail"] for p in summary.get("planning", []) if p.get("strategy") == "spatial" and
             p.get("detail", {}).get("truncated")]
    if not found:
        return ""
    d, parts = found[0], []
    if "groups" in d:
        parts.append(f"spatial groups: {d['groups']}")
    if "truncated_searches" in d:
        parts.append(f"{d['truncated_searches']} spatial searches cut by the node budget (none left is under "
                     f"{d['unsearched_bound_ms']:.4g} ms)")
    return "; ".join(parts)


def verdict(case: Case, row: dict) -> str:
    """PASS / FAIL against the case's targets, '-' when it has none."""
    if not (case.plan_target_s or case.wall_target_s or case.rss_target_mb):
        return "-" if row["exit"] == case.expect_exit else "FAIL"
    if row["exit"] != case.expect_exit:
        return "FAIL"
    ok = True
    if case.plan_target_s is not None:
        ok &= row["plan_s"] is not None and row["plan_s"] <= case.plan_target_s
    if case.wall_target_s is not None:
        ok &= row["run_s"] is not None and row["run_s"] <= case.wall_target_s
    if case.rss_target_mb is not None:
        ok &= row["rss_mb"] <= case.rss_target_mb
    return "PASS" if ok else "FAIL"


def target_text(case: Case) -> str:
    parts = []
    if case.plan_target_s is not None:
        parts.append(f"plan <= {case.plan_target_s:g} s")
    if case.wall_target_s is not None:
        parts.append(f"after import <= {case.wall_target_s:g} s")
    if case.rss_target_mb is not None:
        parts.append(f"RSS <= {case.rss_target_mb:g} MB")
    return ", ".join(parts) or "-"


def dp_text(r: dict) -> str:
    """The pipeline planner's exactness: exact, or its optimality gap (pipeline_dp.py: Size)."""
    if r["exact"] is None:
        return "-"
    return "exact" if r["exact"] else f"gap {100 * r['gap']:.1f}%"


def table(rows: list[dict], by_name: dict[str, Case]) -> str:
    lines = ["| case | devices | strategy | predicted ms | pipeline DP | plan s | after import s | wall s | peak RSS MB "
             "| target | verdict | note |", "|---|---:|---|---:|---|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        c = by_name[r["case"]]
        lines.append(f"| {r['case']} | {r['devices']} | {r['strategy'] or c.strategy} | "
                     f"{'-' if r['latency_ms'] is None else round(r['latency_ms'], 2)} | {dp_text(r)} | "
                     f"{'-' if r['plan_s'] is None else r['plan_s']} | {'-' if r['run_s'] is None else r['run_s']} | "
                     f"{r['wall_s']} | {r['rss_mb']} | "
                     f"{target_text(c)} | {r['verdict']} | {r['note'].replace('|', '/') or '-'} |")
    return "\n".join(lines)


GAP_CASES = [("mobilenetv2", "8 all-distinct", lambda: distinct(8)), ("resnet50", "8 all-distinct", lambda: distinct(8)),
             ("mobilenetv2", "12 all-distinct", lambda: distinct(12)),
             ("resnet50", "16 devices of 6 kinds", lambda: kinds(16, SIX)),
             ("chain:1000", "4 devices of 4 kinds", lambda: kinds(4, FOUR))]


def gap_rows(tmp: Path, quick: bool) -> list[dict]:
    """The pipeline planner's inexact paths against the exact DP where the exact DP finishes, in this process:
    beyond the state budget (forced by a table budget of 1 byte: the relaxation, then the exact DP on the
    devices its own 64 MB budget allows), and the coarsened chain (forced on the 1,000-block chain). Objective: latency."""
    from edgec.compiler.cluster import load_cluster
    from edgec.compiler.cost import build_cost_table
    from edgec.compiler.ingest import load_model
    from edgec.compiler.plan import pipeline_coarse, pipeline_space
    from edgec.compiler.plan.pipeline_dp import solve_pipeline
    from edgec.compiler.plan.pipeline_problem import pipeline_problem

    rows = []
    for model, cname, devices in GAP_CASES[:2] if quick else GAP_CASES:
        cluster = tmp / "gap.yaml"
        cluster.write_text(yaml.safe_dump({"devices": devices(), "network": NET}))
        ing = load_model(model_path(model, tmp))
        problem = pipeline_problem(ing.graph, build_cost_table(ing.graph, load_cluster(cluster), ing.sha256, model=ing.model))
        chain = model.startswith("chain:")
        for objective in ("latency", "throughput"):
            exact = solve_pipeline(problem, objective, top_k=1, copies=False)[0].key(objective)[0]
            report: dict = {}
            if chain:
                got = pipeline_coarse.solve_chain(problem, objective, 1, report=report)[0].key(objective)[0]
            else:
                saved = pipeline_space.TABLE_BUDGET
                pipeline_space.TABLE_BUDGET = 1
                try:
                    got = solve_pipeline(problem, objective, top_k=1, copies=False, report=report)[0].key(objective)[0]
                finally:
                    pipeline_space.TABLE_BUDGET = saved
            rows.append({"model": model, "cluster": cname, "objective": objective,
                         "path": "coarse + refine" if chain else "beyond the state budget", "exact_value": exact,
                         "value": got, "worse_pct": 100 * (got / exact - 1), "reported_exact": report.get("exact"),
                         "reported_gap_pct": None if report.get("exact") else 100 * report["optimality_gap"]})
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def gap_table(rows: list[dict]) -> str:
    lines = ["| model | cluster | objective | inexact path | exact DP | this path | worse than exact | reported |",
             "|---|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        said = "exact" if r["reported_exact"] else f"gap <= {r['reported_gap_pct']:.1f}%"
        lines.append(f"| {r['model']} | {r['cluster']} | {r['objective']} | {r['path']} | {r['exact_value']:.3f} | "
                     f"{r['value']:.3f} | {r['worse_pct']:.2f}% | {said} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few small cases only")
    ap.add_argument("--only", default="", help="cases whose name contains this")
    ap.add_argument("--json", type=Path, default=None, help="write every case as JSON here")
    ap.add_argument("--memory", action="store_true", help="the planners' memory rows only (with --quick: a few)")
    args = ap.parse_args()
    chosen = [c for c in cases() if (c.quick or not args.quick) and args.only in c.name and not args.memory]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as d:
        tmp = Path(d)
        for case in chosen:
            print(f"{case.name} ...", file=sys.stderr, flush=True)
            rows.append(run_case(case, tmp))
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
        gaps = gap_rows(tmp, args.quick) if not (args.only or args.memory) else []
        memory = memory_rows(tmp, args.quick) if not args.only else []
    if rows:
        print(table(rows, {c.name: c for c in chosen}))
    if memory:
        print("\n" + memory_table(memory))
    if gaps:
        print("\n" + gap_table(gaps))
        worst = max(r["worse_pct"] for r in gaps)
        print(f"\ninexact paths against the exact DP: worst {worst:.2f}% (target: within 5%): "
              f"{'PASS' if worst <= 5.0 else 'FAIL'}")
    checked = [r for r in rows if r["verdict"] != "-"]
    print(f"\ntargets met: {sum(r['verdict'] == 'PASS' for r in checked)} of {len(checked)}; "
          f"timeouts: {sum(r['exit'] is None for r in rows)} of {len(rows)} cases")
    if args.json:
        args.json.write_text(json.dumps({"cases": rows, "gaps": gaps, "memory": memory}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
