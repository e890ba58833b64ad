"""bench_fidelity's part single: one device at 1 thread, predicted (before and after the profile's thread
figures) against measured latency.

Part single: for each of --models (ResNet-50, VGG-16, Inception v1, MobileNetV2, the transformer), on a
one-device cluster whose device runs 1 thread (`threads: 1`):
  - predicted latency (`edgec compile --json`) with two profiles:
      before: the roofline with the profile's top-level figures only (its `threads:`, op table and efficiency
              curves removed: what the cost model read before it used them);
      after:  the profile as measured, for the device's thread count;
  - measured latency (`edgec run --threads 1 --inflight 1 --warmup W --repeat N --json`): the median over the N
    requests after W untimed ones (default 5: a run's first requests are slower while its workers allocate and their
    caches fill, by 5-20% on the spatial plans here; the predictions are of the steady state); N is --repeat or
    enough requests to last a second at the predicted latency (`requests_for`), as in part two; the figure is
    the median of --rounds runs, every model once per round in turn (MobileNetV2 measured 5.0-5.3 ms in single
    runs where three back to back gave 4.65-4.72);
  - the error of each prediction, (predicted - measured) / measured; then the median and worst |error|.
  Target: median at most 10%, worst at most 20%.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchlib import requests_for
from fidelity_common import compile_json, loadavg, log, model_path, run_json, verified_line, verify_build


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def bench_single(names: list[str], folder: Path, clusters: dict[str, Path], repeat: int, rounds: int) -> list[dict]:
    """Each model's predictions, then its latency in `rounds` rounds (every model once per round, in turn), the
    median round's: one run is one moment of this machine (MobileNetV2 measured 5.0-5.3 ms in single runs where
    three runs back to back gave 4.65-4.72)."""
    rows = []
    for name in names:
        model, row = model_path(name), {"model": name, "rounds": [], "loadavg_during": []}
        for key, devices in clusters.items():
            row[key] = compile_json(model, devices, folder / f"{name}-{key}")["predicted_latency_ms"]
        row["requests"] = requests_for(repeat, 1000.0 / row["after"])
        rows.append(row)
    for _ in range(rounds):
        for row in rows:
            la0 = loadavg()
            report = run_json(folder / f"{row['model']}-after", row["requests"], "--inflight", "1")
            row["rounds"].append(report["latency_ms"])
            row["loadavg_during"].append([la0, loadavg()])
    for row in rows:
        row["measured"] = statistics.median(row["rounds"])
        row["before_err"], row["after_err"] = error(row["before"], row["measured"]), error(row["after"], row["measured"])
        row["verify"] = verify_build(folder / f"{row['model']}-after")
        rounds_said = ", ".join(f"{v:.1f}" for v in row["rounds"])
        log(f"{row['model']}: measured {row['measured']:.1f} ms (rounds {rounds_said}), "
            f"predicted before {row['before']:.1f} ms ({row['before_err']:+.1%}), after {row['after']:.1f} ms "
            f"({row['after_err']:+.1%})")
    return rows


def single_table(rows: list[dict]) -> str:
    lines = ["| model | measured ms | before ms | before error | after ms | after error |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['measured']:.1f} | {r['before']:.1f} | {r['before_err']:+.1%} | "
                     f"{r['after']:.1f} | {r['after_err']:+.1%} |")
    for key in ("before", "after"):
        errs = [abs(r[f"{key}_err"]) for r in rows]
        lines.append(f"\n{key}: median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}")
    lines.append(f"\n{verified_line(r['verify'] for r in rows)}")
    return "\n".join(lines)
