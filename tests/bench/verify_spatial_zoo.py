"""Verification sweep (issue 3): every spatial planner on every convolutional model, 2 to 8 devices.

    python tests/bench/verify_spatial_zoo.py [--models a,b] [--strategies s,t] [--sizes 2,3,4,6,8] [--jobs N]

For each (model, cluster size, strategy): `edgec compile --strategy S` then `edgec run --random-inputs
--verify`, exactly as a user runs them. Clusters mix rpi5, rpi4, jetson-orin-nano and phone profiles at
100 Mbps so tiles come out uneven. A planner that finds no plan for a cluster must say so in one line with
exit code 2 (reported as "no plan"); any other failure, or a verify mismatch, fails the sweep (exit 1).
Prints a markdown table (stdout) and progress (stderr). Not collected by pytest (its name has no test_).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from edgec import models

CONV_MODELS = ["tinyconv", "squeezenet", "alexnet", "zfnet512", "shufflenet", "mobilenetv2", "inception_v1",
               "inception_v2", "resnet50", "densenet121", "vgg16", "vgg19"]
STRATEGIES = ["spatial", "hybrid", "bbgrap", "edgeflow", "deepthings"]
KINDS = ["rpi5", "rpi4", "jetson-orin-nano", "phone"]


def cluster_yaml(n: int) -> str:
    devs = "\n".join(f"  - {{name: d{i}-{KINDS[i % len(KINDS)]}, profile: {KINDS[i % len(KINDS)]}}}" for i in range(n))
    return f"devices:\n{devs}\nnetwork: {{bandwidth_mbps: 100, latency_ms: 1, medium: switched}}\n"


def edgec(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgec.compiler", *map(str, args)], capture_output=True, text=True,
                          timeout=3600, cwd=ROOT)


def one(model: Path, name: str, n: int, strategy: str, tmp: Path) -> dict:
    work = tmp / f"{name}-{n}-{strategy}"
    work.mkdir()
    cluster = work / "cluster.yaml"
    cluster.write_text(cluster_yaml(n))
    t = time.perf_counter()
    c = edgec("compile", model, "--devices", cluster, "-o", work / "out", "--strategy", strategy, "--json")
    row = {"model": name, "devices": n, "strategy": strategy, "compile_s": time.perf_counter() - t}
    if c.returncode == 2 and "Traceback" not in c.stderr and len(c.stderr.strip().splitlines()) >= 1:
        row.update(status="no plan", detail=c.stderr.strip().splitlines()[-1])
        return row
    if c.returncode != 0:
        row.update(status="FAIL", detail=f"compile exit {c.returncode}: {c.stderr.strip()[-300:]}")
        return row
    s = json.loads(c.stdout)
    tiled = [st for st in s["stages"] if st["spatial"]]
    row["tiles"] = sum(len(g["tiles"]) for st in tiled for g in st["spatial"]["segments"])
    row["tile_devices"] = len({d for st in tiled for d in st["spatial"]["devices"]})
    r = edgec("run", work / "out/manifest.json", "--random-inputs", "--seed", "11", "--verify", "--json")
    if r.returncode not in (0, 1):
        row.update(status="FAIL", detail=f"run exit {r.returncode}: {r.stderr.strip()[-300:]}")
        return row
    v = json.loads(r.stdout)["verify"]
    row.update(status="ok" if v["passed"] else "FAIL", max_abs_diff=v["max_abs_diff"],
               detail="" if v["passed"] else f"verify failed on {v.get('worst_output')}")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(CONV_MODELS))
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--sizes", default="2,3,4,6,8")
    ap.add_argument("--jobs", type=int, default=1, help="cases run at once (each run starts one process per device)")
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m]
    sizes = [int(x) for x in args.sizes.split(",")]
    strategies = [s for s in args.strategies.split(",") if s]
    rows = []
    with tempfile.TemporaryDirectory() as td:
        cases = [(models.ensure(m), m, n, s) for m in names for n in sizes for s in strategies]

        def run(case):
            row = one(*case, Path(td))
            print(f"{row['model']} {row['devices']} dev {row['strategy']}: {row['status']} "
                  f"{row.get('max_abs_diff', '')} {row.get('detail', '')}", file=sys.stderr, flush=True)
            return row

        with ThreadPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(run, cases))
    print("| model | devices | strategy | status | tiles | tile devices | max abs diff | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        diff = f"{r['max_abs_diff']:.2e}" if "max_abs_diff" in r else "-"
        print(f"| {r['model']} | {r['devices']} | {r['strategy']} | {r['status']} | {r.get('tiles', '-')} | "
              f"{r.get('tile_devices', '-')} | {diff} | {r['compile_s']:.1f} |")
    ok = sum(r["status"] == "ok" for r in rows)
    none = [r for r in rows if r["status"] == "no plan"]
    bad = [r for r in rows if r["status"] == "FAIL"]
    print(f"\n{ok} verified, {len(none)} without a plan (one-line exit 2), {len(bad)} failed, of {len(rows)} cases")
    for r in none + bad:
        print(f"- {r['model']} {r['devices']} dev {r['strategy']}: {r['status']}: {r['detail']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
