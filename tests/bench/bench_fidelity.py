"""Prediction fidelity on this host (issue 11, item 4, first part): predicted against measured latency.

    python tests/bench/bench_fidelity.py [--profile HOST.yaml] [--repeat 10] [--models resnet50,...] [--folder DIR]

1. Profiles this host at 1 thread (`edgec profile --threads 1`), unless --profile gives a profile made so,
   and reports the machine's load around it (load average before and after, and the profile's own load
   verdict, its worst timing spread and its warnings).
2. For each model (ResNet-50, VGG-16, Inception v1, MobileNetV2, the transformer), on a one-device cluster
   whose device runs 1 thread (`threads: 1`):
   - predicted latency (`edgec compile --json`) with two profiles:
       before: the roofline with the profile's top-level figures only (its `threads:`, op table and
               efficiency curves removed: what the cost model read before it used them);
       after:  the profile as measured, for the device's thread count;
   - measured latency (`edgec run --threads 1 --repeat N --json`): the median over the N requests;
   - the error of each prediction, (predicted - measured) / measured.
3. Prints a Markdown table, then the median and worst absolute error of each prediction.

The issue's target (median error at most 10%, worst at most 20%) is for a quiet machine: on a busy one the
measured times, and the profile itself, move with the other load; the load is printed so the table can be
read against it. Not collected by pytest: the name does not start with test_.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
MODELS = ("resnet50", "vgg16", "inception_v1", "mobilenetv2", "transformer")
EDGEC = [sys.executable, "-m", "edgec.compiler"]
TOP_LEVEL_ONLY = ("threads", "op_ms_per_melem", "efficiency")  # what the cost model did not read before


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


def profile_host(folder: Path) -> tuple[Path, dict]:
    """`edgec profile --threads 1` into folder/host-1t.yaml, with the load average around it."""
    out = folder / "host-1t.yaml"
    before, t0 = loadavg(), time.perf_counter()
    edgec("profile", "--threads", "1", "-o", out)
    return out, {"before": before, "after": loadavg(), "seconds": round(time.perf_counter() - t0, 1)}


def profile_load(doc: dict) -> dict:
    """The profile's own account of the load and of its timings' spread (compiler/profile: measurement)."""
    m = doc.get("measurement") or {}
    spreads = [t["spread"] for per in (m.get("threads") or {}).values() for t in per.values()]
    unstable = [name for per in (m.get("threads") or {}).values() for name, t in per.items() if not t["stable"]]
    return {"verdict": (m.get("load") or {}).get("verdict"), "max_spread": max(spreads, default=None),
            "median_spread": statistics.median(spreads) if spreads else None, "unstable": unstable,
            "warnings": m.get("warnings") or []}


def top_level_only(doc: dict, folder: Path) -> Path:
    """The profile as the cost model read it before: top-level figures, no thread counts, op table or curves."""
    old = {k: v for k, v in doc.items() if k not in TOP_LEVEL_ONLY}
    old["name"] = f"{doc['name']}-top"
    path = folder / "host-top.yaml"
    path.write_text(yaml.safe_dump(old, sort_keys=False))
    return path


def cluster(folder: Path, name: str, profile: Path) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"devices": [{"name": "host", "profile": str(profile), "threads": 1}]}))
    return path


def predict(model: Path, devices: Path, outdir: Path) -> float:
    summary = json.loads(edgec("compile", model, "--devices", devices, "-o", outdir, "--json"))
    return float(summary["predicted_latency_ms"])


def measure(outdir: Path, repeat: int) -> float:
    result = json.loads(edgec("run", outdir / "manifest.json", "--threads", "1", "--repeat", repeat, "--random-inputs", "--json"))
    return statistics.median(result["latencies_ms"])


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def table(rows: list[dict]) -> str:
    lines = ["| model | measured ms | before ms | before error | after ms | after error |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['measured']:.1f} | {r['before']:.1f} | {r['before_err']:+.1%} | "
                     f"{r['after']:.1f} | {r['after_err']:+.1%} |")
    for key in ("before", "after"):
        errs = [abs(r[f"{key}_err"]) for r in rows]
        lines.append(f"\n{key}: median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, help="a profile made with `edgec profile --threads 1` (default: make one)")
    ap.add_argument("--repeat", type=int, default=10, help="requests per measurement (median)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated names under models/build")
    ap.add_argument("--folder", type=Path, help="work folder (default: a temporary one)")
    ap.add_argument("--json", dest="json_out", type=Path, help="also write the rows and load as JSON")
    args = ap.parse_args()

    folder = args.folder or Path(tempfile.mkdtemp(prefix="edgec-fidelity-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.profile is None:
        log("profiling this host at 1 thread ...")
        prof_path, around = profile_host(folder)
    else:
        prof_path, around = args.profile, None
    doc = yaml.safe_load(prof_path.read_text())
    if 1 not in (doc.get("threads") or {}):
        raise SystemExit(f"{prof_path}: no figures for 1 thread (make it with `edgec profile --threads 1`)")
    load = {"profile": str(prof_path), "loadavg_around_profile": around, "cpus": os.cpu_count(), **profile_load(doc)}
    clusters = {"before": cluster(folder, "before", top_level_only(doc, folder)), "after": cluster(folder, "after", prof_path)}

    rows = []
    for name in args.models.split(","):
        model = REPO / "models" / "build" / f"{name}.onnx"
        if not model.is_file():
            raise SystemExit(f"{model}: not built (make -C models)")
        row = {"model": name}
        for key, devices in clusters.items():
            row[key] = predict(model, devices, folder / f"{name}-{key}")
        la0 = loadavg()
        row["measured"] = measure(folder / f"{name}-after", args.repeat)
        row["loadavg_during"] = [la0, loadavg()]
        row["before_err"], row["after_err"] = error(row["before"], row["measured"]), error(row["after"], row["measured"])
        log(f"{name}: measured {row['measured']:.1f} ms, predicted before {row['before']:.1f} ms "
            f"({row['before_err']:+.1%}), after {row['after']:.1f} ms ({row['after_err']:+.1%})")
        rows.append(row)

    print(f"Host: {os.cpu_count()} CPUs; profile {prof_path} (1 thread)")
    print(f"Load: profile verdict {load['verdict']}, timing spread median {load['median_spread']} / worst "
          f"{load['max_spread']}, unstable timings {len(load['unstable'])}; load average around the profile "
          f"{around}; during the runs {[r['loadavg_during'] for r in rows]}")
    for w in load["warnings"]:
        print(f"Profile warning: {w}")
    print()
    print(table(rows))
    if args.json_out:
        args.json_out.write_text(json.dumps({"load": load, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
