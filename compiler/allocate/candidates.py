"""Candidate plans per service: which shares of the cluster are worth a plan, planned with edgec's own
planners (auto), and the SLA-feasible options they give.

A share is a count vector over the device classes (classes.py). Planning every share would be 2^N plans;
instead the shares are visited largest first and two monotonicity rules skip most of them:

- a plan on share v that uses only the devices of u <= v is what every share w with u <= w <= v gets (w
  offers no more than v and at least u): those w are covered, the option is u;
- a share whose best latency misses the SLA (or that cannot hold the model) has no subset that meets it.

The shares are never listed all (100 devices of 8 kinds have about a billion): shares.py finds the next
one to plan from the maximal shares left. Beyond shares.LISTED shares (a fleet), a share offers at most
shares.CLASS_CAP devices of each class (a progress note says so), which bounds each planner run's devices,
and with max_devices the walk probes shares over the limit first (shares.py): a run whose plan uses more
devices than max_devices is no option, and no run's option is a plan over it.

A one-device share is planned by the pipeline DP alone: on one device every planner places the whole
model there.

Each share is planned by auto bounded by the SLA (PlanOptions.incumbent: compiler/plan/choose.py plan_model
bounds its searches by the lower of it and the cheap planners' best latency). This drops no option, as
an option is a plan within the SLA:
- when the cheap planners' best meets the SLA, it is the bound, as it is without the SLA: the same runs;
- otherwise a search plan can only be an option if it meets the SLA, and the bounded searches keep
  every state whose lower bound ends within (1 + BOUND_SLACK) x SLA, which holds every plan whose
  simulated latency meets the SLA (the slack auto itself relies on when the pipeline plan bounds the
  searches; exact when the searches are, beam=None). What the bound changes is which plan auto returns
  when none meets the SLA: no option either way, and the share is hopeless either way.
When no share meets the SLA, the shares planned are planned again unbounded, so that the error names
the best latency the service could get.

Peak memory: one planner run at a time (auto's, on at most CLASS_CAP devices of each class on a fleet), the
runs' plans, and the shares still to visit (shares.py: growing with the runs and the classes, never with
the shares).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace

from edgec.runtime.interrupts import check_interrupted

from ..cost import CostTable, Prediction, device_memory_bytes
from ..plan.choose import plan_model
from ..plan.planner import PlanOptions
from ..errors import UserError
from ..graph import LayerGraph
from ..plan_types import Plan
from ..progress import Progress
from .classes import Counts, DeviceClasses, restrict, sub_cluster
from .services import Service
from .shares import CLASS_CAP, Shares, every_share, offered

__all__ = ["Option", "Planned", "ServiceOptions", "plan_service", "plan_shares", "service_options", "used_devices",
           "utility"]

logger = logging.getLogger(__name__)

# The partition-tree nodes the spatial and hybrid searches of one share's planner run may expand
# (plan/planner.py SEARCH_NODES is a compile's): a service plans tens of shares, and a share of many slow
# devices would spend a compile's budget on each. When it is spent, the run keeps the best plan found.
SHARE_NODES = 20_000


@dataclass(frozen=True)
class Planned:
    """One planner run: the share it was given, the plan (None: no plan fits) and its prediction."""

    share: Counts
    plan: Plan | None
    prediction: Prediction | None
    used: Counts | None  # the devices the plan uses, per class


@dataclass(frozen=True)
class Option:
    """An SLA-feasible choice for a service: the devices it takes per class (`counts`: at least those the
    plan uses, more when min_devices asks), the plan (on the devices it was planned on: any devices of the
    same classes serve, classes.rename_plan) and its figures."""

    counts: Counts
    plan: Plan
    prediction: Prediction
    utility: float
    memory_bytes: dict[str, int]

    @property
    def size(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class ServiceOptions:
    service: Service
    options: tuple[Option, ...]  # SLA-feasible, none dominated by another (fewer devices, more utility)
    planned: tuple[Planned, ...]  # every planner run, in visiting order
    best: Planned | None  # the lowest predicted latency of any run (what the service could get at best)
    seconds: float

    @property
    def max_utility(self) -> float:
        return max((o.utility for o in self.options), default=0.0)


def used_devices(plan: Plan) -> tuple[str, ...]:
    """The devices a plan puts work on: stage devices and tile devices."""
    out: dict[str, None] = {}
    for s in plan.stages:
        out[s.device] = None
        for d in (s.spatial.devices if s.spatial is not None else ()):
            out[d] = None
    return tuple(out)


def utility(service: Service, pred: Prediction) -> float | None:
    """The service's utility under `pred`, None if the prediction misses its SLA: with a rate, the
    throughput headroom over it (throughput / rate_ips - 1); else the latency slack ((sla - latency) / sla)."""
    if pred.latency_ms > service.sla_ms:
        return None
    if service.rate_ips is None:
        return (service.sla_ms - pred.latency_ms) / service.sla_ms
    headroom = pred.throughput_ips / service.rate_ips - 1.0
    return headroom if headroom >= 0 else None


def plan_service(service: Service, graph: LayerGraph, cost: CostTable, classes: DeviceClasses,
                 options: PlanOptions = PlanOptions(), progress: Progress = Progress()) -> ServiceOptions:
    """Plan `service` on the shares worth a plan (see the module docstring) and keep its options."""
    t0 = time.perf_counter()
    planned = plan_shares(service, graph, cost, classes, options, progress)
    return service_options(service, graph, classes, planned, time.perf_counter() - t0)


def plan_shares(service: Service, graph: LayerGraph, cost: CostTable, classes: DeviceClasses,
                options: PlanOptions = PlanOptions(), progress: Progress = Progress()) -> list[Planned]:
    """The planner runs on the shares worth a plan, in visiting order (the module docstring)."""
    sizes, capped = offered(classes.sizes)
    limit = min(service.max_devices or math.inf, sum(sizes))
    planned: list[Planned] = []
    shares = Shares(sizes, limit)  # the shares not yet covered nor hopeless, in visiting order
    if capped:
        progress.note(f"allocate: {service.name}: a share offers at most {CLASS_CAP} devices of a class "
                      f"({math.prod(s + 1 for s in classes.sizes):,} shares otherwise; shares.py CLASS_CAP)")
    while (share := shares.next()) is not None:
        check_interrupted()
        run = _plan_share(service, graph, cost, classes, share, options)
        planned.append(run)
        progress.note(_note(service, classes, run))
        if not _meets(service, run):
            shares.hopeless(share)  # its subsets all miss the SLA
        if run.used is not None:
            shares.cover(run.used, share)  # every share between what the plan uses and this one gets it
    if not any(_serves(service, r) for r in planned):  # the error names the best latency: plan it unbounded
        planned = [_plan_share(service, graph, cost, classes, r.share, options, bounded=False) if sum(r.share) > 1
                   else r for r in planned]
    return planned


def service_options(service: Service, graph: LayerGraph, classes: DeviceClasses, planned: list[Planned],
                    seconds: float) -> ServiceOptions:
    """The service's options from its planner runs (`plan_shares`)."""
    best = min((p for p in planned if p.prediction is not None and _within(service, p)),
               key=lambda p: (p.prediction.latency_ms, sum(p.used)), default=None)
    opts = _options(service, graph, classes, planned)
    return ServiceOptions(service, opts, tuple(planned), best, seconds)


def _meets(service: Service, run: Planned) -> bool:
    return run.plan is not None and run.prediction.latency_ms <= service.sla_ms


def _within(service: Service, run: Planned) -> bool:
    """Whether the run's plan uses at most max_devices devices (a probe's may not: shares.py)."""
    return run.used is None or service.max_devices is None or sum(run.used) <= service.max_devices


def _serves(service: Service, run: Planned) -> bool:
    """Whether the run is an option's: its plan meets the SLA within max_devices."""
    return _meets(service, run) and _within(service, run)


def _shares(sizes: Counts, limit: float) -> list[Counts]:
    """Every non-empty share of at most `limit` devices, largest first (then in class order): the order
    `Shares` visits them in (the reference the tests plan every share of)."""
    return every_share(sizes, limit)


def _plan_share(service: Service, graph: LayerGraph, cost: CostTable, classes: DeviceClasses, share: Counts,
                options: PlanOptions, bounded: bool = True) -> Planned:
    sub = sub_cluster(cost.cluster, classes.first(share))
    strategy = "auto" if sum(share) > 1 else "pipeline"
    sub_cost = restrict(cost, sub)
    options = replace(options, search_nodes=_share_nodes(options.search_nodes))
    latency = replace(options, incumbent=min(options.incumbent, service.sla_ms)) if bounded else options
    try:
        chosen, _ = plan_model(graph, sub_cost, strategy, "latency", latency)
        plan, pred = chosen.plan, chosen.prediction
        if service.rate_ips is not None and pred.latency_ms <= service.sla_ms:
            plan, pred = _faster_stream(graph, sub_cost, strategy, options, service, plan, pred)
    except UserError:  # no plan fits these devices' memory
        return Planned(share, None, None, None)
    return Planned(share, plan, pred, classes.counts(used_devices(plan)))


def _share_nodes(nodes: int | None) -> int:
    """The spatial searches' node budget for one share (SHARE_NODES, or the caller's if smaller)."""
    return SHARE_NODES if nodes is None else min(nodes, SHARE_NODES)


def _faster_stream(graph, cost, strategy, options, service, plan, pred):
    """For a service with a rate: the throughput objective's plan, when it still meets the SLA and streams
    more requests per second than the latency objective's."""
    chosen, _ = plan_model(graph, cost, strategy, "throughput", options)
    alt = chosen.prediction
    if alt.latency_ms <= service.sla_ms and alt.throughput_ips > pred.throughput_ips:
        return chosen.plan, alt
    return plan, pred


def _note(service: Service, classes: DeviceClasses, run: Planned) -> str:
    share = ", ".join(f"{c} {label}" for c, label in zip(run.share, classes.labels) if c)
    if run.plan is None:
        return f"allocate: {service.name} on {share}: no plan fits"
    return (f"allocate: {service.name} on {share}: {run.plan.strategy}, {run.prediction.latency_ms:.1f} ms on "
            f"{sum(run.used)} device(s)")


def _options(service: Service, graph: LayerGraph, classes: DeviceClasses, planned: list[Planned]) -> tuple[Option, ...]:
    """The runs that meet the SLA, as options on the devices they use (padded up to min_devices with every
    mix of idle devices), without those another option dominates."""
    found: dict[Counts, Option] = {}
    for run in planned:
        if run.plan is None or not _within(service, run):
            continue
        u = utility(service, run.prediction)
        if u is None:
            continue
        memory = device_memory_bytes(run.plan, graph)
        for counts in _padded(run.used, classes.sizes, service.min_devices):
            old = found.get(counts)
            if old is None or u > old.utility:
                found[counts] = Option(counts, run.plan, run.prediction, u, memory)
    opts = sorted(found.values(), key=lambda o: (o.size, -o.utility, o.counts))
    return tuple(o for o in opts if not any(_dominates(p, o) for p in opts if p is not o))


PAD_MIXES = 256  # the most ways one plan is padded up to min_devices (the first, in counts order)


def _padded(used: Counts, sizes: Counts, minimum: int, limit: int = PAD_MIXES) -> list[Counts]:
    """The device counts of `minimum` devices that hold `used` (every class at most its size), in counts
    order: each way to add idle devices to a plan up to min_devices. Built one class at a time, never over
    every share; at most `limit` of them (a fleet has millions: the allocation then chooses among the first,
    and says so)."""
    extra = minimum - sum(used)
    if extra <= 0:
        return [used]
    room = [s - u for u, s in zip(used, sizes)]
    after = [sum(room[i + 1:]) for i in range(len(room))]  # what the classes after i can still take
    out: list[Counts] = []

    def fill(i: int, left: int, acc: tuple[int, ...]) -> None:
        if len(out) >= limit:
            return
        if i == len(room):
            out.append(tuple(u + a for u, a in zip(used, acc)))
            return
        for a in range(max(0, left - after[i]), min(room[i], left) + 1):
            fill(i + 1, left - a, acc + (a,))

    fill(0, extra, ())
    if len(out) >= limit:
        logger.warning("allocate: min_devices %d: a plan on %d device(s) is padded in its first %d ways only "
                       "(candidates.py PAD_MIXES)", minimum, sum(used), limit)
    return out


def _dominates(p: Option, o: Option) -> bool:
    """p takes no more of any class and serves at least as well (strictly better in one of the two)."""
    fewer = all(a <= b for a, b in zip(p.counts, o.counts))
    return fewer and p.utility >= o.utility and (p.counts != o.counts or p.utility > o.utility)
