"""compile(): the compiler as one straight-line list of named steps."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

from edgec.runtime.interrupts import check_interrupted

from . import cluster as cluster_mod
from .cost import CostTable, Prediction, build_cost_table, evaluate
from .emit import FallbackBuild, assemble_manifest, build_fragments, fallback_entries, write_output
from .errors import UserError
from .graph import LayerGraph
from .ingest import Ingested, load_model
from .plan.planner import Dominated, InfeasibleError, PlanOptions
from .plan.registry import SEARCHES, STRATEGIES, run_group, schedule
from .plan_types import Plan, Stage
from .progress import Progress

__all__ = ["CompileResult", "Candidate", "PlanOptions", "compile_model", "plan_model", "OBJECTIVES"]

logger = logging.getLogger(__name__)
OBJECTIVES = ("latency", "throughput")


@dataclass(frozen=True)
class Candidate:
    strategy: str
    plan: Plan | None
    prediction: Prediction | None
    error: str | None = None
    runners_up: tuple[tuple[Plan, Prediction], ...] = ()  # the planner's next-best plans (top-K)
    pruned: bool = False  # auto stopped its search: it could not beat another planner's plan


@dataclass(frozen=True)
class CompileResult:
    ingested: Ingested
    cluster: cluster_mod.Cluster
    cost: CostTable
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    manifest: dict
    timings: dict[str, float]
    fallbacks: tuple[FallbackBuild, ...] = ()  # with --fallbacks: one per device the plan uses


def _key(c: Candidate, objective: str) -> tuple:
    p = c.prediction
    main = (p.latency_ms, p.bottleneck_ms) if objective == "latency" else (p.bottleneck_ms, p.latency_ms)
    return (*main, STRATEGIES.index(c.strategy))


def plan_model(graph: LayerGraph, cost: CostTable, strategy: str, objective: str,
               options: PlanOptions = PlanOptions(), progress: Progress = Progress()) -> tuple[Candidate, tuple[Candidate, ...]]:
    """Run the requested planner (all of them for `auto`) and choose the best predicted plan.

    auto is a branch and bound over the registry's planners: the cheap ones run first and the best
    latency so far bounds the searching planners, which run last and share their searches."""
    names = [s for s in STRATEGIES if s != "auto"] if strategy == "auto" else [strategy]
    done: dict[str, Candidate] = {}
    for group in schedule(names):
        check_interrupted()
        searching = all(n in SEARCHES for n in group)
        what = f"searching {' and '.join(group)}" if searching else " and ".join(group)
        progress.status(f"planning: {what}{_best_so_far(done.values(), objective)}")
        t0 = time.perf_counter()
        preds = [c.prediction.latency_ms for c in done.values() if c.prediction is not None]
        bounded = replace(options, incumbent=min(preds, default=math.inf))
        try:
            results = run_group(group, graph, cost, objective, bounded)
        except ValueError as exc:  # an option the planner cannot honour (e.g. a grid larger than the cluster)
            raise UserError(f"--strategy {' '.join(group)}: {exc}") from None
        for n in group:
            done[n] = _candidate(n, graph, cost, results[n])
            progress.note(_planned(done[n], time.perf_counter() - t0))
    candidates = [done[n] for n in names]
    feasible = [c for c in candidates if c.plan is not None]
    if not feasible:
        raise UserError(candidates[0].error, cost.cluster.path)
    return min(feasible, key=lambda c: _key(c, objective)), tuple(candidates)


def _planned(c: Candidate, seconds: float) -> str:
    """One progress line for a planner that finished."""
    if c.prediction is None:
        return f"plan: {c.strategy}: {'pruned' if c.pruned else 'no plan'} ({seconds:.2f}s)"
    return (f"plan: {c.strategy}: latency {c.prediction.latency_ms:.1f} ms, "
            f"throughput {c.prediction.throughput_ips:.2f}/s ({seconds:.2f}s)")


def _best_so_far(done, objective: str) -> str:
    feasible = [c for c in done if c.prediction is not None]
    if not feasible:
        return ""
    best = min(feasible, key=lambda c: _key(c, objective))
    figure = (f"{best.prediction.latency_ms:.1f} ms" if objective == "latency"
              else f"{best.prediction.throughput_ips:.2f}/s")
    return f" (best so far: {best.strategy}, {figure})"


def _candidate(name: str, graph: LayerGraph, cost: CostTable, plans: list[Plan] | InfeasibleError) -> Candidate:
    """A planner's outcome: its best plan and the runners-up, each with its prediction; or why it has none."""
    if isinstance(plans, InfeasibleError):
        return Candidate(name, None, None, str(plans), pruned=isinstance(plans, Dominated))
    preds = [evaluate(p.ensures(graph), graph, cost) for p in plans]
    return Candidate(name, plans[0], preds[0], runners_up=tuple(zip(plans[1:], preds[1:])))


def compile_model(model: str | Path, devices: str | Path, outdir: str | Path, strategy: str = "auto",
                  objective: str = "latency", shapes: dict | None = None,
                  progress: Progress = Progress(), options: PlanOptions = PlanOptions(),
                  fallbacks: bool = False) -> CompileResult:
    """Compile `model` for the cluster in `devices` into `outdir`. With `fallbacks`, also plan the cluster
    without each device the plan uses (same strategy and objective) and write those builds beside it."""
    timings: dict[str, float] = {}
    t = time.perf_counter()

    def step(name: str, then: str | None = None) -> None:
        """`name` finished; `then` starts."""
        check_interrupted()
        nonlocal t
        now = time.perf_counter()
        timings[name] = now - t
        t = now
        progress.note(f"{name}: {timings[name]:.2f}s")
        if then:
            progress.status(then)

    if strategy not in STRATEGIES:
        raise UserError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    if objective not in OBJECTIVES:
        raise UserError(f"unknown objective {objective!r} (choose from {', '.join(OBJECTIVES)})")
    progress.status("reading the cluster")
    cluster = cluster_mod.load_cluster(devices)
    step("cluster", "reading and normalising the model")
    ing = load_model(model, shapes)
    step("ingest", "pricing every layer on every device")
    cost = build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)
    step("cost", "planning")
    chosen, candidates = plan_model(ing.graph, cost, strategy, objective, options, progress)
    step("plan", "building the fragments")
    frags = build_fragments(ing, chosen.plan, chosen.prediction)
    manifest = assemble_manifest(ing, chosen.plan, chosen.prediction, frags, cluster.to_dict(), Path(outdir),
                                 plan_info(chosen, candidates, ing.graph))
    builds: list[FallbackBuild] = []
    if fallbacks:
        step("emit", "planning the fallbacks")
        builds = plan_fallbacks(ing, cluster, manifest, Path(outdir), strategy, objective, options, progress)
        manifest["fallbacks"] = fallback_entries(builds)
        step("fallbacks", f"writing {outdir}")
    else:
        step("emit", f"writing {outdir}")
    write_output(Path(outdir), manifest, frags, builds)
    step("write")
    return CompileResult(ing, cluster, cost, chosen, candidates, manifest, timings, tuple(builds))


def plan_fallbacks(ing: Ingested, cluster: cluster_mod.Cluster, manifest: dict, outdir: Path, strategy: str,
                   objective: str, options: PlanOptions, progress: Progress) -> list[FallbackBuild]:
    """For each device with steps in `manifest`, in cluster order: the build planned for the cluster without
    it, or why there is none (no device left, or none of the rest can hold the model): reported, not fatal."""
    builds = []
    for device in [d for d in cluster.device_names if manifest["steps"].get(d)]:
        check_interrupted()
        progress.status(f"planning without {device}")
        rest = _without(cluster, device)
        if not rest.devices:
            builds.append(FallbackBuild(device, None, error=f"no device is left without {device}"))
            progress.note(f"fallback without {device}: none (no device left)")
            continue
        cost = build_cost_table(ing.graph, rest, ing.sha256, model=ing.model)
        try:  # the planners' own progress lines would read as the main plan's
            chosen, candidates = plan_model(ing.graph, cost, strategy, objective, options, Progress())
        except UserError as exc:
            error = str(exc).removeprefix(f"{exc.path}: ") if exc.path else str(exc)
            builds.append(FallbackBuild(device, None, error=error))
            progress.note(f"fallback without {device}: none ({error})")
            continue
        frags = build_fragments(ing, chosen.plan, chosen.prediction)
        build = FallbackBuild(device, None, tuple(frags))
        data = assemble_manifest(ing, chosen.plan, chosen.prediction, frags, rest.to_dict(), outdir / build.folder,
                                 plan_info(chosen, candidates, ing.graph))
        builds.append(replace(build, manifest=data))
        used = sum(1 for steps in data["steps"].values() if steps)
        progress.note(f"fallback without {device}: {chosen.strategy} on {used} device(s), "
                      f"latency {chosen.prediction.latency_ms:.1f} ms, throughput "
                      f"{chosen.prediction.throughput_ips:.2f}/s")
    return builds


def _without(cluster: cluster_mod.Cluster, device: str) -> cluster_mod.Cluster:
    """The cluster minus one device and its links (the network defaults stay)."""
    return replace(cluster, devices=tuple(d for d in cluster.devices if d.name != device),
                   links={pair: link for pair, link in cluster.links.items() if device not in pair})


def _stage_info(s: Stage, graph: LayerGraph) -> dict:
    info = {"device": s.device, "layers": [s.lo, s.hi], "first_layer": graph.layers[s.lo].name,
            "last_layer": graph.layers[s.hi - 1].name, "spatial": None}
    if s.spatial is not None:
        info["spatial"] = {
            "axis": "height" if s.spatial.axis == 2 else "width",
            "devices": list(s.spatial.devices),
            "segments": [{"layers": [g.lo, g.hi], "tiles": [_tile_info(t) for t in g.tiles]}
                         for g in s.spatial.segments],
        }
    return info


def _tile_info(t) -> dict:
    """A tile's rows, and for a grid tile (DeepThings N x M) its columns too."""
    return {"device": t.device, "rows": [t.start, t.stop]} | ({"cols": list(t.cols)} if t.cols is not None else {})


def plan_info(chosen: Candidate, candidates, graph: LayerGraph) -> dict:
    """The manifest's informational `plan` section: stages and the predicted numbers of every candidate."""
    return {
        "strategy": chosen.strategy,
        "objective": chosen.plan.objective,
        "stages": [_stage_info(s, graph) for s in chosen.plan.stages],
        "candidates": [
            {"strategy": c.strategy, "feasible": c.plan is not None, "pruned": c.pruned, "error": c.error,
             "latency_ms": round(c.prediction.latency_ms, 4) if c.prediction else None,
             "throughput_ips": round(c.prediction.throughput_ips, 4) if c.prediction else None}
            for c in candidates
        ],
        "runners_up": [
            {"stages": [{"device": s.device, "layers": [s.lo, s.hi]} for s in p.stages],
             "latency_ms": round(pr.latency_ms, 4), "throughput_ips": round(pr.throughput_ips, 4)}
            for p, pr in chosen.runners_up
        ],
    }
