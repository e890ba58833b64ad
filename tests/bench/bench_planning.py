"""Benchmark (issue 12, item 3): how long `auto` plans, what each planner's search did, and what it chose.

    python tests/bench/bench_planning.py [--quick] [--repeat N] [--json FILE] [--against FILE]

For every model x cluster (tests/e2e/clusters/two.yaml and four.yaml: rpi5 + rpi4, and 2x rpi5 + 2x rpi4
with a 1000 Mbps link between the rpi5s, 100 Mbps otherwise), objective latency: the median planning
time of `auto` over --repeat runs (the compile's `timings.plan`, in process, the model ingested and priced
once), each planner's seconds and work (`edgec compile --json`'s `planning` key: pipeline DP labels,
partition-tree nodes and states of the spatial searches, plans scored), and the chosen plan's predicted
latency and throughput. `--json FILE` writes the rows; `--against FILE` (an earlier run's --json, e.g. of
the revision before a change) flags every case whose chosen plan is predicted worse than it was there.

Targets (issue 12): a 200-300-layer model on 4 devices plans within 3 s, ResNet-50 on 4 devices within 0.5 s,
on an unloaded 2-core machine; the load average is printed with the table, as timings on a loaded machine
are not the targets' figures. Tables go to stdout (markdown), progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from edgec import models
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.driver import plan_model
from edgec.compiler.ingest import load_model
from edgec.compiler.plan.planner import PlanOptions
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

MODELS = ["resnet50", "inception_v2", "densenet121", "transformer", "yolo_focus", "ocr_rec"]
QUICK_MODELS = ["resnet50", "ocr_rec"]
CLUSTERS = {"2 devices": ROOT / "tests/e2e/clusters/two.yaml", "4 devices": ROOT / "tests/e2e/clusters/four.yaml"}
# (what, seconds, rows it applies to): the planning-time targets
TARGETS = [("200-300 layers, 4 devices", 3.0, lambda r: 200 <= r["layers"] <= 300 and r["cluster"] == "4 devices"),
           ("resnet50, 4 devices", 0.5, lambda r: r["model"] == "resnet50" and r["cluster"] == "4 devices")]
SEARCHES = ("spatial", "hybrid")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(model: str, cluster: str, repeat: int) -> dict:
    """One case: median planning time of auto (latency) and the last run's figures."""
    ing = load_model(models.ensure(model), None)
    cost = build_cost_table(ing.graph, load_cluster(CLUSTERS[cluster]), ing.sha256, model=ing.model)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        chosen, candidates = plan_model(ing.graph, cost, "auto", "latency", PlanOptions())
        times.append(time.perf_counter() - t0)
    planners = {}
    for c in candidates:  # a revision before the search statistics has no `stats`: its work is unknown
        stats = getattr(c, "stats", None) or {"seconds": None, "group": [c.strategy], "work": {}}
        planners[c.strategy] = {"seconds": _round(stats["seconds"]), "group": stats["group"], "work": stats["work"],
                                "latency_ms": _round(c.prediction and c.prediction.latency_ms), "pruned": c.pruned}
    return {"model": model, "cluster": cluster, "layers": len(ing.graph.layers), "blocks": len(ing.graph.blocks),
            "plan_seconds": round(statistics.median(times), 4), "plan_seconds_all": [round(t, 4) for t in times],
            "strategy": chosen.strategy, "latency_ms": _round(chosen.prediction.latency_ms),
            "throughput_ips": _round(chosen.prediction.throughput_ips), "planners": planners}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _work(row: dict, name: str, unit: str) -> str:
    got = row["planners"].get(name, {}).get("work", {}).get(unit)
    return "-" if got is None else f"{got:,}"


def table(rows: list[dict]) -> str:
    head = ["model", "layers", "cluster", "plan s (median)", "spatial+hybrid s", "search nodes", "search states",
            "pipeline labels", "other planners s", "chosen", "latency ms", "throughput/s"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        searching = (r["planners"].get("spatial") or r["planners"].get("hybrid") or {}).get("seconds")
        others = [p["seconds"] for n, p in r["planners"].items() if n not in SEARCHES]
        others_s = "-" if None in others else f"{sum(others):.2f}"
        cells = [r["model"], str(r["layers"]), r["cluster"], f"{r['plan_seconds']:.2f}",
                 "-" if searching is None else f"{searching:.2f}",
                 _work(r, "spatial", "nodes"), _work(r, "spatial", "states"), _work(r, "pipeline", "labels"),
                 others_s, r["strategy"], f"{r['latency_ms']:.1f}", f"{r['throughput_ips']:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def missed_targets(rows: list[dict]) -> list[str]:
    return [f"{what}: {r['model']} planned in {r['plan_seconds']:.2f} s (target {limit} s)"
            for what, limit, applies in TARGETS for r in rows if applies(r) and r["plan_seconds"] > limit]


def worse_than(rows: list[dict], earlier: list[dict]) -> list[str]:
    """Cases whose chosen plan is predicted slower (latency, then throughput) than in `earlier`."""
    before = {(r["model"], r["cluster"]): r for r in earlier}
    out = []
    for r in rows:
        b = before.get((r["model"], r["cluster"]))
        if b is not None and (r["latency_ms"], -r["throughput_ips"]) > (b["latency_ms"], -b["throughput_ips"]):
            out.append(f"{r['model']} on {r['cluster']}: {r['strategy']} {r['latency_ms']} ms / "
                       f"{r['throughput_ips']}/s, was {b['strategy']} {b['latency_ms']} ms / {b['throughput_ips']}/s")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{' and '.join(QUICK_MODELS)} only")
    ap.add_argument("--repeat", type=int, default=3, help="plans per case (median reported)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--against", type=Path, help="an earlier run's --json: flag plans predicted worse than there")
    args = ap.parse_args()
    rows = []
    for model in QUICK_MODELS if args.quick else MODELS:
        for cluster in CLUSTERS:
            rows.append(measure(model, cluster, max(1, args.repeat)))
            r = rows[-1]
            log(f"{model} on {cluster}: {r['plan_seconds']:.2f} s, {r['strategy']} {r['latency_ms']} ms")
    print(f"## Planning time of auto (objective latency; load average {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} cores)\n")
    print(table(rows))
    missed = missed_targets(rows)
    print("\nplanning-time targets met: " + ("yes" if not missed else "NO: " + "; ".join(missed)))
    worse = worse_than(rows, json.loads(args.against.read_text())) if args.against else []
    if args.against:
        print(f"plans no worse than {args.against}: " + ("yes" if not worse else "NO: " + "; ".join(worse)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if missed or worse else 0


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
