"""Benchmark (issue 2): predicted latency/throughput of `auto` next to the baselines, compile time, and the
runtime's overhead over plain onnxruntime. Run: python tests/bench/bench_pipeline.py [--quick] [--skip-runtime]

Tables go to stdout (markdown), progress to stderr. Compile times are medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from compiler.driver import compile_model  # noqa: E402

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


def runtime_overhead(tmp: Path, model_name: str, repeat: int, rounds: int) -> str:
    """One-device manifest through `edgec run --repeat N` vs plain onnxruntime, same threads, side by side."""
    import numpy as np
    import onnxruntime as ort

    model = models.ensure(model_name)
    cpath = write_cluster(tmp, "one", {"devices": [{"name": "solo", "profile": "laptop"}],
                                       "network": {"bandwidth_mbps": 100, "latency_ms": 1}})
    out = tmp / "solo"
    compile_model(model, cpath, out, "single", "latency")
    import os

    threads = os.cpu_count()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.random.default_rng(0).standard_normal([d for d in i.shape]).astype(np.float32) for i in sess.get_inputs()}
    ratios = []
    for r in range(rounds):
        sess.run(None, feeds)
        plain = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            plain.append((time.perf_counter() - t0) * 1000)
        proc = subprocess.run([sys.executable, "-m", "compiler", "run", str(out / "manifest.json"), "--random-inputs",
                               "--repeat", str(repeat), "--threads", str(threads), "--json"],
                              capture_output=True, text=True, check=True)
        edge = json.loads(proc.stdout)["latency_ms"]
        ratios.append(edge / statistics.median(plain))
        log(f"round {r}: plain onnxruntime median {statistics.median(plain):.2f} ms, edgec run median {edge:.2f} ms")
    return (f"runtime overhead on {model_name}, one device, {threads} threads, --repeat {repeat}: "
            f"median ratio edgec/onnxruntime over {rounds} rounds = {statistics.median(ratios):.3f} "
            f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="ResNet-50 only, one compile per case")
    ap.add_argument("--repeat", type=int, default=3, help="compiles per case (median reported)")
    ap.add_argument("--skip-runtime", action="store_true")
    args = ap.parse_args()
    names = ["resnet50"] if args.quick else MODELS
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        table, failures = planner_table(tmp, names, 1 if args.quick else args.repeat)
        print("## Pipeline planner vs baselines (predicted; lat ms / inputs per s)\n")
        print(table)
        if not args.skip_runtime:
            print()
            print(runtime_overhead(tmp, "resnet50", 20, 1 if args.quick else 5))
    print()
    print("auto never worse than a baseline: " + ("yes" if not failures else "NO: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
