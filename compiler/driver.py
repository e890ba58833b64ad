"""compile(): the compiler as one straight-line list of named steps."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

from edgec.runtime.interrupts import check_interrupted

from . import cluster as cluster_mod
from .cost import CostTable, Prediction, build_cost_table, evaluate
from .emit import (ExtraBuild, alternative_build, alternative_folder, assemble_manifest, build_fragments, extra_entries,
                   fallback_build, write_output)
from .errors import UserError
from .graph import LayerGraph
from .ingest import Ingested, load_model
from .plan.frontier import Point, pareto_front, plan_key
from .plan.pipeline_energy import energy_frontier
from .plan.planner import Dominated, EnergyGoal, InfeasibleError, PlanOptions
from .plan.registry import PLANNERS, SEARCHES, STRATEGIES, run_group, schedule
from .plan.shifts import boundary_shifts
from .plan.stats import UNITS, recording
from .plan_types import Plan, Stage
from .progress import Progress
from .units import MiB

__all__ = ["CompileResult", "Candidate", "PlanOptions", "compile_model", "plan_model", "pareto_points", "pareto_info",
           "build_alternatives", "kept_points", "shift_candidates", "OBJECTIVES"]

logger = logging.getLogger(__name__)
OBJECTIVES = ("latency", "throughput", "energy")  # energy: under PlanOptions.energy (an SLA)


@dataclass(frozen=True)
class Candidate:
    strategy: str
    plan: Plan | None
    prediction: Prediction | None
    error: str | None = None
    runners_up: tuple[tuple[Plan, Prediction], ...] = ()  # the planner's next-best plans (top-K)
    pruned: bool = False  # auto stopped its search: it could not beat another planner's plan
    # what its search did (plan/stats.py): {"seconds", "group", "work": {unit: n}, "detail": {...}}; the
    # planners of one group (spatial and hybrid in auto) share their searches, so they share the figures
    stats: dict | None = None
    cost: CostTable | None = None  # what the plan is priced on when it runs devices in power modes; None: the cluster's


@dataclass(frozen=True)
class CompileResult:
    ingested: Ingested
    cluster: cluster_mod.Cluster
    cost: CostTable
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    manifest: dict
    timings: dict[str, float]
    fallbacks: tuple[ExtraBuild, ...] = ()  # with --fallbacks: one per device the plan uses
    pareto: tuple[Point, ...] | None = None  # with --pareto: the non-dominated plans found (plan/frontier.py)
    pareto_energy: bool = False  # whether energy is one of the frontier's axes (every plan's energy known)
    # with --keep N: the best N other plans of the frontier, best first; then with --shifts the boundary shifts
    alternatives: tuple[ExtraBuild, ...] = ()
    alternatives_missing: int = 0  # N minus the --keep plans found


def _key(c: Candidate | Point, objective: str, goal: EnergyGoal | None = None) -> tuple:
    """What orders plans under the objective, best first. Figures equal to 10 significant digits tie (the
    same time summed in another order differs in its last bits), and a tie goes to the plan with fewer
    fragment runs per request (each run pays onnxruntime's per-call cost and splits what it would fuse,
    which the cost model does not price), then to the earlier strategy."""
    p = c.prediction
    if objective == "energy":
        # the energy goal's score (energy, + the soft SLA's penalty), then the faster plan
        main = (goal.score(p.latency_ms, p.energy_mj) if goal else math.inf, p.latency_ms)
    else:
        main = (p.latency_ms, p.bottleneck_ms) if objective == "latency" else (p.bottleneck_ms, p.latency_ms)
    return (*(_tie(x) for x in main), _fragment_runs(c.plan), STRATEGIES.index(c.strategy))


def _tie(x: float) -> float:
    return float(f"{x:.10g}")


def _fragment_runs(plan: Plan) -> int:
    """Fragment runs per request: one per stage, one per tile of each segment of a spatial stage."""
    return sum(1 if s.spatial is None else sum(len(seg.tiles) for seg in s.spatial.segments) for s in plan.stages)


def _choose(feasible: list[Candidate], objective: str, goal: EnergyGoal | None, path: str | None) -> Candidate | None:
    """The best candidate under the objective; None when none meets a hard SLA."""
    best = min(feasible, key=lambda c: _key(c, objective, goal))
    if objective == "energy" and not math.isfinite(_key(best, objective, goal)[0]):
        if best.prediction.energy_mj is None:
            raise UserError(f"--objective energy: {', '.join(best.prediction.energy.unknown)}: no power_w in "
                            "the profile, so the energy of a plan is unknown", path)
        return None
    return best


def _sla_missed(graph: LayerGraph, cost: CostTable, strategy: str, options: PlanOptions) -> UserError:
    """The error of a hard SLA that no plan meets, with the least latency the planners reach: planned again
    for latency, since under the SLA's bound the searches gave up on what they could not bring under it."""
    fastest, _ = plan_model(graph, cost, strategy, "latency", replace(options, energy=None), Progress())
    return UserError(f"no plan meets --sla-ms {options.energy.sla_ms:g}: the fastest plan ({fastest.strategy}) "
                     f"takes {fastest.prediction.latency_ms:.3f} ms", cost.cluster.path)


def plan_model(graph: LayerGraph, cost: CostTable, strategy: str, objective: str,
               options: PlanOptions = PlanOptions(), progress: Progress = Progress()) -> tuple[Candidate, tuple[Candidate, ...]]:
    """Run the requested planner (all of them for `auto`) and choose the best predicted plan.

    auto is a branch and bound over the registry's planners: the cheap ones run first and the best
    latency so far bounds the searching planners, which run last and share their searches."""
    names = [s for s in STRATEGIES if s != "auto"] if strategy == "auto" else [strategy]
    _check_whole_tensors_fit(graph, cost)
    done: dict[str, Candidate] = {}
    for group in schedule(names):
        check_interrupted()
        searching = all(n in SEARCHES for n in group)
        what = f"searching {' and '.join(group)}" if searching else " and ".join(group)
        progress.status(f"planning: {what}{_best_so_far(done.values(), objective)}")
        t0 = time.perf_counter()
        preds = [c.prediction.latency_ms for c in done.values() if c.prediction is not None]
        bounded = replace(options, incumbent=min([options.incumbent, *preds]))  # a caller's bound (allocate: the SLA) holds too
        if options.energy is not None:  # the energy objective's bound (plan/registry.py _energy_group)
            bounded = replace(bounded, incumbent_score=min(
                (_key(c, objective, options.energy)[0] for c in done.values() if c.prediction is not None),
                default=math.inf))
        try:
            with recording() as work:
                results = run_group(group, graph, cost, objective, bounded)
        except ValueError as exc:  # an option the planner cannot honour (e.g. a grid larger than the cluster)
            raise UserError(f"--strategy {' '.join(group)}: {exc}") from None
        seconds = time.perf_counter() - t0
        stats = {"seconds": seconds, "group": list(group), "work": work.get("work", {}), "detail": work.get("detail", {})}
        for n in group:
            done[n] = replace(_candidate(n, graph, cost, results[n], objective, options.energy), stats=stats)
            progress.note(_planned(done[n], seconds))
    candidates = [done[n] for n in names]
    feasible = [c for c in candidates if c.plan is not None]
    if not feasible:
        raise UserError(candidates[0].error, cost.cluster.path)
    chosen = _choose(feasible, objective, options.energy, cost.cluster.path)
    if chosen is None:
        raise _sla_missed(graph, cost, strategy, options)
    return chosen, tuple(candidates)


def _check_whole_tensors_fit(graph: LayerGraph, cost: CostTable) -> None:
    """Every plan holds each model input and output whole on one device (the host sends and receives them
    whole): one too large for every device is refused before any search (a spatial search over the rows
    of such a tensor would take hours to find that no plan fits)."""
    largest = max(cost.cluster.devices, key=lambda d: d.usable_bytes)
    for role, names in (("input", graph.inputs), ("output", graph.outputs)):
        for t in names:
            nbytes = graph.tensors[t].nbytes
            if nbytes > largest.usable_bytes:
                raise UserError(f"model {role} {t!r} takes {nbytes / MiB:,.0f} MB, more than any device can hold "
                                f"(the most: {largest.name}, {largest.usable_bytes / MiB:,.0f} MB usable); every plan "
                                "holds the model's inputs and outputs whole on one device", cost.cluster.path)


def _planned(c: Candidate, seconds: float) -> str:
    """One progress line for a planner that finished: its plan, its time and its work (plan/stats.py)."""
    work = (c.stats or {}).get("work", {})
    spent = ", ".join([f"{seconds:.2f}s", *(f"{work[u]:,} {u if work[u] != 1 else u[:-1]}" for u in UNITS if u in work)])
    if c.prediction is None:
        return f"plan: {c.strategy}: {'pruned' if c.pruned else 'no plan'} ({spent})"
    return (f"plan: {c.strategy}: latency {c.prediction.latency_ms:.1f} ms, "
            f"throughput {c.prediction.throughput_ips:.2f}/s ({spent})")


def _best_so_far(done, objective: str) -> str:
    feasible = [c for c in done if c.prediction is not None]
    if not feasible:
        return ""
    best = min(feasible, key=lambda c: _key(c, objective))
    figure = (f"{best.prediction.throughput_ips:.2f}/s" if objective == "throughput"
              else f"{best.prediction.latency_ms:.1f} ms")
    return f" (best so far: {best.strategy}, {figure})"


def _candidate(name: str, graph: LayerGraph, cost: CostTable, plans: list[Plan] | InfeasibleError, objective: str,
               goal: EnergyGoal | None = None) -> Candidate:
    """A planner's outcome: its best plan and the runners-up, each with its prediction; or why it has none.

    The plans come best first under the planner's own model (the pipeline DP's: each stage's compute and each
    cut's transfer), and are ordered again by their predictions (`_key`, stable): `evaluate` also prices what
    the DP leaves out, such as the CPU that the messages of devices sharing a machine take of its cores. So
    of the planner's top-K the plan predicted best is the one chosen (MobileNetV2 on two workers of this
    machine, 2026-11-27: the DP put its first plan's cut after a 588 KB tensor, predicted at 336/s, and its
    third after a 98 KB one, predicted at 367/s)."""
    if isinstance(plans, InfeasibleError):
        return Candidate(name, None, None, str(plans), pruned=isinstance(plans, Dominated))
    costs = [_priced_on(p, cost) for p in plans]
    ranked = sorted(((p, evaluate(p.ensures(graph), graph, c), c) for p, c in zip(plans, costs)),
                    key=lambda t: _key(Point(name, t[0], t[1]), objective, goal))
    (plan, pred, first_cost), rest = ranked[0], ranked[1:]
    return Candidate(name, plan, pred, runners_up=tuple((p, pr) for p, pr, _ in rest),
                     cost=first_cost if first_cost is not cost else None)


def _priced_on(plan: Plan, cost: CostTable) -> CostTable:
    """The cost table a plan runs on: the cluster's, or with devices in the power modes it needs."""
    modes = dict(plan.modes)
    return cost.with_modes(modes) if modes else cost


def compile_model(model: str | Path, devices: str | Path, outdir: str | Path, strategy: str = "auto",
                  objective: str = "latency", shapes: dict | None = None,
                  progress: Progress = Progress(), options: PlanOptions = PlanOptions(),
                  fallbacks: bool = False, pareto: bool = False, keep: int | None = None,
                  shifts: bool = False) -> CompileResult:
    """Compile `model` for the cluster in `devices` into `outdir`. With `fallbacks`, also plan the cluster
    without each device the plan uses (same strategy and objective) and write those builds beside it. With
    `pareto`, also collect the non-dominated plans of every planner run (`pareto_points`). With `keep` N,
    also write the best N other plans of that frontier as alternative builds (`build_alternatives`); with
    `shifts`, also the chosen plan's one-layer boundary shifts (plan/shifts.py), numbered after them."""
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
    if (objective == "energy") != (options.energy is not None):
        raise UserError("--objective energy needs --sla-ms" if objective == "energy"
                        else f"--sla-ms, --sla-soft and --lambda apply to --objective energy, not {objective}")
    progress.status("reading the cluster")
    cluster = cluster_mod.load_cluster(devices)
    step("cluster", "reading and normalising the model")
    ing = load_model(model, shapes)
    step("ingest", "pricing every layer on every device")
    cost = build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)
    step("cost", "planning")
    chosen, candidates = plan_model(ing.graph, cost, strategy, objective, options, progress)
    front: tuple[Point, ...] = ()
    with_energy = False
    if pareto or keep:
        step("plan", "collecting the Pareto frontier")
        points, with_energy = pareto_front(pareto_points(ing.graph, cost, chosen, candidates, objective, options))
        front = tuple(points)
        progress.note(f"pareto: {len(front)} non-dominated plan(s)")
        step("pareto", "building the fragments")
    else:
        step("plan", "building the fragments")
    frags = build_fragments(ing, chosen.plan, chosen.prediction)
    manifest = assemble_manifest(ing, chosen.plan, chosen.prediction, frags, _run_on(chosen, cluster).to_dict(), Path(outdir),
                                 plan_info(chosen, candidates, ing.graph))
    done = "emit"  # the step that ends next
    alts: list[ExtraBuild] = []
    if keep or shifts:
        step(done, "building the alternatives")
        alts = build_alternatives(ing, cluster, cost, chosen, candidates, front, keep, objective, options, Path(outdir),
                                  shifts)
        manifest["alternatives"] = extra_entries(alts)
        _note_alternatives(progress, alts, keep, shifts)
        done = "alternatives"
    builds: list[ExtraBuild] = []
    if fallbacks:
        step(done, "planning the fallbacks")
        builds = plan_fallbacks(ing, cluster, manifest, Path(outdir), strategy, objective, options, progress)
        manifest["fallbacks"] = extra_entries(builds)
        done = "fallbacks"
    step(done, f"writing {outdir}")
    write_output(Path(outdir), manifest, frags, alts + builds)
    step("write")
    return CompileResult(ing, cluster, cost, chosen, candidates, manifest, timings, tuple(builds),
                         front if pareto else None, with_energy, tuple(alts), keep - _kept_count(alts) if keep else 0)


def build_alternatives(ing: Ingested, cluster: cluster_mod.Cluster, cost: CostTable, chosen: Candidate, candidates,
                       front, keep: int | None, objective: str, options: PlanOptions, outdir: Path,
                       shifts: bool = False) -> list[ExtraBuild]:
    """The alternative builds, OUTDIR/alt-1/ on: first the `keep` best plans of the frontier other than the
    chosen one (`kept_points`), then, with `shifts`, the chosen plan's boundary shifts (`shift_candidates`)
    that are none of those. Each is a complete build, its devices in the power modes it needs."""
    kept = [_alternative(p.strategy, p.plan, p.prediction, _priced_on(p.plan, cost), cost)
            for p in kept_points(chosen, front, keep or 0, objective, options)]
    alts: list[tuple[Candidate, str | None]] = [(c, None) for c in kept]
    if shifts:
        alts += shift_candidates(ing.graph, cost, chosen, [c.plan for c in kept])
    builds = []
    for k, (alt, variant) in enumerate(alts, 1):
        check_interrupted()
        frags = build_fragments(ing, alt.plan, alt.prediction)
        data = assemble_manifest(ing, alt.plan, alt.prediction, frags, _run_on(alt, cluster).to_dict(),
                                 outdir / alternative_folder(k), plan_info(alt, candidates, ing.graph))
        builds.append(alternative_build(k, data, frags, variant))
    return builds


def kept_points(chosen: Candidate, front, keep: int, objective: str, options: PlanOptions) -> list[Point]:
    """The first `keep` plans of the frontier other than the chosen one, best first by the objective's own
    order (_key). Under a hard SLA only plans within it qualify: the SLA is the operator's, whichever plan runs."""
    goal = options.energy
    ranked = sorted((p for p in front if plan_key(p.plan) != plan_key(chosen.plan)),
                    key=lambda p: _key(p, objective, goal))
    return [p for p in ranked if math.isfinite(_key(p, objective, goal)[0])][:keep]


def _alternative(strategy: str, plan: Plan, prediction: Prediction, priced: CostTable, cost: CostTable) -> Candidate:
    """A plan to build as an alternative, priced on `priced`: the cluster's table `cost`, or one with the
    devices in the power modes the plan needs (which its build records)."""
    return Candidate(strategy, plan, prediction, cost=priced if priced is not cost else None)


def shift_candidates(graph: LayerGraph, cost: CostTable, chosen: Candidate,
                     kept: list[Plan]) -> list[tuple[Candidate, str]]:
    """The chosen plan's boundary shifts (plan/shifts.py) that are none of the `kept` plans, each priced on
    the chosen plan's table (a shift keeps its power modes), with its description. Unlike --keep's plans,
    a shift predicted beyond a hard SLA stays: it is meant for when the predicted figures no longer hold."""
    priced = _priced_on(chosen.plan, cost)
    out = []
    for shift in boundary_shifts(chosen.plan, graph, priced, kept):
        check_interrupted()
        out.append((_alternative(chosen.strategy, shift.plan, evaluate(shift.plan, graph, priced), priced, cost),
                    shift.description))
    return out


def _note_alternatives(progress: Progress, alts: list[ExtraBuild], keep: int | None, shifts: bool) -> None:
    for b in alts:
        pred = b.info["predicted"]
        what = b.info.get("variant") or b.info["strategy"]
        progress.note(f"alternative {b.folder}: {what}, latency {pred['latency_ms']:.1f} ms, "
                      f"throughput {pred['throughput_ips']:.2f}/s")
    kept = _kept_count(alts)
    if keep and kept < keep:
        progress.note(f"--keep {keep}: only {kept} other plan(s) of the frontier qualify (within any hard SLA); wrote those")
    if shifts and kept == len(alts):
        progress.note("--shifts: no boundary shift qualifies (the chosen plan needs two neighbouring stages that "
                      "are not spatial, and a shifted plan must fit memory and differ from the plans kept)")


def _kept_count(alts: list[ExtraBuild]) -> int:
    """How many of the alternative builds are --keep's plans (the rest are --shifts' variants)."""
    return sum(1 for b in alts if "variant" not in b.info)


def pareto_points(graph: LayerGraph, cost: CostTable, chosen: Candidate, candidates, objective: str,
                  options: PlanOptions) -> list[Point]:
    """Every plan the planners found, the chosen one first: each candidate's plan and its runners-up and,
    when the pipeline planner ran, its optimum for each objective the run did not plan for (the pipeline DP
    is exact and cheap, so the frontier holds the latency- and the throughput-optimal pipeline plans
    whatever the objective) and, under the energy objective, the energy DP's own frontier."""
    points = [Point(chosen.strategy, chosen.plan, chosen.prediction)]
    for c in candidates:
        if c.plan is not None:
            points += [Point(c.strategy, c.plan, c.prediction)] + [Point(c.strategy, p, pr) for p, pr in c.runners_up]
    if not any(c.strategy == "pipeline" for c in candidates):
        return points
    timing = replace(options, energy=None, incumbent=math.inf, incumbent_score=math.inf, top_k=1)
    extra: list[Plan] = []
    for other in ("latency", "throughput"):
        if other != objective:
            with contextlib.suppress(InfeasibleError):  # the candidates already say why no pipeline plan fits
                extra += PLANNERS["pipeline"](graph, cost, other, timing)
    if options.energy is not None:
        with contextlib.suppress(InfeasibleError):  # a device without power figures: the candidates say so
            extra += energy_frontier(graph, cost, options.energy)
    for plan in extra:
        priced = _priced_on(plan, cost)
        points.append(Point("pipeline", plan, evaluate(plan, graph, priced)))
    return points


def plan_fallbacks(ing: Ingested, cluster: cluster_mod.Cluster, manifest: dict, outdir: Path, strategy: str,
                   objective: str, options: PlanOptions, progress: Progress) -> list[ExtraBuild]:
    """For each device with steps in `manifest`, in cluster order: the build planned for the cluster without
    it, or why there is none (no device left, or none of the rest can hold the model): reported, not fatal."""
    builds = []
    for device in [d for d in cluster.device_names if manifest["steps"].get(d)]:
        check_interrupted()
        progress.status(f"planning without {device}")
        rest = _without(cluster, device)
        if not rest.devices:
            builds.append(fallback_build(device, error=f"no device is left without {device}"))
            progress.note(f"fallback without {device}: none (no device left)")
            continue
        cost = build_cost_table(ing.graph, rest, ing.sha256, model=ing.model)
        try:  # the planners' own progress lines would read as the main plan's
            chosen, candidates = plan_model(ing.graph, cost, strategy, objective, options, Progress())
        except UserError as exc:
            error = str(exc).removeprefix(f"{exc.path}: ") if exc.path else str(exc)
            builds.append(fallback_build(device, error=error))
            progress.note(f"fallback without {device}: none ({error})")
            continue
        frags = build_fragments(ing, chosen.plan, chosen.prediction)
        folder = fallback_build(device).folder
        data = assemble_manifest(ing, chosen.plan, chosen.prediction, frags, _run_on(chosen, rest).to_dict(), outdir / folder,
                                 plan_info(chosen, candidates, ing.graph))
        builds.append(fallback_build(device, data, frags))
        used = sum(1 for steps in data["steps"].values() if steps)
        progress.note(f"fallback without {device}: {chosen.strategy} on {used} device(s), "
                      f"latency {chosen.prediction.latency_ms:.1f} ms, throughput "
                      f"{chosen.prediction.throughput_ips:.2f}/s")
    return builds


def _run_on(chosen: Candidate, cluster: cluster_mod.Cluster) -> cluster_mod.Cluster:
    """The cluster as the chosen plan runs it: its devices in the power modes the plan needs."""
    return cluster if chosen.cost is None else chosen.cost.cluster


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


def pareto_info(front, with_energy: bool, graph: LayerGraph) -> dict:
    """compile --pareto's `--json` keys: the frontier, sorted by latency, each plan's stages as in `stages`
    (and the power modes it runs devices in), and the axes it is taken over: energy only when every plan's
    energy is known, which `pareto_energy_unknown` says."""
    points = [{"strategy": p.strategy, "stages": [_stage_info(s, graph) for s in p.plan.stages],
               "modes": dict(p.plan.modes),
               "predicted_latency_ms": round(p.latency_ms, 4),
               "predicted_throughput_ips": round(p.throughput_ips, 4),
               "predicted_energy_mj": None if p.energy_mj is None else round(p.energy_mj, 4)} for p in front]
    axes = ["latency_ms", "throughput_ips"] + (["energy_mj"] if with_energy else [])
    return {"pareto": points, "pareto_axes": axes, "pareto_energy_unknown": not with_energy}
