"""allocate(): several services on one cluster, as one straight list of steps: read the services and the
cluster, plan each service on the shares worth a plan, choose one option per service (CP-SAT), hand out the
devices, emit one build per service and allocation.json."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from edgec.runtime.interrupts import check_interrupted

from .. import cluster as cluster_mod
from ..cost import CostTable, device_memory_bytes, evaluate
from ..plan.choose import Candidate
from ..plan.planner import PlanOptions
from ..plan.views import plan_sections
from ..emit import assemble_manifest, build_fragments
from ..errors import UserError
from ..ingest import Ingested
from ..progress import Progress
from ..units import MiB
from .candidates import Option, ServiceOptions, used_devices
from .classes import DeviceClasses, device_classes, rename_plan, restrict, sub_cluster
from .fit import LatencyFit, capacity, fit_latency
from .output import ServiceBuild, check_allocation_dir, write_allocation
from .planning import plan_all
from .services import Service, load_services
from .solve import SCALE, Item, Problem, Role, Sharing, Solution, solve

__all__ = ["allocate", "Planned", "plan_services", "choose", "build_problem", "BUDGET_MS", "LOAD_SCALE"]

# --share: the time budget of a device is BUDGET_MS of its time per second. A service loads each device
# its plan works on with (its rate) x (the ms its plan holds that device per request: the prediction's
# period_ms, the figure that sets the plan's throughput), its rate being rate_ips, or 1000 / sla_ms
# requests per second without one (requests back to back, each within its SLA). Loads are integers in
# 1 / LOAD_SCALE ms per s, rounded up, so that the integer check never admits more than the budget.
BUDGET_MS = 1000.0
LOAD_SCALE = 1000

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Planned:
    """A service read, priced and planned: what the solver chooses among."""

    service: Service
    ingested: Ingested
    cost: CostTable  # on the whole cluster
    options: ServiceOptions
    fit: LatencyFit | None


@dataclass(frozen=True)
class Choice:
    """The solver's answer for the services kept: the option per service, and those dropped, with why."""

    solution: Solution
    kept: tuple[Planned, ...]
    chosen: tuple[Option, ...]
    dropped: tuple[tuple[Planned, str], ...]


def allocate(services: str | Path, devices: str | Path, outdir: str | Path, *, fairness: bool = False,
             best_effort: bool = False, share: bool = False, time_limit: float = 10.0,
             options: PlanOptions = PlanOptions(), progress: Progress = Progress()) -> dict:
    """Allocate the cluster in `devices` among the services of `services`; write OUTDIR; return the
    allocation.json object. When not every SLA can be met: UserError naming the services that cannot be
    served and the best latency each could get; with `best_effort`, the lowest-priority services are dropped
    first (listed under "dropped") instead. With `share`, a device may serve several services when the
    bytes their plans hold there fit its memory and their loads fit its time budget (BUDGET_MS)."""
    t0 = time.perf_counter()
    check_allocation_dir(Path(outdir))  # refused now, not after the planning
    listed = load_services(services)
    cluster = cluster_mod.load_cluster(devices)
    classes = device_classes(cluster)
    _check_bounds(listed, cluster, str(services))
    if cluster.medium == "shared":
        logger.warning("%s: a shared medium is one channel for every service: each service's plan is priced as "
                       "if it had the channel alone", cluster.path)
    planned = plan_services(listed, cluster, classes, options, progress)
    planning = time.perf_counter() - t0
    progress.status("choosing one plan per service (CP-SAT)")
    choice = choose(planned, classes, fairness, time_limit, cluster if share else None)
    if choice.dropped and not best_effort:
        raise UserError(_unservable(choice.dropped, len(cluster.devices)), str(services))
    if not choice.kept:
        raise UserError(f"no service can be served: {_reasons(choice.dropped)}", str(services))
    for p, why in choice.dropped:
        progress.note(f"allocate: dropped {p.service.name}: {why}")
    progress.status(f"writing {outdir}")
    allocation, builds = _emit(choice, classes, cluster, Path(outdir), fairness, planning, share)
    write_allocation(Path(outdir), builds, allocation)
    return allocation


def _check_bounds(services: tuple[Service, ...], cluster: cluster_mod.ClusterModel, path: str) -> None:
    for s in services:
        if s.min_devices > len(cluster.devices):
            raise UserError(f"service {s.name!r}: min_devices {s.min_devices} is more than the {len(cluster.devices)} "
                            f"device(s) of {cluster.path}", path)


def plan_services(services: tuple[Service, ...], cluster: cluster_mod.ClusterModel, classes: DeviceClasses,
                  options: PlanOptions = PlanOptions(), progress: Progress = Progress()) -> tuple[Planned, ...]:
    """Each service's model read and priced on the whole cluster once, then planned on its shares
    (planning.py: alike services once, services side by side when there are cores)."""
    out = []
    for x, so in plan_all(services, cluster, classes, options, progress):
        runs = [(capacity(x.cost, used_devices(r.plan)), r.prediction.latency_ms) for r in so.planned if r.plan]
        out.append(Planned(x.service, x.ingested, x.cost, so, fit_latency(runs)))
        progress.note(f"allocate: {x.service.name}: {len(so.planned)} plan(s), {len(so.options)} option(s) within "
                      f"the SLA ({so.seconds:.2f}s)")
    return tuple(out)


def choose(planned: tuple[Planned, ...], classes: DeviceClasses, fairness: bool, time_limit: float,
           shared: cluster_mod.ClusterModel | None = None) -> Choice:
    """The best option per service; a service with no option, and then (while the rest cannot all be
    served) the lowest-priority one (the later one of equal priority), is dropped. `shared`: the cluster,
    when its devices may serve several services."""
    dropped = [(p, _why_alone(p)) for p in planned if not p.options.options]
    kept = [p for p in planned if p.options.options]
    while True:
        problem = build_problem(kept, classes, fairness, shared)
        solution = solve(problem, time_limit)
        if solution.status == "UNKNOWN":
            raise UserError(f"CP-SAT found no allocation within --time-limit {time_limit:g} s (it may exist); allow "
                            "more time")
        if solution.choice is not None or not kept:
            break
        lowest = min(range(len(kept)), key=lambda i: (kept[i].service.priority, -i))
        p = kept.pop(lowest)
        dropped.append((p, f"meets its SLA alone (best {_best_ms(p):.1f} ms) but not beside the higher-priority "
                           "services"))
    chosen = tuple(p.options.options[j] for p, j in zip(kept, solution.choice or ()))
    order = {p.service.name: i for i, p in enumerate(planned)}
    return Choice(solution, tuple(kept), chosen, tuple(sorted(dropped, key=lambda d: order[d[0].service.name])))


def build_problem(kept: list[Planned], classes: DeviceClasses, fairness: bool,
                  shared: cluster_mod.ClusterModel | None = None) -> Problem:
    """The knapsack: per service its options as integer items (solve.py); with `shared` (the cluster, when
    devices may be shared), each option's roles and every device's memory and time budget."""
    items = []
    for p in kept:
        best = p.options.max_utility
        items.append(tuple(Item(o.counts, round(SCALE * p.service.priority * o.utility),
                                round(SCALE * o.utility / best) if best > 0 else SCALE,
                                () if shared is None else _roles(p, o, classes))
                           for o in p.options.options))
    sharing = None
    if shared is not None:
        sharing = Sharing(tuple(tuple(shared.device(n).usable_bytes for n in m) for m in classes.members),
                          round(BUDGET_MS * LOAD_SCALE))
    return Problem(classes.sizes, tuple(items), fairness, sharing)


def role_devices(o: Option, classes: DeviceClasses) -> list[tuple[str | None, int]]:
    """The devices of option `o`, one per role, in role order: (the device of its plan, its class) for each
    device the plan works on, then (None, class) for each idle device min_devices adds."""
    used = used_devices(o.plan)
    out = [(d, classes.class_of(d)) for d in used]
    extra = [c - u for c, u in zip(o.counts, classes.counts(used))]
    return out + [(None, k) for k, n in enumerate(extra) for _ in range(n)]


def _roles(p: Planned, o: Option, classes: DeviceClasses) -> tuple[Role, ...]:
    rate = p.service.rate_ips if p.service.rate_ips is not None else 1000.0 / p.service.sla_ms
    return tuple(Role(k, 0, 0) if d is None else
                 Role(k, o.memory_bytes.get(d, 0), math.ceil(rate * o.prediction.period_ms.get(d, 0.0) * LOAD_SCALE))
                 for d, k in role_devices(o, classes))


def _best_ms(p: Planned) -> float:
    return p.options.best.prediction.latency_ms


def _why_alone(p: Planned) -> str:
    """Why a service has no option on the whole cluster, with the best it could get."""
    s, best = p.service, p.options.best
    if best is None:
        return "no plan fits the devices' memory"
    if best.prediction.latency_ms > s.sla_ms:
        names = ", ".join(used_devices(best.plan))
        return f"sla {s.sla_ms:g} ms, best {best.prediction.latency_ms:.1f} ms (on {names})"
    fastest = max((r.prediction.throughput_ips for r in p.options.planned
                   if r.prediction is not None and r.prediction.latency_ms <= s.sla_ms), default=0.0)
    return f"rate {s.rate_ips:g}/s within {s.sla_ms:g} ms, best {fastest:.2f}/s"


def _reasons(dropped) -> str:
    return "; ".join(f"{p.service.name!r}: {why}" for p, why in dropped)


def _unservable(dropped, devices: int) -> str:
    return (f"cannot meet every SLA on the {devices} device(s): {_reasons(dropped)} (--best-effort drops the "
            "lowest-priority services first)")


def _emit(choice: Choice, classes: DeviceClasses, cluster: cluster_mod.ClusterModel, outdir: Path, fairness: bool,
          planning: float, share: bool = False) -> tuple[dict, list[ServiceBuild]]:
    """Hand out the devices: where the solver placed each role (shared devices), else those of each class
    in cluster order, service by service; rename each plan onto them, re-evaluate it (the same prediction:
    the classes are interchangeable) and emit its build."""
    pools = [list(m) for m in classes.members]
    services, builds = {}, []
    placement = choice.solution.placement
    for n, (p, o) in enumerate(zip(choice.kept, choice.chosen)):
        check_interrupted()
        if placement is not None:
            names, given = _placed_map(o, classes, placement[n])
        else:
            given = [d for k, c in enumerate(o.counts) for d in [pools[k].pop(0) for _ in range(c)]]
            names = _device_map(o, classes, given)
        sub = sub_cluster(cluster, given)
        plan = rename_plan(o.plan, names).ensures(p.ingested.graph)
        pred = evaluate(plan, p.ingested.graph, restrict(p.cost, sub))
        if abs(pred.latency_ms - o.prediction.latency_ms) > 1e-6 * max(1.0, o.prediction.latency_ms):
            raise RuntimeError(f"{p.service.name}: the plan moved onto {sub.device_names} predicts "
                               f"{pred.latency_ms} ms, not {o.prediction.latency_ms} ms: classes differ")
        frags = build_fragments(p.ingested, plan, pred)
        sections = plan_sections(Candidate(plan.strategy, plan, pred), (Candidate(plan.strategy, plan, pred),),
                                 p.ingested.graph)
        manifest = assemble_manifest(p.ingested, plan, pred, frags, sub.to_dict(), outdir.resolve() / p.service.name,
                                     sections.pop("plan")) | sections
        builds.append(ServiceBuild(p.service.name, manifest, tuple(frags)))
        services[p.service.name] = _entry(p, o, plan, pred, sub)
    sol = choice.solution
    allocation = {"format": "edgec-allocation/1", "services": services, "status": sol.status,
                  "gap": None if sol.gap is None else round(sol.gap, 6), "solve_seconds": round(sol.seconds, 4),
                  "planning_seconds": round(planning, 4), "objective": "fairness" if fairness else "weighted",
                  "dropped": [{"name": p.service.name, "reason": why} for p, why in choice.dropped],
                  "cluster": str(cluster.path), "share": _device_loads(services, cluster) if share else None}
    return allocation, builds


def _device_loads(services: dict, cluster: cluster_mod.ClusterModel) -> dict:
    """--share: per device given to any service, who shares it, the memory they hold there against what
    it has, and their load against its budget (ms held per s)."""
    out: dict[str, dict] = {}
    for name, s in services.items():
        for d in s["devices"]:
            e = out.setdefault(d, {"services": [], "memory_mb": 0.0, "usable_mb": 0.0, "held_ms_per_s": 0.0,
                                   "budget_ms_per_s": BUDGET_MS})
            e["services"].append(name)
            e["memory_mb"] = round(e["memory_mb"] + s["memory_mb"].get(d, 0.0), 3)
            e["usable_mb"] = round(cluster.device(d).usable_bytes / MiB, 3)
            e["held_ms_per_s"] = round(e["held_ms_per_s"] + s["held_ms_per_s"].get(d, 0.0), 3)
    return {"devices": {d: out[d] for d in cluster.device_names if d in out}}


def _placed_map(o: Option, classes: DeviceClasses, where) -> tuple[dict[str, str], list[str]]:
    """Shared devices: the plan's devices onto the devices the solver placed their roles on, and every
    device given (the idle ones min_devices adds too), in cluster order."""
    names, given = {}, []
    for (d, _), (k, m) in zip(role_devices(o, classes), where):
        given.append(classes.members[k][m])
        if d is not None:
            names[d] = classes.members[k][m]
    return names, given


def _device_map(o: Option, classes: DeviceClasses, given: list[str]) -> dict[str, str]:
    """The plan's devices onto the ones given, class by class (in cluster order on both sides)."""
    used = set(used_devices(o.plan))
    names = {}
    for members in classes.members:
        names.update(zip([d for d in members if d in used], [d for d in given if d in members]))
    return names


def _entry(p: Planned, o: Option, plan, pred, sub) -> dict:
    best = p.options.max_utility
    need = device_memory_bytes(plan, p.ingested.graph)
    memory = {d: round(need.get(d, 0) / MiB, 3) for d in sub.device_names}
    rate = p.service.rate_ips if p.service.rate_ips is not None else 1000.0 / p.service.sla_ms
    return {
        "devices": list(sub.device_names),
        "manifest": f"{p.service.name}/manifest.json",
        "sla_ms": p.service.sla_ms,
        "rate_ips": p.service.rate_ips,
        "priority": p.service.priority,
        "strategy": plan.strategy,
        "predicted_latency_ms": round(pred.latency_ms, 4),
        "predicted_throughput_ips": round(pred.throughput_ips, 4),
        # energy per request on its devices (compiler/cost/energy.py); null when a device's power is unknown
        "predicted_energy_mj": None if pred.energy_mj is None else round(pred.energy_mj, 4),
        "utility": round(o.utility, 6),
        "normalised_utility": round(o.utility / best, 6) if best > 0 else 1.0,
        "memory_mb": memory,
        "held_ms_per_s": {d: round(rate * pred.period_ms.get(d, 0.0), 3) for d in sub.device_names},
        "latency_fit": None if p.fit is None else p.fit.to_dict(),
    }
