"""Benchmark (issue 15, Energy target): predicted energy per request of the latency-optimal plan against
the plan of `--objective energy --sla-ms X` with X = 3 x the latency-optimal latency (strategy auto for
both), on laptop + jetson-orin-nano-cuda (with its power modes) + 2 phones on 200 Mbit/s shared Wi-Fi,
and on the CPU-only clusters of the other benchmarks.

Run: python tests/bench/bench_energy.py [--models resnet50,...] [--clusters NAME,...] [--json FILE]

Plans only (ingest, cost table, planners, as `edgec compile` does), nothing is written but the JSON. The
markdown table goes to stdout, progress to stderr. Target: >= 20% less energy on at least 4 of the 5
models of the mixed cluster, the SLA met in every case.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

from edgec import models
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.driver import plan_model
from edgec.compiler.ingest import load_model
from edgec.compiler.plan.planner import EnergyGoal, PlanOptions
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

MODELS = ["resnet50", "mobilenetv2", "vgg16", "inception_v1", "transformer"]
WIFI = {"bandwidth_mbps": 200, "latency_ms": 2, "medium": "shared"}
SWITCHED = {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}
CLUSTERS = {
    "laptop+jetson-cuda+2xphone wifi200": {"devices": [{"name": "laptop", "profile": "laptop"},
                                                       {"name": "jetson", "profile": "jetson-orin-nano-cuda"},
                                                       {"name": "phone-a", "profile": "phone"},
                                                       {"name": "phone-b", "profile": "phone"}],
                                           "network": WIFI},
    # the CPU-only clusters of bench_pipeline.py (tests/e2e/clusters/four.yaml's devices)
    "rpi5+rpi4 @100Mbps": {"devices": [{"name": "pi5", "profile": "rpi5"}, {"name": "pi4", "profile": "rpi4"}],
                           "network": SWITCHED},
    "2xrpi5+2xrpi4 @100Mbps": {"devices": [{"name": f"pi{k}-{i}", "profile": f"rpi{k}"} for k in (5, 4) for i in "ab"],
                               "network": SWITCHED},
}
SLA_FACTOR = 3.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def case(model_name: str, cluster_path: Path) -> dict:
    ing = load_model(models.ensure(model_name))
    cost = build_cost_table(ing.graph, load_cluster(cluster_path), ing.sha256, model=ing.model)
    fast, _ = plan_model(ing.graph, cost, "auto", "latency")
    sla = SLA_FACTOR * fast.prediction.latency_ms
    t0 = time.perf_counter()
    best, _ = plan_model(ing.graph, cost, "auto", "energy", PlanOptions(energy=EnergyGoal(sla)))
    seconds = time.perf_counter() - t0
    e0, e1 = fast.prediction.energy_mj, best.prediction.energy_mj
    modes = dict(best.cost.modes) if best.cost is not None else {}
    return {"model": model_name, "latency_plan": {"strategy": fast.strategy, "latency_ms": fast.prediction.latency_ms,
                                                  "energy_mj": e0, "devices": _devices(fast)},
            "sla_ms": sla,
            "energy_plan": {"strategy": best.strategy, "latency_ms": best.prediction.latency_ms, "energy_mj": e1,
                            "devices": _devices(best), "modes": modes, "plan_seconds": seconds},
            "saving_pct": 100.0 * (e0 - e1) / e0, "sla_met": best.prediction.latency_ms <= sla}


def _devices(c) -> list[str]:
    return sorted({s.device for s in c.plan.stages} | {d for s in c.plan.stages if s.spatial for d in s.spatial.devices})


def table(rows: list[dict]) -> str:
    head = ("| cluster | model | latency plan | ms | mJ | SLA ms | energy plan | ms | mJ | modes | saving | SLA met |\n"
            "|---|---|---|---:|---:|---:|---|---:|---:|---|---:|---|")
    lines = [head]
    for r in rows:
        a, b = r["latency_plan"], r["energy_plan"]
        modes = ", ".join(f"{d}:{m}" for d, m in sorted(b["modes"].items())) or "-"
        lines.append(f"| {r['cluster']} | {r['model']} | {a['strategy']} on {'+'.join(a['devices'])} | "
                     f"{a['latency_ms']:.1f} | {a['energy_mj']:.1f} | {r['sla_ms']:.1f} | {b['strategy']} on "
                     f"{'+'.join(b['devices'])} | {b['latency_ms']:.1f} | {b['energy_mj']:.1f} | {modes} | "
                     f"{r['saving_pct']:.1f}% | {'yes' if r['sla_met'] else 'NO'} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--clusters", default=",".join(CLUSTERS), help="comma-separated names of CLUSTERS")
    ap.add_argument("--json", type=Path, default=None, help="write every case as JSON here")
    args = ap.parse_args()
    names = [c for c in args.clusters.split(",") if c]
    unknown = [c for c in names if c not in CLUSTERS]
    if unknown:
        ap.error(f"unknown cluster(s) {', '.join(unknown)} (choose from {', '.join(CLUSTERS)})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_energy_") as tmp:
        for cname in names:
            path = Path(tmp) / "cluster.yaml"
            path.write_text(yaml.safe_dump(CLUSTERS[cname]))
            for m in [m for m in args.models.split(",") if m]:
                log(f"{cname}: {m}")
                rows.append({"cluster": cname, **case(m, path)})
    print(table(rows))
    mixed = [r for r in rows if r["cluster"] == next(iter(CLUSTERS))]
    if mixed:
        hit = sum(r["saving_pct"] >= 20.0 for r in mixed)
        print(f"\nmixed cluster: >= 20% saving on {hit} of {len(mixed)} models (target: 4 of 5); "
              f"SLA met in {sum(r['sla_met'] for r in rows)} of {len(rows)} cases")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
