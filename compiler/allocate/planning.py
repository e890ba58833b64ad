"""Planning every service: each model read and priced once, the services that would plan alike planned
once, and the services planned side by side in forked processes (plan/lanes.py) when there are cores
for it.

- Alike: services of one model file (and shapes), SLA, rate or none, and max_devices visit the same
  shares with the same planner runs (candidates.plan_shares); only their options differ (min_devices
  pads, priority weighs). Their runs are planned once.
- Side by side: with more than one process (--jobs, default the cores this process may use), the
  processes take the groups one at a time, the largest model file first, from a shared counter. The
  first model is read before the processes fork; this process reads the others while the forked ones
  plan, then takes groups too (a forked process reads a model it lacks itself). The runs cross back as
  plan dicts (Plan.to_dict) and are evaluated again here on the same cost table: the same predictions,
  whichever process planned them. A process that fails to report has its groups planned here.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import threading
import time
from dataclasses import dataclass

from edgec.runtime.interrupts import check_interrupted

from .. import cluster as cluster_mod
from ..cost import CostTable, build_cost_table, evaluate
from ..plan.planner import PlanOptions
from ..ingest import Ingested, load_model
from ..plan.lanes import available_workers, run_lanes
from ..plan_types import Plan
from ..progress import Progress
from .candidates import Planned as Run, ServiceOptions, plan_shares, service_options, used_devices
from .classes import DeviceClasses, restrict, sub_cluster
from .services import Service

__all__ = ["Loaded", "plan_all"]


@dataclass(frozen=True)
class Loaded:
    service: Service
    ingested: Ingested
    cost: CostTable  # on the whole cluster


class _Models:
    """Models read and priced on the whole cluster, by file and shapes (each read once per process)."""

    def __init__(self, cluster: cluster_mod.ClusterModel):
        self.cluster, self.seen = cluster, {}

    def get(self, s: Service) -> tuple[Ingested, CostTable]:
        key = _model_key(s)
        if key not in self.seen:
            check_interrupted()
            ing = load_model(s.model, s.shapes)
            self.seen[key] = ing, build_cost_table(ing.graph, self.cluster, ing.sha256, model=ing.model)
        return self.seen[key]


def _model_key(s: Service) -> tuple:
    return s.model.resolve(), tuple(sorted(s.shapes.items()))


def _alike(s: Service) -> tuple:
    """What a service's planner runs depend on (candidates.plan_shares)."""
    return _model_key(s), s.sla_ms, s.rate_ips is not None, s.max_devices


def _size(s: Service) -> int:
    try:
        return s.model.stat().st_size
    except OSError:  # load_model says what is wrong with it
        return 0


def plan_all(services: tuple[Service, ...], cluster: cluster_mod.ClusterModel, classes: DeviceClasses,
             options: PlanOptions = PlanOptions(), progress: Progress = Progress()) -> list[tuple[Loaded, ServiceOptions]]:
    """Every service read and planned (in the order given), as the module docstring says."""
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(services):
        groups.setdefault(_alike(s), []).append(i)
    heads = sorted((ix[0] for ix in groups.values()), key=lambda i: -_size(services[i]))
    models = _Models(cluster)
    workers = min(options.jobs or available_workers(), len(heads))
    if threading.active_count() > 1:  # a forked child would inherit another thread's locks mid-use
        workers = 1
    runs: dict[int, tuple[list[Run], float]] = {}
    if workers > 1:
        progress.status(f"allocate: planning {len(heads)} service(s) in {workers} processes")
        models.get(services[heads[0]])  # before the fork: the first group needs no second read
        runs = _side_by_side(services, models, heads, classes, options, workers, progress)
    for i in heads:  # the rest (or all): here, in order
        if i not in runs:
            progress.status(f"allocate: planning {services[i].name}")
            runs[i] = _timed(services[i], models, classes, options, progress)
    out = []
    for ix in groups.values():
        planned, seconds = runs[ix[0]]
        for i in ix:
            ing, cost = models.get(services[i])
            out.append((i, Loaded(services[i], ing, cost),
                        service_options(services[i], ing.graph, classes, planned, seconds)))
    return [(x, so) for _, x, so in sorted(out, key=lambda t: t[0])]


def _timed(s: Service, models: _Models, classes: DeviceClasses, options: PlanOptions,
           progress: Progress) -> tuple[list[Run], float]:
    ing, cost = models.get(s)
    t0 = time.perf_counter()
    planned = plan_shares(s, ing.graph, cost, classes, options, progress)
    return planned, time.perf_counter() - t0


class _Notes(Progress):
    """A forked planner's notes, kept to be shown by the process that reports them."""

    def __init__(self):
        self.lines: list[str] = []

    def note(self, message: str) -> None:
        self.lines.append(message)


def _side_by_side(services: tuple[Service, ...], models: _Models, heads: list[int], classes: DeviceClasses,
                  options: PlanOptions, workers: int, progress: Progress) -> dict[int, tuple[list[Run], float]]:
    """Groups planned by `workers` processes taking the next group from a shared counter; {head: (runs,
    seconds)} for every group a process reported."""
    counter = multiprocessing.RawValue(ctypes.c_int, 0)  # shared memory: the forked lanes see one counter
    lock = multiprocessing.Lock()

    def lane(k: int) -> list:
        if k == 0:  # this process: the other models read while the forked ones plan
            for i in heads:
                models.get(services[i])
        done = []
        while True:
            with lock:
                n = counter.value
                counter.value = n + 1
            if n >= len(heads):
                return done
            notes = _Notes()
            planned, seconds = _timed(services[heads[n]], models, classes, options, notes)
            done.append([heads[n], seconds, notes.lines, [_run_dict(r) for r in planned]])

    out = {}
    for reported in run_lanes(lane, list(range(workers)), workers):
        for head, seconds, lines, runs in reported:
            for line in lines:
                progress.note(line)
            ing, cost = models.get(services[head])
            out[head] = [_run_from(ing, cost, classes, r) for r in runs], seconds
    return out


def _run_dict(r: Run) -> dict:
    return {"share": list(r.share), "plan": None if r.plan is None else r.plan.to_dict()}


def _run_from(ing: Ingested, cost: CostTable, classes: DeviceClasses, d: dict) -> Run:
    """A run planned elsewhere, its prediction evaluated here (the same cost table, the same figures)."""
    share = tuple(d["share"])
    if d["plan"] is None:
        return Run(share, None, None, None)
    plan = Plan.from_dict(d["plan"]).ensures(ing.graph)
    sub = restrict(cost, sub_cluster(cost.cluster, classes.first(share)))
    return Run(share, plan, evaluate(plan, ing.graph, sub), classes.counts(used_devices(plan)))
