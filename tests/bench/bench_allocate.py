"""Benchmark (issue 13): `edgec allocate`, several models on one cluster.
Run: python tests/bench/bench_allocate.py [--quick] [--json FILE]

- 3 services (ResNet-50 at 300 ms, MobileNetV2 at 60 ms, the transformer at 400 ms) on 6 devices (2 rpi5,
  2 rpi4, 1 jetson-orin-nano, 1 phone) at 100 Mbps: every SLA met (predicted), CP-SAT's allocation against
  brute force over the same options, planning time, and every build verified by `edgec run --verify`;
- 5 services on 10 devices: planning time and CP-SAT's status (or gap) (skipped by --quick);
- HiTDL's L(n) fit error per model;
- one fairness case: the worst normalised utility under the weighted sum and under --fairness;
- one sharing case: the 3 services on 2 devices (jetson-orin-nano, phone), which exclusive devices cannot
  serve and --share can (the devices' memory and time budgets shown).

The machine's load average is printed with the table: planning time is CPU-bound (--jobs processes).

Clusters are built from the shipped profiles; models come from $EDGEC_MODELS_DIR (or models/build).
A markdown table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("EDGEC_MODELS_DIR", ROOT / "models" / "build"))

from edgec.compiler.allocate import allocate  # noqa: E402
from edgec.compiler.allocate.allocate import build_problem, plan_services  # noqa: E402
from edgec.compiler.allocate.classes import device_classes  # noqa: E402
from edgec.compiler.allocate.services import load_services  # noqa: E402
from edgec.compiler.allocate.solve import brute_force, solve  # noqa: E402
from edgec.compiler.cluster import load_cluster  # noqa: E402
from edgec.compiler.errors import UserError  # noqa: E402
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

NET = {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}
SIX = [("pi5-a", "rpi5"), ("pi5-b", "rpi5"), ("pi4-a", "rpi4"), ("pi4-b", "rpi4"), ("orin", "jetson-orin-nano"),
       ("phone", "phone")]
TEN = [*SIX[:2], ("pi5-c", "rpi5"), *SIX[2:4], ("pi4-c", "rpi4"), ("orin", "jetson-orin-nano"),
       ("orin-b", "jetson-orin-nano"), ("phone", "phone"), ("phone-b", "phone")]
THREE = [("resnet50", 300), ("mobilenetv2", 60), ("transformer", 400)]
FIVE = THREE + [("inception_v1", 250), ("squeezenet", 80)]
FAIR_CLUSTER = [("orin", "jetson-orin-nano"), ("phone", "phone")]
FAIR = [("resnet50", 300, 3.0), ("transformer", 400, 1.0)]
SHARE_CLUSTER = FAIR_CLUSTER


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write(tmp: Path, name: str, devices, services) -> tuple[Path, Path]:
    cluster = tmp / f"{name}-cluster.yaml"
    cluster.write_text(yaml.safe_dump({"devices": [{"name": n, "profile": p} for n, p in devices], "network": NET}))
    svc = tmp / f"{name}-services.yaml"
    svc.write_text(yaml.safe_dump({"services": [
        {"name": s[0], "model": str(MODELS / f"{s[0]}.onnx"), "sla_ms": s[1],
         **({"priority": s[2]} if len(s) > 2 else {})} for s in services]}))
    return svc, cluster


def brute_force_agrees(svc: Path, cluster: Path, fairness: bool = False, share: bool = False) -> bool:
    """CP-SAT's optimum equals brute force's over the same options (the planning is repeated for this)."""
    cl = load_cluster(cluster)
    classes = device_classes(cl)
    planned = plan_services(load_services(svc), cl, classes)
    problem = build_problem(list(planned), classes, fairness, cl if share else None)
    return solve(problem).key == brute_force(problem)[1]


def verify(outdir: Path, names) -> dict[str, bool]:
    out = {}
    for name in names:
        proc = subprocess.run([sys.executable, "-m", "edgec.compiler", "run", str(outdir / name), "--random-inputs",
                               "--verify", "--json"], capture_output=True, text=True, timeout=900)
        out[name] = proc.returncode == 0 and json.loads(proc.stdout)["verify"]["passed"]
    return out


def case(tmp: Path, name: str, devices, services, check_runs: bool, **kw) -> dict:
    svc, cluster = write(tmp, name, devices, services)
    log(f"{name}: allocating {len(services)} services on {len(devices)} devices")
    t0 = time.perf_counter()
    a = allocate(svc, cluster, tmp / name, **kw)
    wall = time.perf_counter() - t0
    row = {"case": name, "allocation": a, "wall_seconds": wall,
           "sla_met": all(s["predicted_latency_ms"] <= s["sla_ms"] for s in a["services"].values())
           and not a["dropped"]}
    if check_runs:
        row["optimal_vs_brute_force"] = brute_force_agrees(svc, cluster, kw.get("fairness", False),
                                                           kw.get("share", False))
        row["verified"] = verify(tmp / name, a["services"])
    return row


def sharing(tmp: Path) -> dict:
    """The 3 services on 2 devices: exclusive devices (expected to fail: 3 services, 2 devices), then --share."""
    svc, cluster = write(tmp, "share", SHARE_CLUSTER, THREE)
    try:
        allocate(svc, cluster, tmp / "exclusive")
        exclusive = "served"
    except UserError as exc:
        exclusive = str(exc)
    row = case(tmp, "3 services, 2 devices, --share", SHARE_CLUSTER, THREE, check_runs=True, share=True)
    row["exclusive"] = exclusive
    return row


def table(rows: list[dict], fair: tuple[dict, dict], shared: dict) -> str:
    out = ["| case | status (gap) | planning s | CP-SAT ms | SLA met | = brute force | builds verify |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["allocation"]
        gap = "" if a["status"] == "OPTIMAL" else f" ({a['gap']:.2%})"
        ver = r.get("verified")
        out.append(f"| {r['case']} | {a['status']}{gap} | {a['planning_seconds']:.2f} | {a['solve_seconds'] * 1e3:.0f} "
                   f"| {'yes' if r['sla_met'] else 'no'} | {_yn(r.get('optimal_vs_brute_force'))} "
                   f"| {'-' if ver is None else f'{sum(ver.values())}/{len(ver)}'} |")
    out += ["", "| case | service | devices | strategy | predicted ms | SLA ms | L(n) fit error (mean / max) |",
            "|---|---|---|---|---|---|---|"]
    for r in rows:
        for name, s in r["allocation"]["services"].items():
            fit = s["latency_fit"]
            err = f"{fit['mean_error']:.1%} / {fit['max_error']:.1%} over {len(fit['points'])} plans" if fit else "-"
            out.append(f"| {r['case']} | {name} | {', '.join(s['devices'])} | {s['strategy']} "
                       f"| {s['predicted_latency_ms']:.1f} | {s['sla_ms']:g} | {err} |")
    weighted, fairness = fair
    out += ["", "| fairness case | objective | allocation | worst normalised utility |", "|---|---|---|---|"]
    for r in (weighted, fairness):
        a = r["allocation"]
        alloc = "; ".join(f"{n} on {', '.join(s['devices'])}" for n, s in a["services"].items())
        worst = min(s["normalised_utility"] for s in a["services"].values())
        out.append(f"| resnet50 (priority 3) + transformer on orin + phone | {a['objective']} | {alloc} "
                   f"| {worst:.3f} |")
    a = shared["allocation"]
    out += ["", f"Exclusive devices: {shared['exclusive']}", "",
            "| --share: device | services | memory MB (of usable) | held ms per s (of 1000) |", "|---|---|---|---|"]
    for d, e in a["share"]["devices"].items():
        out.append(f"| {d} | {', '.join(e['services'])} | {e['memory_mb']:.1f} ({e['usable_mb']:.0f}) "
                   f"| {e['held_ms_per_s']:.1f} |")
    return "\n".join(out)


def _yn(v) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the 5-service case")
    ap.add_argument("--json", dest="json_file", metavar="FILE", help="also write every figure to FILE")
    args = ap.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_allocate.") as d:
        tmp = Path(d)
        rows = [case(tmp, "3 services, 6 devices", SIX, THREE, check_runs=True)]
        if not args.quick:
            rows.append(case(tmp, "5 services, 10 devices", TEN, FIVE, check_runs=False))
        fair = (case(tmp, "fair-weighted", FAIR_CLUSTER, FAIR, check_runs=False),
                case(tmp, "fair-fairness", FAIR_CLUSTER, FAIR, check_runs=False, fairness=True))
        shared = sharing(tmp)
    rows.append(shared)
    print(table(rows, fair, shared))
    print(f"\nload average (1 min) {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores")
    if args.json_file:
        Path(args.json_file).write_text(json.dumps({"cases": rows, "fairness": list(fair), "load": load}, indent=1,
                                                   default=str))
    ok = all(r["sla_met"] and r.get("optimal_vs_brute_force", True) is not False
             and all((r.get("verified") or {}).values()) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
