"""bench_fidelity's part stability: `edgec profile --threads 1` twice back to back, figure by figure, and what
each profile of the pair predicts.

Part stability: `edgec profile --threads 1` twice back to back; per 1-thread figure (gflops.conv, .depthwise_conv,
.gemm, .other, memory_gbps, weight_gbps, op_overhead_us and each op price, op_ms_per_melem.*) the two values and their
relative difference (second - first) / first, and the worst.  The tile-efficiency points (efficiency.conv,
.depthwise_conv and .gemm, fractions per output size) are listed too, with their own worst, outside the target.  So
are the profile's `runtime:` figures (message_ms, message_ms_per_mb, request_ms, run_ms and their CPU twins: the
runtime's own costs, timed through worker processes), counted apart: on 2026-11-26, in each of six pairs of
back-to-back profiles, 2 to 5 of them were more than 10% apart.  The load around each profile is printed, and its
memory rate in the first and second half of its pass (measurement.memory_drift, profile/drift.py): the four halves of a
pair show whether the machine's memory rate held over it (within 10%) or moved, as it does on this VM from minute to
minute, under the DRAM figures (memory_gbps, weight_gbps, gemm_weight_gbps, shared_weight_gbps).  Then what
each profile of the pair predicts for --two-models (`pair_predictions`: the one-device latency, and part two's
pipeline and spatial plans, each compiled with each profile), side by side: what a figure's difference does to a
plan's prediction. Target: every figure of the first group within 10%, on a quiet machine. --pairs N takes N such
pairs one after another (the JSON's "stability" is the first, "stability_pairs" all of them) and says in how many the
target was met, with each pair's worst figure and how far apart its memory halves lay, and in how many of the pairs
whose memory rate held.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from fidelity_common import (cluster, compile_json, loadavg, log, metric_unit, model_path, one_thread_figures,
                             profile_host, profile_load)

PROFILE_TOLERANCE = 0.10  # issue 11's target


# The groups of a profile's figures in part stability: the micro-benchmark figures the target counts, and two
# groups listed and counted apart (STABILITY_GROUPS: their marks and what the summary calls them).
TARGET, EFFICIENCY, RUNTIME = "target", "efficiency", "runtime"
STABILITY_GROUPS = {TARGET: ("", "figures in the target"), EFFICIENCY: (" *", "tile-efficiency points"),
                    RUNTIME: (" +", "runtime figures")}


def flat_figures(figures: dict, runtime: dict | None = None, shared: float | None = None
                 ) -> dict[str, tuple[float, str]]:
    """A profile's per-thread figures by name: value, and its group (the stability target counts TARGET; the
    tile efficiency points and the profile's `runtime:` figures, when given, are listed apart); `shared`: its
    (top-level) shared_weight_gbps, a micro-benchmark figure like weight_gbps."""
    out = {"op_overhead_us": (figures["op_overhead_us"], TARGET), "memory_gbps": (figures["memory_gbps"], TARGET)}
    for key in ("weight_gbps", "gemm_weight_gbps"):
        if key in figures:
            out[key] = (figures[key], TARGET)
    if shared is not None:
        out["shared_weight_gbps"] = (shared, TARGET)
    out |= {f"gflops.{k}": (v, TARGET) for k, v in figures["gflops"].items()}
    out |= {f"op_ms_per_melem.{k}": (v, TARGET) for k, v in (figures.get("op_ms_per_melem") or {}).items()}
    for kind, points in (figures.get("efficiency") or {}).items():
        out |= {f"efficiency.{kind}@{elems}": (frac, EFFICIENCY) for elems, frac in points}
    out |= {f"runtime.{k}": (v, RUNTIME) for k, v in (runtime or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0}
    return out


# What part stability predicts with each profile of a pair: (plan label, devices, compile flags).
STABILITY_PLANS = (("single", 1, ()),
                   ("pipeline/throughput", 2, ("--strategy", "pipeline", "--objective", "throughput")),
                   ("spatial/latency", 2, ("--strategy", "spatial")))


def pair_predictions(folder: Path, profiles: list[Path], models: list[str], tag: str = "") -> list[dict]:
    """What the two profiles of a pair predict, side by side: for each of `models`, its one-device latency and
    two-device pipeline (throughput objective: latency and throughput) and spatial (latency) plans, each
    compiled with each profile (part two's clusters; the planner may choose other stages under each).  The
    figures that matter are the predictions: a figure of a few microseconds that moves by a third may move
    no prediction."""
    got = []
    for i, profile in enumerate(profiles, 1):
        clusters = {n: cluster(folder, f"stability-{tag}{i}-{n}dev", profile, n) for n in (1, 2)}
        preds = {}
        for name in models:
            for plan, n, flags in STABILITY_PLANS:
                out = folder / f"stability-{tag}{i}-{name}-{plan.replace('/', '-')}"
                preds[(name, plan)] = compile_json(model_path(name), clusters[n], out, *flags)
                shutil.rmtree(out)
        got.append(preds)
    rows = []
    for (name, plan), first in got[0].items():
        second = got[1][(name, plan)]
        metrics = ["latency"] + (["throughput"] if "throughput" in plan else [])
        for metric in metrics:
            key = "predicted_latency_ms" if metric == "latency" else "predicted_throughput_ips"
            rows.append({"model": name, "plan": plan, "metric": metric, "first": first[key], "second": second[key],
                         "difference": (second[key] - first[key]) / first[key],
                         "same_stages": first["stages"] == second["stages"]})
    return rows


def bench_stability(folder: Path, tag: str = "", models: list[str] = ()) -> dict:
    """One pair of back-to-back profiles (`tag` names their files: stability-<tag><1|2>.yaml), and what each
    predicts for `models` (`pair_predictions`)."""
    runs = []
    for i in (1, 2):
        path = folder / f"stability-{tag}{i}.yaml"
        log(f"stability{' ' + tag.rstrip('-') if tag else ''}: edgec profile --threads 1, {i} of 2 "
            f"(load average {loadavg()})")
        around = profile_host(path)
        doc = yaml.safe_load(path.read_text())
        runs.append({"profile": str(path), "around": around, **profile_load(doc),
                     "figures": flat_figures(one_thread_figures(doc, path), doc.get("runtime"),
                                                       doc.get("shared_weight_gbps"))})
    first, second = runs[0]["figures"], runs[1]["figures"]
    rows = [{"figure": k, "first": first[k][0], "second": second[k][0], "group": first[k][1],
             "in_target": first[k][1] == TARGET,
             "difference": (second[k][0] - first[k][0]) / first[k][0]}
            for k in first if k in second]
    missing = sorted(set(first) ^ set(second))
    for r in runs:
        del r["figures"]  # the rows hold them
    log(f"stability: what each profile predicts for {', '.join(models)}")
    predictions = pair_predictions(folder, [Path(r["profile"]) for r in runs], list(models), tag) if models else []
    return {"runs": runs, "rows": rows, "missing": missing, "predictions": predictions,
            "memory": pair_memory(runs)}


def pair_memory(runs: list[dict]) -> dict | None:
    """The machine's memory rate over a pair: each profile's memory_gbps rounds in the first and the second half
    of its 1-thread pass (measurement.memory_drift, profile/drift.py), and how far apart the extremes of the four
    lie (max / min - 1); held: within PROFILE_TOLERANCE.  None where a profile has none (an older edgec)."""
    drifts = [(r.get("memory_drift") or {}).get(1) for r in runs]
    if not all(drifts):
        return None
    halves = [g for d in drifts for g in (d["first_gbps"], d["second_gbps"])]
    moved = max(halves) / min(halves) - 1
    return {"halves_gbps": halves, "moved": round(moved, 4), "held": moved <= PROFILE_TOLERANCE}


def stability_text(s: dict) -> str:
    lines = []
    for i, r in enumerate(s["runs"], 1):
        a = r["around"]
        lines.append(f"- profile {i}: {a['seconds']} s, load average {a['before']} before, {a['after']} after; "
                     f"other processes used {r['other_cpus_before']} CPUs before and {r['other_cpus_during']} during "
                     f"(verdict {r['verdict']}); timing spread median {r['median_spread']}, worst {r['max_spread']}, "
                     f"unstable {len(r['unstable'])}"
                     + "".join(f"; shared_weight_gbps {k} {'n/a' if v is None else f'{v:g}'}"
                               for k, v in (r.get("shared_pairs") or {}).items())
                     + (f"; memory rate {r['memory_drift'][1]['first_gbps']:g} GB/s in the first half of its pass, "
                        f"{r['memory_drift'][1]['second_gbps']:g} in the second"
                        if (r.get("memory_drift") or {}).get(1) else ""))
    if s.get("memory"):
        mem = s["memory"]
        lines.append(f"- the machine's memory rate over the pair (the four halves): "
                     f"{min(mem['halves_gbps']):g}-{max(mem['halves_gbps']):g} GB/s, {mem['moved']:.1%} apart: "
                     + ("held" if mem["held"] else f"moved by more than {PROFILE_TOLERANCE:.0%}, not a quiet machine "
                        "for the DRAM figures"))
    lines += ["", "| figure (1 thread) | first | second | difference |", "|---|---:|---:|---:|"]
    for r in s["rows"]:
        flag = "" if abs(r["difference"]) <= PROFILE_TOLERANCE else " (over)"
        lines.append(f"| {r['figure']}{STABILITY_GROUPS[r['group']][0]} | {r['first']:g} | {r['second']:g} | "
                     f"{r['difference']:+.1%}{flag} |")
    lines.append("\n\\* tile efficiency, outside the target; + the runtime's own costs (messages, requests and a "
                 "fragment's run between local workers, timed through worker processes), counted apart")
    for group, (_, what) in STABILITY_GROUPS.items():
        rows = [r for r in s["rows"] if r["group"] == group]
        if rows:
            worst = group_worst(s, group)
            over = sum(abs(r["difference"]) > PROFILE_TOLERANCE for r in rows)
            lines.append(f"{what}: worst {worst['figure']} {worst['difference']:+.1%}; {over} of {len(rows)} differ by "
                         f"more than {PROFILE_TOLERANCE:.0%}"
                         + (f" (target: all within {PROFILE_TOLERANCE:.0%}: {'met' if not over else 'NOT met'})"
                            if group == TARGET else ""))
    if s["missing"]:
        lines.append(f"figures in only one of the two profiles: {', '.join(s['missing'])}")
    if s["predictions"]:
        lines += ["", "What each profile predicts (edgec compile, part two's clusters):", "",
                  "| model | plan | metric | first | second | difference |", "|---|---|---|---:|---:|---:|"]
        for r in s["predictions"]:
            unit = metric_unit(r["metric"])
            plan = r["plan"] + ("" if r["same_stages"] else " (other stages)")
            lines.append(f"| {r['model']} | {plan} | {r['metric']} "
                         f"| {r['first']:.2f} {unit} | {r['second']:.2f} {unit} | {r['difference']:+.1%} |")
        worst = max(s["predictions"], key=lambda r: abs(r["difference"]))
        over = sum(abs(r["difference"]) > PROFILE_TOLERANCE for r in s["predictions"])
        lines.append(f"predictions: worst {worst['model']} {worst['plan']} {worst['metric']} "
                     f"{worst['difference']:+.1%}; {over} of {len(s['predictions'])} differ by more than "
                     f"{PROFILE_TOLERANCE:.0%}")
    return "\n".join(lines)


def group_worst(s: dict, group: str) -> dict:
    """The pair's row of `group` that differs most."""
    return max((r for r in s["rows"] if r["group"] == group), key=lambda r: abs(r["difference"]))


def pairs_summary(pairs: list[dict]) -> str:
    """--pairs N: in how many pairs every figure of the target agreed within the tolerance, and each pair's worst."""
    worst = [group_worst(s, TARGET) for s in pairs]
    ok = [abs(w["difference"]) <= PROFILE_TOLERANCE for w in worst]
    held = [bool(s.get("memory") and s["memory"]["held"]) for s in pairs]
    line = (f"Pairs: the target (every figure of the first group within {PROFILE_TOLERANCE:.0%}) met in {sum(ok)} "
            f"of {len(pairs)}; each pair's worst: "
            + ", ".join(f"{w['figure']} {w['difference']:+.1%}"
                        + ("" if not s.get("memory") else f" (memory rate {s['memory']['moved']:.1%} apart)")
                        for w, s in zip(worst, pairs)) + ".")
    if any(s.get("memory") for s in pairs):
        quiet = [k for k, h in enumerate(held) if h]
        line += (f" In the {len(quiet)} pair{'s' if len(quiet) != 1 else ''} whose memory rate held within "
                 f"{PROFILE_TOLERANCE:.0%} (a quiet machine for the DRAM figures): met in "
                 f"{sum(ok[k] for k in quiet)} of {len(quiet)}.")
    return line
