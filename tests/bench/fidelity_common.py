"""bench_fidelity's plumbing, shared by its parts: running edgec, the load average, the host's 1-thread profile,
the clusters of local devices, compiling and running a build, and checking its outputs. What the
bench checks and why is bench_fidelity.py's docstring.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EDGEC = [sys.executable, "-m", "edgec.compiler"]
TOP_LEVEL_ONLY = ("threads", "op_ms_per_melem", "efficiency")  # what the cost model did not read before
NETWORK = {"bandwidth_mbps": 10000, "latency_ms": 0, "medium": "switched"}  # loopback: see fidelity_part_two
WARMUP = 5  # untimed requests before every measurement (--warmup: bench_fidelity.main sets it)
VERIFY_REQUESTS = 2


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def edgec(*args: str) -> str:
    """Run an edgec command; its stdout (stderr passes through, so progress shows)."""
    done = subprocess.run([*EDGEC, *map(str, args)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"edgec {' '.join(map(str, args))}: exit {done.returncode}")
    return done.stdout


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def profile_host(out: Path) -> dict:
    """`edgec profile --threads 1 -o out`; the load average around it and how long it took."""
    before, t0 = loadavg(), time.perf_counter()
    edgec("profile", "--threads", "1", "-o", out)
    return {"before": before, "after": loadavg(), "seconds": round(time.perf_counter() - t0, 1)}


def profile_load(doc: dict) -> dict:
    """The profile's own account of the load and of its timings' spread (compiler/profile: measurement)."""
    m = doc.get("measurement") or {}
    load = m.get("load") or {}
    spreads = [t["spread"] for per in (m.get("threads") or {}).values() for t in per.values()]
    unstable = [name for per in (m.get("threads") or {}).values() for name, t in per.items() if not t["stable"]]
    shared = ((m.get("threads") or {}).get(1) or {}).get("shared_weight_gbps") or {}
    return {"verdict": load.get("verdict"), "other_cpus_before": (load.get("before") or {}).get("other_cpus"),
            "other_cpus_during": (load.get("during") or {}).get("other_cpus"), "max_spread": max(spreads, default=None),
            "median_spread": round(statistics.median(spreads), 4) if spreads else None, "unstable": unstable,
            "warnings": m.get("warnings") or [],
            # memory_gbps' rate in each half of each thread count's pass (profile/drift.py)
            "memory_drift": m.get("memory_drift"),
            # shared_weight_gbps' pairs: the ratio the figure is at, the pairs counted and those that contended, the
            # later sets' pairs where too few did (profile/shared.py)
            "shared_pairs": {k: shared[k] for k in ("paired_ratio", "pairs", "contended_pairs", "later_pairs")
                             if k in shared}}


def top_level_only(doc: dict, folder: Path) -> Path:
    """The profile as the cost model read it before: top-level figures, no thread counts, op table or curves."""
    old = {k: v for k, v in doc.items() if k not in TOP_LEVEL_ONLY}
    old["name"] = f"{doc['name']}-top"
    path = folder / "host-top.yaml"
    path.write_text(yaml.safe_dump(old, sort_keys=False))
    return path


def one_thread_figures(doc: dict, path: Path) -> dict:
    figures = (doc.get("threads") or {}).get(1)
    if figures is None:
        raise SystemExit(f"{path}: no figures for 1 thread (make it with `edgec profile --threads 1`)")
    return figures


def cluster(folder: Path, name: str, profile: Path, devices: int = 1) -> Path:
    """Devices of `profile` at 1 thread, each a local worker of `edgec run` on this machine: they share its
    cores with the coordinator (`hosts:`)."""
    doc: dict = {"devices": [{"name": f"host{i}" if devices > 1 else "host", "profile": str(profile), "threads": 1,
                              "host": "this"} for i in range(devices)]}
    if devices > 1:
        doc["network"] = dict(NETWORK)
    doc["hosts"] = {"this": {"cores": os.cpu_count() or 1, "coordinator": True}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def compile_json(model: Path, devices: Path, outdir: Path, *flags: str) -> dict:
    return json.loads(edgec("compile", model, "--devices", devices, "-o", outdir, *flags, "--json"))


def run_json(outdir: Path, repeat: int, *flags: str) -> dict:
    return json.loads(edgec("run", outdir / "manifest.json", "--threads", "1", "--warmup", WARMUP, "--repeat", repeat,
                            "--random-inputs", "--json", *flags))


def verify_build(outdir: Path) -> dict:
    """Whether the build reproduces its source model's outputs: `edgec run --random-inputs --verify` over
    VERIFY_REQUESTS requests, run apart from the timed runs so that checking costs none of their time.  A
    failed check stops the benchmark (edgec exits 1): a plan that computes something else has no speed to
    report."""
    doc = json.loads(edgec("run", outdir / "manifest.json", "--threads", "1", "--warmup", "0", "--repeat",
                           VERIFY_REQUESTS, "--random-inputs", "--verify", "--json"))["verify"]
    if not doc or not doc.get("passed"):
        raise SystemExit(f"{outdir}: outputs did not verify: {doc}")
    return {"build": str(outdir), "passed": True, "max_abs_diff": doc["max_abs_diff"], "requests": VERIFY_REQUESTS}


def model_path(name: str) -> Path:
    model = REPO / "models" / "build" / f"{name}.onnx"
    if not model.is_file():
        raise SystemExit(f"{model}: not built (make -C models)")
    return model


def verified_line(checks) -> str:
    """Every build checked against its source model (`verify_build`); a failure has already stopped the run."""
    checks = list({c["build"]: c for c in checks}.values())  # a build shared by several rows counts once
    worst = max(c["max_abs_diff"] for c in checks)
    n = len(checks)
    return (f"Outputs: {'the build reproduces' if n == 1 else f'all {n} builds reproduce'} the source model (`edgec run --verify`, "
            f"{VERIFY_REQUESTS} random requests each, after the timed runs); worst max|diff| {worst:.3g}.")


def metric_unit(metric: str) -> str:
    """The unit of a metric's figures."""
    return "ms" if metric == "latency" else "/s"
