"""Benchmark (issue 15, item 4): contention-aware send order against tile order, on shared Wi-Fi.

    python tests/bench/bench_contention.py [--quick] [--json FILE]

For every conv model, cluster and spatial strategy (the spatial and hybrid searches, and the spatial
baselines BBGrap, EdgeFlow and DeepThings, whose plans spread over every device), the same plan's predicted
latency (compiler.cost.evaluate) with each exchange's sends in tile order and in the contention-aware
order (compiler/cost/order.py). Predicted figures under the profiles' cost model, not measurements.
The median and best gain are over the plans where a spatial stage exists; a plan predicted worse than
tile order is a failure (exit 1). Tables go to stdout as markdown, progress to stderr.

Then the pipeline cases: for the models whose cuts carry several tensors or skip connections, on 3 to 8
devices, the pipeline planner's plans (latency and throughput), the even split's and the hybrid search's,
with each stage's burst of messages to later stages in `hops` order and in the contention-aware order
(order.py order_bursts). A burst has a choice only when it goes to several stages on other devices; the
median and best gain are over the plans with such a burst, and a plan predicted worse is a failure too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from edgec import models
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table, evaluate
from edgec.compiler.driver import plan_model
from edgec.compiler.errors import UserError
from edgec.compiler.ingest import load_model
from edgec.compiler.plan.planner import InfeasibleError
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

MODELS = ["vgg16", "resnet50", "yolo_focus", "inception_v1", "mobilenetv2"]
QUICK_MODELS = ["vgg16", "yolo_focus"]
STRATEGIES = ["spatial", "hybrid", "bbgrap", "edgeflow", "deepthings"]
PIPELINE_MODELS = ["transformer", "inception_v1", "resnet50", "densenet121"]
QUICK_PIPELINE_MODELS = ["transformer"]
PIPELINE_CASES = [("pipeline", "latency"), ("pipeline", "throughput"), ("even", "latency"), ("hybrid", "latency")]
WIFI = {"bandwidth_mbps": 200, "latency_ms": 2, "medium": "shared"}
CLUSTERS = {
    "laptop+2xphone wifi200": {"devices": [{"name": "laptop", "profile": "laptop"},
                                           {"name": "phone-a", "profile": "phone"},
                                           {"name": "phone-b", "profile": "phone"}], "network": WIFI},
    "8 devices wifi200": {"devices": [{"name": "laptop", "profile": "laptop"},
                                      *({"name": f"phone-{i}", "profile": "phone"} for i in "abc"),
                                      *({"name": f"pi5-{i}", "profile": "rpi5"} for i in "ab"),
                                      *({"name": f"pi4-{i}", "profile": "rpi4"} for i in "ab")], "network": WIFI},
}
PIPELINE_CLUSTERS = {
    **CLUSTERS,
    "2xrpi5+2xrpi4 switched100": {"devices": [{"name": f"pi{k}-{i}", "profile": f"rpi{k}"} for k in (5, 4) for i in "ab"],
                                  "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}},
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cost_table(ing, name: str, doc: dict, tmp: Path):
    path = tmp / (name.replace(" ", "_").replace("+", "_") + ".yaml")
    path.write_text(yaml.safe_dump(doc))
    return build_cost_table(ing.graph, load_cluster(path), ing.sha256)


def _both_orders(row: dict, ing, cost, strategy: str, objective: str):
    """(plan, its prediction in contention-aware order, row with the figures in both orders), or (None, None,
    row saying why no plan was found)."""
    try:
        cand, _ = plan_model(ing.graph, cost, strategy, objective)
    except (InfeasibleError, UserError) as exc:
        return None, None, row | {"skipped": str(exc).splitlines()[0]}
    t0 = time.perf_counter()
    ordered = evaluate(cand.plan, ing.graph, cost)
    seconds = time.perf_counter() - t0
    fixed = evaluate(cand.plan, ing.graph, cost, contention_order=False)
    return cand.plan, ordered, row | {
        "fixed_ms": fixed.latency_ms, "ordered_ms": ordered.latency_ms,
        "gain_pct": 100.0 * (fixed.latency_ms - ordered.latency_ms) / fixed.latency_ms,
        "fixed_bottleneck_ms": fixed.bottleneck_ms, "ordered_bottleneck_ms": ordered.bottleneck_ms,
        "evaluate_s": seconds}


def measure(model: str, cluster: str, cost, ing, strategy: str) -> dict:
    """One plan's latency in tile order and in contention-aware order."""
    plan, ordered, row = _both_orders({"model": model, "cluster": cluster, "strategy": strategy}, ing, cost,
                                      strategy, "latency")
    if plan is None:
        return row
    spatial = sum(1 for s in plan.stages if s.spatial is not None)
    return row | {"spatial_stages": spatial, "reordered_stages": len(ordered.send_order),
                  "devices": len({d for s in plan.stages for d in ([s.device, *s.spatial.devices] if s.spatial else [s.device])})}


def measure_bursts(model: str, cluster: str, cost, ing, strategy: str, objective: str) -> dict:
    """One plan's latency with each stage's burst in `hops` order and in contention-aware order."""
    plan, ordered, row = _both_orders({"model": model, "cluster": cluster, "strategy": strategy,
                                       "objective": objective}, ing, cost, strategy, objective)
    if plan is None:
        return row
    devs = [s.device for s in plan.stages]
    several = sum(1 for k, dev in enumerate(devs) if len({b for _, a, b in ordered.hops if a == k and devs[b] != dev}) > 1)
    return row | {"stages": len(plan.stages), "bursts": several, "reordered_bursts": len(ordered.burst_order)}


def _table(head: list[str], rows: list[dict], lead: list[str], cells) -> str:
    """A markdown table: each row's `lead` keys, then `cells(row)`; a plan that was not found reads n/a and why."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        rest = ["n/a"] * (len(head) - len(lead) - 1) + [r["skipped"]] if "skipped" in r else cells(r)
        out.append("| " + " | ".join([*(str(r[k]) for k in lead), *rest]) + " |")
    return "\n".join(out)


def burst_table(rows: list[dict]) -> str:
    return _table(["model", "cluster", "strategy", "objective", "stages", "bursts to several stages (reordered)",
                   "hops order ms", "contention-aware ms", "gain"], rows, ["model", "cluster", "strategy", "objective"],
                  lambda r: [str(r["stages"]), f"{r['bursts']} ({r['reordered_bursts']})", f"{r['fixed_ms']:.2f}",
                             f"{r['ordered_ms']:.2f}", f"{r['gain_pct']:.2f}%"])


def table(rows: list[dict]) -> str:
    return _table(["model", "cluster", "strategy", "devices", "spatial stages (reordered)", "tile order ms",
                   "contention-aware ms", "gain"], rows, ["model", "cluster", "strategy"],
                  lambda r: [str(r["devices"]), f"{r['spatial_stages']} ({r['reordered_stages']})",
                             f"{r['fixed_ms']:.2f}", f"{r['ordered_ms']:.2f}", f"{r['gain_pct']:.2f}%"])


def summary(rows: list[dict], clusters=CLUSTERS, has: str = "spatial_stages") -> dict:
    """Median and best gain per cluster and overall, over the plans where order can matter (`has`: a
    spatial stage, or a burst to several stages)."""
    out = {}
    for name in [*clusters, "all"]:
        gains = [r["gain_pct"] for r in rows if r.get(has) and name in ("all", r["cluster"])]
        worse = [r for r in rows if r.get(has) and name in ("all", r["cluster"])
                 and (r["ordered_ms"] > r["fixed_ms"] or r["ordered_bottleneck_ms"] > r["fixed_bottleneck_ms"])]
        out[name] = {"plans": len(gains), "improved": sum(1 for g in gains if g > 0),
                     "median_gain_pct": statistics.median(gains) if gains else None,
                     "best_gain_pct": max(gains, default=None), "worse": len(worse),
                     "median_gain_improved_pct": statistics.median([g for g in gains if g > 0]) if any(g > 0 for g in gains) else None}
    return out


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}%"


def summary_table(summ: dict, plans: str = "spatial plans", reference: str = "tile order") -> str:
    out = [f"| cluster | {plans} | improved | median gain | median gain where improved | best gain | worse than {reference} |",
           "|---|---|---|---|---|---|---|"]
    for name, s in summ.items():
        out.append(f"| {name} | {s['plans']} | {s['improved']} | {fmt(s['median_gain_pct'])} "
                   f"| {fmt(s['median_gain_improved_pct'])} | {fmt(s['best_gain_pct'])} "
                   f"| {s['worse']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_MODELS)}; pipeline cases: {', '.join(QUICK_PIPELINE_MODELS)}")
    ap.add_argument("--json", type=Path, help="also write the rows and the summary as JSON here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in QUICK_MODELS if args.quick else MODELS:
            ing = load_model(models.ensure(model))
            for cname, doc in CLUSTERS.items():
                cost = cost_table(ing, cname, doc, Path(tmp))
                for strategy in STRATEGIES:
                    rows.append(measure(model, cname, cost, ing, strategy))
                    r = rows[-1]
                    log(f"{model} | {cname} | {strategy} | " + (r.get("skipped") or
                        f"{r['fixed_ms']:.2f} -> {r['ordered_ms']:.2f} ms ({r['gain_pct']:.2f}%), evaluate {r['evaluate_s']:.2f} s"))
        burst_rows = pipeline_rows(QUICK_PIPELINE_MODELS if args.quick else PIPELINE_MODELS, Path(tmp))
    summ = summary(rows)
    burst_summ = summary(burst_rows, PIPELINE_CLUSTERS, "bursts")
    print("## Contention-aware send order: predicted latency, same plan\n")
    print(table(rows))
    print("\n## Gain over tile order\n")
    print(summary_table(summ))
    print("\n## Pipeline stages' bursts to several later stages: predicted latency, same plan\n")
    print(burst_table(burst_rows))
    print("\n## Gain over hops order\n")
    print(summary_table(burst_summ, "plans with such a burst", "hops order"))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summ, "pipeline_rows": burst_rows,
                                         "pipeline_summary": burst_summ}, indent=2))
    return 1 if summ["all"]["worse"] or burst_summ["all"]["worse"] else 0


def pipeline_rows(names: list[str], tmp: Path) -> list[dict]:
    rows = []
    for model in names:
        ing = load_model(models.ensure(model))
        for cname, doc in PIPELINE_CLUSTERS.items():
            cost = cost_table(ing, cname, doc, tmp)
            for strategy, objective in PIPELINE_CASES:
                rows.append(measure_bursts(model, cname, cost, ing, strategy, objective))
                r = rows[-1]
                log(f"{model} | {cname} | {strategy} {objective} | " + (r.get("skipped") or
                    f"{r['bursts']} bursts, {r['fixed_ms']:.2f} -> {r['ordered_ms']:.2f} ms ({r['gain_pct']:.2f}%)"))
    return rows


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
