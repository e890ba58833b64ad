"""ADaPS-style evaluation of the spatial planners: latency and traffic vs EdgeFlow, pruning, search time.

    python tests/bench/bench_spatial.py [--quick]

Predicted figures (compiler.cost.evaluate under the profiles' cost model), not measurements on devices.
Tables go to stdout as markdown, progress to stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

ROOT = Path(__file__).resolve().parents[2]

from edgec.compiler.cluster import ClusterModel, DeviceSpec, load_profile
from edgec.compiler.cost import build_cost_table
from edgec.compiler.cost import evaluate as predict
from edgec.compiler.driver import plan_model
from edgec.compiler.ingest import load_model
from edgec.compiler.layers import build_layer_graph
from edgec.compiler.plan.planner import InfeasibleError, PlanOptions
from edgec.compiler.plan.registry import PLANNERS
from edgec.compiler.plan.spatial import _order, search_hybrid, search_spatial
from edgec.compiler.plan.spatial_search import SpatialSearch
from edgec.compiler.plan.spatial_baselines import bbgrap, deepthings, edgeflow
from edgec.compiler.plan_types import Plan
from edgec.compiler.spatial import spatial_cuts
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

MODELS = ["alexnet", "vgg16", "vgg19", "mobilenetv2", "inception_v1", "resnet50"]
QUICK_MODELS = ["alexnet", "inception_v1", "mobilenetv2"]
LIGHT = {"alexnet": "light_bvlc_alexnet", "vgg19": "light_vgg19", "inception_v1": "light_inception_v1",
         "resnet50": "light_resnet50"}
CLUSTERS = {"1x rpi5 + 1x rpi4": ("rpi5", "rpi4"), "2x rpi5 + 2x rpi4": ("rpi5", "rpi5", "rpi4", "rpi4")}
BANDWIDTHS = (10, 100)
LATENCY_MS = 1.0
SHOWN = ("auto", "spatial", "hybrid", "pipeline", "bbgrap", "bbgrap-halo", "deepthings")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load(name: str):
    built = ROOT / "models" / "build" / f"{name}.onnx"
    light = Path(onnx.__file__).parent / "backend/test/data/light" / f"{LIGHT.get(name, '-')}.onnx"
    path = built if built.is_file() else light if light.is_file() else None
    if path is None:
        log(f"{name}: no models/build/{name}.onnx (run `python -m models build`) and no light zoo file; skipped")
        return None, None
    t = time.perf_counter()
    graph = load_model(path).graph
    log(f"{name}: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}, {len(graph.layers)} layers, "
        f"loaded in {time.perf_counter() - t:.1f}s")
    return graph, path


def make_cluster(kinds, mbps: float) -> ClusterModel:
    profiles = {k: load_profile(k) for k in set(kinds)}
    devs = tuple(DeviceSpec(f"{k}-{i}", profiles[k], profiles[k].memory_mb, None) for i, k in enumerate(kinds))
    return ClusterModel(devs, float(mbps), LATENCY_MS, "switched", {}, "bench")


PIPELINE = ("pipeline", "single", "even", "neurosurgeon")  # the planners of pipeline stages only


def pipeline_plan(name: str, graph, cost) -> Plan:
    return PLANNERS[name](graph, cost, "latency", PlanOptions(top_k=1))[0]


def planners(graph, cost) -> dict:
    out = {
        "edgeflow": lambda: edgeflow(graph, cost),
        "spatial": lambda: search_spatial(graph, cost)[0],
        "hybrid": lambda: search_hybrid(graph, cost)[0],
        "bbgrap": lambda: bbgrap(graph, cost),
        "bbgrap-halo": lambda: bbgrap(graph, cost, sync="halo"),
        "deepthings": lambda: deepthings(graph, cost),
    }
    for name in PIPELINE:
        out[name] = lambda name=name: pipeline_plan(name, graph, cost)
    return out


def evaluate(graph, cost) -> dict:
    """name -> (latency ms, bytes, search seconds); `auto` is the best predicted of all of them."""
    res = {}
    for name, make in planners(graph, cost).items():
        t = time.perf_counter()
        try:
            plan = make()
        except InfeasibleError as exc:
            log(f"  {name}: infeasible ({exc})")
            continue
        seconds = time.perf_counter() - t
        pred = predict(plan, graph, cost)
        res[name] = (pred.latency_ms, pred.bytes_transferred, seconds)
    # auto as `edgec compile` runs it: every planner, the searches bounded by the best plan so far
    t = time.perf_counter()
    chosen, _ = plan_model(graph, cost, "auto", "latency")
    seconds = time.perf_counter() - t
    pred = chosen.prediction
    res["auto"] = (pred.latency_ms, pred.bytes_transferred, seconds, chosen.strategy)
    return res


def never_worse(results: dict) -> tuple[int, int, list[str]]:
    """Cases where auto's plan is predicted no slower than every other planner's (bbgrap-halo included)."""
    ok, bad = 0, []
    for cl, rows in results.items():
        for (model, mbps), res in rows.items():
            others = min(v[0] for k, v in res.items() if k != "auto")
            if res["auto"][0] <= others * (1 + 1e-9):
                ok += 1
            else:
                bad.append(f"{cl} {model} {mbps} Mbps: auto {res['auto'][0]:.2f} ms > {others:.2f} ms")
    return ok, ok + len(bad), bad


def geomean(xs) -> str:
    """Geometric mean, or n/a when a value is 0 (a single-device plan moves no bytes)."""
    if not xs or any(not (x > 0 and math.isfinite(x)) for x in xs):
        return "n/a"
    return f"{math.exp(sum(map(math.log, xs)) / len(xs)):.2f}"


def table_vs_edgeflow(results: dict, index: int, title: str) -> None:
    print(f"\n### {title} (normalised to EdgeFlow; lower is better)\n")
    print("| cluster | model | Mbps | EdgeFlow | " + " | ".join(SHOWN) + " | auto picks |")
    print("|---|---|---|---|" + "---|" * len(SHOWN) + "---|")
    for cl, rows in results.items():
        ratios = {s: [] for s in SHOWN}
        for (model, mbps), res in rows.items():
            ef = res["edgeflow"][index]
            unit = f"{ef:.1f} ms" if index == 0 else f"{ef / 1e6:.2f} MB"
            cells = []
            for s in SHOWN:
                r = res[s][index] / ef if s in res and ef > 0 else float("nan")
                ratios[s].append(r)
                cells.append(f"{r:.2f}")
            print(f"| {cl} | {model} | {mbps} | {unit} | " + " | ".join(cells) + f" | {res['auto'][3]} |")
        print(f"| {cl} | **geomean** | | | " + " | ".join(f"**{geomean(ratios[s])}**" for s in SHOWN) + " | |")


def conv224():
    """One 3x3 convolution, 64 -> 64 channels, 224 x 224 (ADaPS Table 6's single layer)."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(64, 64, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")], "conv224",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 224, 224])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return build_layer_graph(shape_inference.infer_shapes(m))


def table_pruning(devices, thresholds, cap: int) -> None:
    """Partition search for one layer after the scatter: default search (level search + B&B with a
    node budget) and the same B&B run until it proves the optimum (up to `cap` nodes)."""
    graph = conv224()
    print("\n### Pruning (ADaPS Table 6): one 224x224 convolution, half rpi5 / half rpi4, 100 Mbps\n")
    print("| devices | threshold | search space (log10) | visited | pruning factor (log10) | proved optimal | "
          "visited to prove (cap) | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for n in devices:
        kinds = ["rpi5"] * (n // 2) + ["rpi4"] * (n - n // 2)
        cost = build_cost_table(graph, make_cluster(kinds, 100))
        for thr in thresholds:
            row = []
            for budget in (1000, cap):
                s = SpatialSearch(graph, cost, 2, _order(cost, cost.devices[0], cost.devices), spatial_cuts(graph, 2),
                                  [0.0, 0.0], thr, budget)
                t = time.perf_counter()
                s.transition(0, None, 1, float("inf"), 1)
                row.append((s.stats.nodes_visited, s.stats.exact, time.perf_counter() - t, s.space_log10()))
            (v, ex, sec, space), (v2, ex2, _, _) = row
            prove = f"{v2}" if ex2 else f"> {cap}"
            print(f"| {n} | {thr:.0%} | {space:.1f} | {v} | {space - math.log10(max(v, 1)):.1f} | "
                  f"{'yes' if ex else 'no (budget)'} | {prove} | {sec:.2f} |")
            log(f"pruning: {n} devices, threshold {thr:.0%}: {v} nodes")


def table_search_time(times: dict, big: dict) -> None:
    print("\n### Search time per model (seconds; worst of 10 and 100 Mbps)\n")
    print("auto = all planners as `edgec compile` runs them (spatial and hybrid bounded by the best plan so far); "
          "16 devices: 8 x rpi5 + 8 x rpi4 at 100 Mbps.\n")
    cols = [(n, s) for n in (2, 4) for s in ("spatial", "hybrid", "auto")]
    print("| model | " + " | ".join(f"{s}, {n} dev" for n, s in cols) + " | spatial, 16 dev | hybrid, 16 dev |")
    print("|---|" + "---|" * (len(cols) + 2))
    for model, t in times.items():
        cells = [f"{t[c]:.1f}" if c in t else "-" for c in cols]
        cells += [f"{big[model, s]:.1f}" if (model, s) in big else "-" for s in ("spatial", "hybrid")]
        print(f"| {model} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three fast-loading models, fewer pruning cases")
    args = ap.parse_args()
    models = QUICK_MODELS if args.quick else MODELS
    results = {cl: {} for cl in CLUSTERS}
    times: dict = {}
    big: dict = {}
    print(f"# Spatial planners vs EdgeFlow (predicted; link latency {LATENCY_MS} ms, switched network)")
    for model in models:
        graph, _ = load(model)
        if graph is None:
            continue
        times[model] = {}
        for cl, kinds in CLUSTERS.items():
            for mbps in BANDWIDTHS:
                cost = build_cost_table(graph, make_cluster(kinds, mbps))
                res = evaluate(graph, cost)
                results[cl][model, mbps] = res
                for s in ("spatial", "hybrid", "auto"):
                    key = (len(kinds), s)
                    times[model][key] = max(times[model].get(key, 0.0), res[s][2])
                log(f"{model} {cl} {mbps} Mbps: auto={res['auto'][3]} "
                    + " ".join(f"{k}={v[0]:.0f}ms" for k, v in res.items() if k != "auto"))
        if not args.quick:
            cost = build_cost_table(graph, make_cluster(["rpi5"] * 8 + ["rpi4"] * 8, 100))
            for name, plan in (("spatial", search_spatial), ("hybrid", search_hybrid)):
                t = time.perf_counter()
                plan(graph, cost)
                big[model, name] = time.perf_counter() - t
                log(f"{model}: 16-device {name} search {big[model, name]:.1f}s")
    table_vs_edgeflow(results, 0, "Latency")
    ok, total, bad = never_worse(results)
    print(f"\nauto predicted no slower than every other planner: {ok} of {total} cases" + "".join(f"\n- {b}" for b in bad))
    table_vs_edgeflow(results, 1, "Bytes transferred")
    table_search_time(times, big)
    if args.quick:
        table_pruning((2, 4, 8), (0.05, 0.10), 20000)
    else:
        table_pruning((2, 4, 8, 16), (0.05, 0.10, 0.15, 0.20), 100000)


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
