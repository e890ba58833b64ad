"""Choosing plans: run the requested planner (every planner for `auto`), price each plan with `evaluate`
and keep the best under the objective (`plan_model`); the frontier's other plans and the chosen plan's
boundary shifts as alternatives (`kept_points`, `shift_candidates`); every plan found, for --pareto
(`pareto_points`).

auto is a branch and bound over the registry (registry.py): the cheap planners run first and the best
latency so far bounds the searching planners, which run last and share their searches.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, replace

from edgec.runtime.interrupts import check_interrupted

from ..cost import CostTable, Prediction, evaluate
from ..errors import UserError
from ..graph import LayerGraph
from ..plan_types import Plan
from ..progress import Progress
from .frontier import Point, plan_key
from .pipeline_energy import energy_frontier
from .placeable import unplaceable
from .planner import Dominated, EnergyGoal, InfeasibleError, PlanOptions
from .registry import COMPARISONS, GENERATIVE, PLANNERS, SEARCHES, STRATEGIES, run_group, schedule
from .shifts import boundary_shifts
from .stats import UNITS, recording

__all__ = ["Candidate", "plan_model", "priced_on", "alternative_candidate", "kept_points", "shift_candidates",
           "pareto_points"]


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
    names = [s for s in STRATEGIES if s not in ("auto", *COMPARISONS)] if strategy == "auto" else [strategy]
    if cost.generate is not None:
        if strategy not in ("auto", *GENERATIVE):
            raise UserError(f"--strategy {strategy} does not apply to --generate: it splits layers across devices, "
                            f"and a layer's cache must stay on one (choose from auto, {', '.join(GENERATIVE)})")
        names = [n for n in names if n in GENERATIVE]
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
    """A model no plan can fit (plan/placeable.py: a model input or output, or one layer with its live
    activations, larger than every device) is refused before any search."""
    reason = unplaceable(graph, cost)
    if reason is not None:
        raise UserError(reason, cost.cluster.path)


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
    costs = [priced_on(p, cost) for p in plans]
    ranked = sorted(((p, evaluate(p.ensures(graph), graph, c), c) for p, c in zip(plans, costs)),
                    key=lambda t: _key(Point(name, t[0], t[1]), objective, goal))
    (plan, pred, first_cost), rest = ranked[0], ranked[1:]
    return Candidate(name, plan, pred, runners_up=tuple((p, pr) for p, pr, _ in rest),
                     cost=first_cost if first_cost is not cost else None)


def priced_on(plan: Plan, cost: CostTable) -> CostTable:
    """The cost table a plan runs on: the cluster's, or with devices in the power modes it needs."""
    modes = dict(plan.modes)
    return cost.with_modes(modes) if modes else cost


def kept_points(chosen: Candidate, front, keep: int, objective: str, options: PlanOptions) -> list[Point]:
    """The first `keep` plans of the frontier other than the chosen one, best first by the objective's own
    order (_key). Under a hard SLA only plans within it qualify: the SLA is the operator's, whichever plan runs."""
    goal = options.energy
    ranked = sorted((p for p in front if plan_key(p.plan) != plan_key(chosen.plan)),
                    key=lambda p: _key(p, objective, goal))
    return [p for p in ranked if math.isfinite(_key(p, objective, goal)[0])][:keep]


def alternative_candidate(strategy: str, plan: Plan, prediction: Prediction, priced: CostTable, cost: CostTable) -> Candidate:
    """A plan to build as an alternative, priced on `priced`: the cluster's table `cost`, or one with the
    devices in the power modes the plan needs (which its build records)."""
    return Candidate(strategy, plan, prediction, cost=priced if priced is not cost else None)


def shift_candidates(graph: LayerGraph, cost: CostTable, chosen: Candidate,
                     kept: list[Plan]) -> list[tuple[Candidate, str]]:
    """The chosen plan's boundary shifts (plan/shifts.py) that are none of the `kept` plans, each priced on
    the chosen plan's table (a shift keeps its power modes), with its description. Unlike --keep's plans,
    a shift predicted beyond a hard SLA stays: it is meant for when the predicted figures no longer hold."""
    priced = priced_on(chosen.plan, cost)
    out = []
    for shift in boundary_shifts(chosen.plan, graph, priced, kept):
        check_interrupted()
        out.append((alternative_candidate(chosen.strategy, shift.plan, evaluate(shift.plan, graph, priced), priced, cost),
                    shift.description))
    return out


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
        priced = priced_on(plan, cost)
        points.append(Point("pipeline", plan, evaluate(plan, graph, priced)))
    return points
