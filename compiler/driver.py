"""compile(): the compiler as one straight-line list of named steps."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from edgec.runtime.interrupts import check_interrupted
from edgec.runtime.manifest.types import OBJECTIVES  # the plan objectives the manifest format knows

from . import cluster as cluster_mod
from .cost import CostTable, build_cost_table, generate_cost, generative_table, int8_fallbacks
from .emit import (ExtraBuild, alternative_build, alternative_folder, assemble_manifest, build_fragments, extra_entries,
                   fallback_build, write_output)
from .emit.state import fragment_shapes, generative_manifest
from .errors import UserError
from .ingest import Ingested, load_model
from .ingest.phases import GenerateOptions, Phases, load_phases
from .plan.choose import (Candidate, alternative_candidate, kept_points, pareto_points, plan_model, priced_on,
                          shift_candidates)
from .plan.frontier import Point, pareto_front
from .plan.placeable import unplaceable
from .plan.planner import PlanOptions
from .plan.registry import STRATEGIES
from .plan.views import plan_sections
from .progress import Progress

__all__ = ["CompileResult", "compile_model", "build_alternatives", "plan_fallbacks", "OBJECTIVES", "GenerateOptions"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileResult:
    ingested: Ingested
    cluster: cluster_mod.ClusterModel
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


def compile_model(model: str | Path, devices: str | Path, outdir: str | Path, strategy: str = "auto",
                  objective: str = "latency", shapes: dict | None = None,
                  progress: Progress = Progress(), options: PlanOptions = PlanOptions(),
                  fallbacks: bool = False, pareto: bool = False, keep: int | None = None,
                  shifts: bool = False, generate: GenerateOptions | None = None) -> CompileResult:
    """Compile `model` for the cluster in `devices` into `outdir`. With `fallbacks`, also plan the cluster
    without each device the plan uses (same strategy and objective) and write those builds beside it. With
    `pareto`, also collect the non-dominated plans of every planner run (`pareto_points`). With `keep` N,
    also write the best N other plans of that frontier as alternative builds (`build_alternatives`); with
    `shifts`, also the chosen plan's one-layer boundary shifts (plan/shifts.py), numbered after them. With
    `generate`, a generative build: the model's caches found, a decode step planned with the prefill priced
    too (ingest/phases.py, cost/generate.py), the manifest with its state (emit/state.py)."""
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
    if generate is not None:
        _check_generative(objective, shapes, fallbacks, pareto, keep, shifts)
    progress.status("reading the cluster")
    cluster = cluster_mod.load_cluster(devices)
    step("cluster", "reading and normalising the model")
    phases = None if generate is None else load_phases(model, generate)
    ing = load_model(model, shapes) if phases is None else phases.decode
    step("ingest", "pricing every layer on every device")
    cost = _price(ing, phases, cluster)
    reason = unplaceable(ing.graph, cost)  # before any search: a model no plan can fit (plan/placeable.py)
    if reason is not None:
        raise UserError(f"{reason} (devices: {devices})", model)
    float_priced = int8_fallbacks(ing.graph, cluster)  # devices whose profiles lack an int8 class it uses
    if float_priced:
        missing = sorted({c for classes in float_priced.values() for c in classes})
        progress.note(f"int8 layers on {', '.join(float_priced)}: no gflops.{', gflops.'.join(missing)} in their "
                      "profiles, priced at the float classes' figures")
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
    frags = build_fragments(ing, chosen.plan, chosen.prediction, None if phases is None else fragment_shapes(phases))
    manifest = _assemble(ing, chosen, candidates, frags, _run_on(chosen, cluster), Path(outdir), phases)
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
        builds = plan_fallbacks(ing, cluster, manifest, Path(outdir), strategy, objective, options, progress, phases)
        manifest["fallbacks"] = extra_entries(builds)
        done = "fallbacks"
    step(done, f"writing {outdir}")
    write_output(Path(outdir), manifest, frags, alts + builds)
    step("write")
    return CompileResult(ing, cluster, cost, chosen, candidates, manifest, timings, tuple(builds),
                         front if pareto else None, with_energy, tuple(alts), keep - _kept_count(alts) if keep else 0)


def _price(ing: Ingested, phases: Phases | None, cluster: cluster_mod.ClusterModel) -> CostTable:
    """The cost table of `ing` on `cluster`; of a generative build (`phases`), a decode step's, with the
    prefill, the caches and the token beside it (cost/generate.py)."""
    cost = build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)
    if phases is None:
        return cost
    prefill = build_cost_table(phases.prefill.graph, cluster, ing.sha256, model=phases.prefill.model)
    return generative_table(cost, generate_cost(phases, cost, prefill))


def _check_generative(objective: str, shapes: dict | None, fallbacks: bool, pareto: bool, keep: int | None,
                      shifts: bool) -> None:
    """What --generate does not take (yet): one line naming the option."""
    if objective == "energy":
        raise UserError("--objective energy does not apply to --generate (plan for latency: time per output "
                        "token, or throughput: tokens per second)")
    if shapes:
        raise UserError("--shape does not apply to --generate: the phases pin the dynamic dimensions "
                        "(--prompt-len, --max-context)")
    for flag, given in (("--pareto", pareto), ("--keep", keep), ("--shifts", shifts)):
        if given:
            raise UserError(f"{flag} does not apply to --generate yet")


def build_alternatives(ing: Ingested, cluster: cluster_mod.ClusterModel, cost: CostTable, chosen: Candidate, candidates,
                       front, keep: int | None, objective: str, options: PlanOptions, outdir: Path,
                       shifts: bool = False) -> list[ExtraBuild]:
    """The alternative builds, OUTDIR/alt-1/ on: first the `keep` best plans of the frontier other than the
    chosen one (`kept_points`), then, with `shifts`, the chosen plan's boundary shifts (`shift_candidates`)
    that are none of those. Each is a complete build, its devices in the power modes it needs."""
    kept = [alternative_candidate(p.strategy, p.plan, p.prediction, priced_on(p.plan, cost), cost)
            for p in kept_points(chosen, front, keep or 0, objective, options)]
    alts: list[tuple[Candidate, str | None]] = [(c, None) for c in kept]
    if shifts:
        alts += shift_candidates(ing.graph, cost, chosen, [c.plan for c in kept])
    builds = []
    for k, (alt, variant) in enumerate(alts, 1):
        check_interrupted()
        frags = build_fragments(ing, alt.plan, alt.prediction)
        data = _assemble(ing, alt, candidates, frags, _run_on(alt, cluster), outdir / alternative_folder(k))
        builds.append(alternative_build(k, data, frags, variant))
    return builds


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


def plan_fallbacks(ing: Ingested, cluster: cluster_mod.ClusterModel, manifest: dict, outdir: Path, strategy: str,
                   objective: str, options: PlanOptions, progress: Progress,
                   phases: Phases | None = None) -> list[ExtraBuild]:
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
        cost = _price(ing, phases, rest)
        try:  # the planners' own progress lines would read as the main plan's
            chosen, candidates = plan_model(ing.graph, cost, strategy, objective, options, Progress())
        except UserError as exc:
            error = str(exc).removeprefix(f"{exc.path}: ") if exc.path else str(exc)
            builds.append(fallback_build(device, error=error))
            progress.note(f"fallback without {device}: none ({error})")
            continue
        frags = build_fragments(ing, chosen.plan, chosen.prediction, None if phases is None else fragment_shapes(phases))
        folder = fallback_build(device).folder
        data = _assemble(ing, chosen, candidates, frags, _run_on(chosen, rest), outdir / folder, phases)
        builds.append(fallback_build(device, data, frags))
        used = sum(1 for steps in data["steps"].values() if steps)
        progress.note(f"fallback without {device}: {chosen.strategy} on {used} device(s), "
                      f"latency {chosen.prediction.latency_ms:.1f} ms, throughput "
                      f"{chosen.prediction.throughput_ips:.2f}/s")
    return builds


def _assemble(ing: Ingested, chosen: Candidate, candidates, frags, run_on: cluster_mod.ClusterModel, outdir: Path,
              phases: Phases | None = None) -> dict:
    """The manifest of a build of `chosen`, with the sections about its plan (plan/views.py plan_sections); of
    a generative build (`phases`), with its state (emit/state.py)."""
    sections = plan_sections(chosen, candidates, ing.graph)
    manifest = assemble_manifest(ing, chosen.plan, chosen.prediction, frags, run_on.to_dict(), outdir, sections.pop("plan"))
    return (manifest if phases is None else generative_manifest(manifest, phases)) | sections


def _run_on(chosen: Candidate, cluster: cluster_mod.ClusterModel) -> cluster_mod.ClusterModel:
    """The cluster as the chosen plan runs it: its devices in the power modes the plan needs."""
    return cluster if chosen.cost is None else chosen.cost.cluster


def _without(cluster: cluster_mod.ClusterModel, device: str) -> cluster_mod.ClusterModel:
    """The cluster minus one device and its links (the network defaults stay)."""
    return replace(cluster, devices=tuple(d for d in cluster.devices if d.name != device),
                   links={pair: link for pair, link in cluster.links.items() if device not in pair})


