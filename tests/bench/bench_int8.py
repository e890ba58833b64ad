"""int8 against fp32 plans: bytes moved between devices and predicted latency and throughput, same clusters.

For each model of models/quantized.py's BASES, the float model and its QDQ, QOperator and dynamic int8 versions
are planned (`auto`, as `edgec compile` does) for latency and for throughput on the clusters below.  A cut of
a QDQ or QOperator plan carries the uint8 tensor a QuantizeLinear produced (a quarter of the float bytes); a
dynamic plan's cuts stay float (its activations are quantized inside each unit).  The int8 layers are priced
at the profiles' float figures (the shipped profiles have no int8 figures: see the profile schema), so the
predicted speed-up is the bytes' and the weights' only, not the int8 kernels'.

With --measure (the default; --no-measure to plan only), the latency objective's plans on the first cluster
are also compiled and run with `edgec run` on local workers (one thread each, this machine's cores shared
with whatever else runs), one request at a time after --warmup ones, --verify on: the measured median latency
sits beside the predicted one (predicted for Pis, measured here: compare int8 against fp32, not the columns).

Run: python tests/bench/bench_int8.py [--models mobilenetv2,...] [--clusters NAME,...] [--no-measure]
     [--repeat N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

import edgec
from edgec import models
from edgec.compiler.api import compile as compile_api
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.driver import plan_model
from edgec.compiler.ingest import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
INT8_DIR = ROOT / "models" / "build-int8"
SWITCHED = {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}
CLUSTERS = {
    "rpi5+rpi4 @100Mbps": {"devices": [{"name": "pi5", "profile": "rpi5"}, {"name": "pi4", "profile": "rpi4"}],
                           "network": SWITCHED},
    "2xrpi5+2xrpi4 @100Mbps": {"devices": [{"name": f"pi{k}-{i}", "profile": f"rpi{k}"} for k in (5, 4) for i in "ab"],
                               "network": SWITCHED},
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def case(path: Path, cluster: Path, objective: str) -> dict:
    ing = load_model(path)
    cost = build_cost_table(ing.graph, load_cluster(cluster), ing.sha256, model=ing.model)
    chosen, _ = plan_model(ing.graph, cost, "auto", objective)
    p = chosen.prediction
    return {"strategy": chosen.strategy, "layers": len(ing.graph.layers), "latency_ms": p.latency_ms,
            "throughput": p.throughput_ips, "bytes": p.bytes_transferred,
            "devices": len({s.device for s in chosen.plan.stages}
                           | {d for s in chosen.plan.stages if s.spatial for d in s.spatial.devices})}


def measure(path: Path, cluster: Path, tmp: Path, repeat: int, warmup: int) -> dict:
    """`edgec compile` (auto, latency) and `edgec run` on local workers, one request at a time, verified."""
    build = tmp / f"build-{path.stem}"
    compile_api(path, cluster, build, objective="latency")
    report = edgec.run(build, random_inputs=True, seed=1, verify=True, repeat=repeat, warmup=warmup, inflight=1,
                       threads=1)
    return {"measured_ms": statistics.median(report["latencies_ms"]), "verified": report["verify"]["passed"]}


def table(rows: list[dict]) -> str:
    lines = ["| cluster | objective | model | format | layers | plan | devices | bytes per input | vs fp32 | "
             "predicted ms | predicted /s | measured ms | verified |",
             "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ratio = f"{r['bytes'] / r['fp32_bytes']:.2f}" if r["fp32_bytes"] else "-"
        measured = f"{r['measured_ms']:.2f}" if "measured_ms" in r else "-"
        verified = ("yes" if r["verified"] else "NO") if "verified" in r else "-"
        lines.append(f"| {r['cluster']} | {r['objective']} | {r['model']} | {r['format']} | {r['layers']} | "
                     f"{r['strategy']} | {r['devices']} | {r['bytes']} | {ratio} | {r['latency_ms']:.2f} | "
                     f"{r['throughput']:.1f} | {measured} | {verified} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(models.quantized.BASES))
    ap.add_argument("--clusters", default=",".join(CLUSTERS), help="comma-separated names of CLUSTERS")
    ap.add_argument("--measure", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the first cluster's latency plans on local workers (default: on)")
    ap.add_argument("--repeat", type=int, default=20, help="timed requests per measured plan")
    ap.add_argument("--warmup", type=int, default=3, help="untimed requests first")
    ap.add_argument("--json", type=Path, default=None, help="write every case as JSON here")
    args = ap.parse_args()
    names = [c for c in args.clusters.split(",") if c]
    unknown = [c for c in names if c not in CLUSTERS]
    if unknown:
        ap.error(f"unknown cluster(s) {', '.join(unknown)} (choose from {', '.join(CLUSTERS)})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_int8_") as tmp:
        for cname in names:
            cluster = Path(tmp) / "cluster.yaml"
            cluster.write_text(yaml.safe_dump(CLUSTERS[cname]))
            for base in [m for m in args.models.split(",") if m]:
                paths = {"fp32": models.ensure(base)} | {f: models.ensure(f"{base}_{f}", INT8_DIR)
                                                         for f in models.quantized.FORMATS}
                for objective in ("latency", "throughput"):
                    fp32 = None
                    for fmt, path in paths.items():
                        log(f"{cname}: {base} {fmt} {objective}")
                        r = case(path, cluster, objective)
                        if args.measure and cname == names[0] and objective == "latency":
                            r |= measure(path, cluster, Path(tmp), args.repeat, args.warmup)
                        fp32 = fp32 or r
                        rows.append({"cluster": cname, "objective": objective, "model": base, "format": fmt,
                                     "fp32_bytes": fp32["bytes"], **r})
    print(table(rows))
    q = [r for r in rows if r["format"] in ("qdq", "qop") and r["fp32_bytes"]]
    fewer = sum(r["bytes"] < r["fp32_bytes"] for r in q)
    print(f"\nQDQ and QOperator plans that move fewer bytes than the fp32 plan: {fewer} of {len(q)} (of the cases "
          "where the fp32 plan moves any)")
    ran = [r for r in rows if "verified" in r]
    if ran:
        print(f"measured plans that verified against the whole model: {sum(r['verified'] for r in ran)} of {len(ran)}")
    if any(not r["verified"] for r in ran):
        return 1
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
