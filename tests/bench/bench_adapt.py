"""Run-time adaptation (issue 15, item 6): a device slowed 3x mid-run under emulation, with and without
`edgec run --adapt`.

    python tests/bench/bench_adapt.py [--models resnet50,mobilenetv2,inception_v1,transformer] [--repeat 200]
                                      [--slow-at 50] [--factor 3] [--dilate 3] [--folder DIR] [--json FILE]

Markdown to stdout, progress to stderr; --json FILE writes every case. Not collected by pytest. The targets
(recovered within 10 requests, to within 15% of the best kept plan's re-costed latency, nothing lost) are
reported, not enforced: exit 0 whenever every command ran.

The cluster: 2 x rpi5 and 2 x rpi4 (the shipped profiles), 1000 Mbps switched, 0.5 ms latency. Each model is
compiled for latency (`auto`) with `--keep 4 --shifts --fallbacks`: the kept Pareto plans, the boundary shifts
of a pipeline plan and one plan without each device. The run: one warm-up, then --repeat timed requests one at
a time (`--inflight 1`: a request's latency is what is re-costed), every output verified against the whole
model, under `--emulate --dilate K` (K stretches every emulated time so that this host keeps the devices'
timeline), with `--slow DEV=3@50`, DEV being the device with the most predicted compute in the chosen plan.

Per case:
- `predicted`: the chosen plan's latency; `slowed`: its re-costed latency with DEV 3x slower (runtime replay,
  what it would run at without adapting);
- `best kept`: the best plan of the build re-costed so, and its re-costed latency: the target's reference;
- `switch`: the completed request count at which the run switched (from the slow-down at --slow-at);
- `recovered`: requests after the slow-down until the first from which every latency is within 15% of the
  best kept plan's re-costed latency (but for 5% of them: the host is shared); `after`: the median measured
  latency from then on, and its error against that reference; lost requests and the verification.
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
from edgec.runtime.manifest.load import load_alternative, load_fallback, load_manifest
from edgec.runtime.manifest.replay import Drift, replay
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models" / "build"
DEVICES = [{"name": "pi5-a", "profile": "rpi5"}, {"name": "pi5-b", "profile": "rpi5"},
           {"name": "pi4-a", "profile": "rpi4"}, {"name": "pi4-b", "profile": "rpi4"}]
RECOVER_WITHIN = 10  # requests (issue 15)
WITHIN = 0.15  # of the best kept plan's re-costed latency (issue 15)
OUTLIERS = 0.05  # of the requests after recovery may exceed the bound


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def compile_case(folder: Path, model: str) -> Path:
    cluster = folder / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"devices": DEVICES,
                                       "network": {"bandwidth_mbps": 1000, "latency_ms": 0.5, "medium": "switched"}}))
    out = folder / model
    edgec.compile(MODELS / f"{model}.onnx", cluster, out, keep=4, shifts=True, fallbacks=True)
    return out


def kept_plans(build: Path) -> dict[str, object]:
    """{label: manifest} of every plan --adapt chooses among, as `edgec run --adapt` labels them."""
    main = load_manifest(build / "manifest.json")
    plans = {"manifest.json": main}
    plans.update({a.manifest: load_alternative(main, a) for a in main.alternatives})
    plans.update({fb.manifest: load_fallback(main, fb, check_files=False) for fb in main.fallbacks if fb.manifest})
    return plans


def busiest_device(manifest) -> str:
    return max(manifest.device_names, key=lambda d: sum(f.predicted_ms for f in manifest.device_fragments(d)))


def recovered_after(latencies: list[float], slow_at: int, reference: float) -> int | None:
    """Requests after the slow-down until the first one from which every later latency is within WITHIN of
    `reference`, but for OUTLIERS of them (a shared host has its hiccups)."""
    bound = reference * (1 + WITHIN)
    for i in range(slow_at, len(latencies)):
        rest = latencies[i:]
        if rest[0] <= bound and sum(x > bound for x in rest) <= OUTLIERS * len(rest):
            return i - slow_at
    return None


def run_case(build: Path, args) -> dict:
    plans = kept_plans(build)
    main = plans["manifest.json"]
    device = busiest_device(main)
    drift = Drift({device: args.factor})
    recost = {label: replay(m, drift).latency_ms for label, m in plans.items()}
    best = min(recost, key=recost.get)
    report = edgec.run(build, random_inputs=True, verify=True, emulate=True, dilate=args.dilate, repeat=args.repeat,
                       inflight=1, adapt=True, adapt_for="latency", slow={device: (args.slow_at, args.factor)})
    lat = report["latencies_ms"]
    back = recovered_after(lat, args.slow_at, recost[best])
    after = lat[args.slow_at + back:] if back is not None else []
    switches = [a for a in report["adaptations"] if a["switched_at"] is not None]
    return {
        "model": build.name, "slowed_device": device, "factor": args.factor, "slow_at": args.slow_at,
        "predicted_ms": replay(main).latency_ms, "slowed_ms": recost["manifest.json"],
        "best_kept": best, "best_kept_ms": recost[best], "plans": len(plans),
        "before_ms": statistics.median(lat[:args.slow_at]),
        "switches": [{"at": a["switched_at"], "to": a["to"], "reason": a["reason"]} for a in switches],
        "recovered_after": back, "after_ms": statistics.median(after) if after else None,
        "after_error": statistics.median(after) / recost[best] - 1 if after else None,
        "completed": report["completed"], "lost": report["lost"], "verified": report["verify"]["passed"],
        "overruns": len(report["emulation"]["overruns"]), "dilate": args.dilate, "adaptations": report["adaptations"],
    }


def table(rows: list[dict]) -> str:
    out = ["| model | slowed | predicted ms | slowed ms | best kept (re-costed ms) | before ms | switch | recovered "
           "after | after ms (error) | lost | verified | overruns |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sw = ", ".join(f"{s['at']} -> {s['to']}" for s in r["switches"]) or "none"
        rec = "never" if r["recovered_after"] is None else str(r["recovered_after"])
        aft = "-" if r["after_ms"] is None else f"{r['after_ms']:.1f} ({r['after_error']:+.1%})"
        out.append(f"| {r['model']} | {r['slowed_device']} x{r['factor']:g} @ {r['slow_at']} | {r['predicted_ms']:.1f} | "
                   f"{r['slowed_ms']:.1f} | {r['best_kept']} ({r['best_kept_ms']:.1f}) | {r['before_ms']:.1f} | {sw} | "
                   f"{rec} | {aft} | {r['lost']} | {r['verified']} | {r['overruns']} |")
    met = [r for r in rows if r["recovered_after"] is not None and r["recovered_after"] <= RECOVER_WITHIN
           and r["lost"] == 0 and r["verified"]]
    out.append("")
    out.append(f"target (recovered within {RECOVER_WITHIN} requests to within {WITHIN:.0%} of the best kept plan's "
               f"re-costed latency, nothing lost, outputs verified): met by {len(met)} of {len(rows)}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,mobilenetv2,inception_v1,transformer")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--slow-at", type=int, default=50)
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--dilate", type=float, default=3.0)
    ap.add_argument("--folder", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-adapt-") as tmp:
        folder = args.folder or Path(tmp)
        for model in args.models.split(","):
            log(f"{model}: compiling with --keep 4 --shifts --fallbacks")
            build = compile_case(folder, model)
            log(f"{model}: running {args.repeat} requests, slowed at {args.slow_at}")
            rows.append(run_case(build, args))
            log(f"{model}: {rows[-1]['switches']}, recovered after {rows[-1]['recovered_after']}")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
