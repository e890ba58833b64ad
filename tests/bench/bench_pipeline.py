"""Benchmark (issue 2): predicted latency/throughput of `auto` next to the baselines, and compile time.
Run: python tests/bench/bench_pipeline.py [--quick] [--repeat N]. The runtime's overhead over plain
onnxruntime is measured by tests/bench/bench_runtime_overhead.py.

Tables go to stdout (markdown), progress to stderr. Compile times are medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from edgec import models
from edgec.compiler.driver import compile_model
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

MODELS = ["resnet50", "vgg19", "inception_v1", "densenet121", "transformer"]
CLUSTERS = {
    "rpi5+rpi4 @100Mbps": {"devices": [{"name": "pi5", "profile": "rpi5"}, {"name": "pi4", "profile": "rpi4"}],
                           "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}},
    "2xrpi5+2xrpi4 @100Mbps": {"devices": [{"name": f"pi{k}-{i}", "profile": f"rpi{k}"} for k in (5, 4) for i in "ab"],
                               "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}},
    "laptop+2xphone wifi600 shared": {"devices": [{"name": "laptop", "profile": "laptop"},
                                                  {"name": "phone-a", "profile": "phone"},
                                                  {"name": "phone-b", "profile": "phone"}],
                                      "network": {"bandwidth_mbps": 600, "latency_ms": 2, "medium": "shared"}},
}
BASELINES = ["single", "even", "neurosurgeon"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_cluster(tmp: Path, name: str, doc: dict) -> Path:
    import yaml

    path = tmp / (name.replace(" ", "_").replace("@", "").replace("+", "_") + ".yaml")
    path.write_text(yaml.safe_dump(doc))
    return path


def planner_table(tmp: Path, names: list[str], repeat: int) -> tuple[str, list[str]]:
    rows, failures = [], []
    for model_name in names:
        model = models.ensure(model_name)
        for cname, doc in CLUSTERS.items():
            cpath = write_cluster(tmp, cname, doc)
            for objective in ("latency", "throughput"):
                times, plans = [], []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    res = compile_model(model, cpath, tmp / "out", "auto", objective)
                    times.append(time.perf_counter() - t0)
                    plans.append(res.timings["plan"])
                cands = {c.strategy: c for c in res.candidates}
                best = res.chosen.prediction
                row = [model_name, cname, objective, f"{best.latency_ms:.1f}", f"{best.throughput_ips:.2f}"]
                for b in BASELINES:
                    p = cands[b].prediction
                    row.append("n/a" if p is None else f"{p.latency_ms:.1f} / {p.throughput_ips:.2f}")
                    if p is not None:
                        worse = best.latency_ms > p.latency_ms + 1e-9 if objective == "latency" else best.throughput_ips < p.throughput_ips - 1e-9
                        if worse:
                            failures.append(f"{model_name} {cname} {objective}: auto worse than {b}")
                row += [res.chosen.strategy, f"{statistics.median(times):.2f}", f"{statistics.median(plans) * 1000:.1f}"]
                rows.append(row)
                log(" | ".join(row))
    head = ["model", "cluster", "objective", "auto lat ms", "auto ips", *[f"{b} lat/ips" for b in BASELINES],
            "chosen", "compile s", "plan ms"]
    return markdown(head, rows), failures


def markdown(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="ResNet-50 only, one compile per case")
    ap.add_argument("--repeat", type=int, default=3, help="compiles per case (median reported)")
    args = ap.parse_args()
    names = ["resnet50"] if args.quick else MODELS
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        table, failures = planner_table(tmp, names, 1 if args.quick else args.repeat)
        print("## Pipeline planner vs baselines (predicted; lat ms / inputs per s)\n")
        print(table)
    print()
    print("auto never worse than a baseline: " + ("yes" if not failures else "NO: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
