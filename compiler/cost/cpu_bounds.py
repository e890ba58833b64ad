"""Bounds on a plan's throughput from the CPU its devices share, and the runtime's per-request cost they count:
a machine several devices share (the cluster's `hosts:`), a device's CPU quota, the weights a device streams
beside a mate of its machine. evaluate.py takes each as a resource one input holds."""

from __future__ import annotations

from ..graph import LayerGraph
from ..plan_types import Plan
from .generate import GenerativeCostTable
from .table import CostTable
from .tiles import host_mates

__all__ = ["streaming_weights", "host_periods", "quota_devices", "quota_periods", "request_costs"]


def streaming_weights(plan: Plan, cost: CostTable, busy: dict[str, float]) -> dict[str, float]:
    """Per device of a pipeline stage: what its stages' weights take beyond their price while inputs stream,
    when another device of its host (the cluster's `hosts:`) works in the plan too. Streaming, the two work
    at once, each on its own input, and each streams its weights beside the other (CostTable.shared_weights;
    a spatial tile pays it in its own time already, where a mate tiles the same segment). A lone request
    runs the stages one after another, so the latency does not pay it, nor do the fragments' predicted_ms,
    which the emulator pads runs to: emulating such a cluster streams without it.  Measured 2026-11-26:
    the bottleneck stage of a two-stage MobileNetV2 ran 1.05-1.13x slower beside the other stage than alone;
    the shared rate prices 1.09x (and 1.002x for the other stage, measured 1.02-1.03x)."""
    mates = host_mates(cost, [cost.index(d) for d in busy])
    extra: dict[str, float] = {}
    for s in plan.stages:
        d = cost.index(s.device)
        if s.spatial is None and d in mates:
            extra[s.device] = extra.get(s.device, 0.0) + cost.shared_weights(s.lo, s.hi, d)
    return extra


def host_periods(plan: Plan, graph: LayerGraph, cost: CostTable, busy: dict[str, float], transfers) -> dict[str, float]:
    """Per machine that several devices share (the cluster's `hosts:`), the work one input gives its cores,
    divided by them: a lower bound on the period when inputs stream, whatever each device's own period.
    The work: each of its devices' compute, times the cores its worker runs on (its threads, at most the
    machine's; all of them by default); the runtime's own work on every message with an end there, half per
    end (network.runtime_ms: encoding, CURVE, copies, which the profiles measured with both ends on one
    machine); and each request's cost at the devices taking model inputs and giving outputs, half to the
    device's machine and half to the coordinator's (`coordinator: true`), both of which do that hand-off.
    The runtime's costs are its CPU figures where the profiles measured them (RuntimeFigures.cpu).
    Measured on a 2-core machine running two 1-thread workers and the coordinator, a two-stage MobileNetV2
    streamed at 165/s where the devices' own periods said 215/s: 10.5 ms of CPU per request on 2 cores."""
    hosts = cost.cluster.hosts
    if not hosts:
        return {}
    where = {d.name: d.host for d in cost.cluster.devices}
    coordinator = next((h for h, spec in hosts.items() if spec.coordinator), None)
    work = dict.fromkeys(hosts, 0.0)
    for d in cost.cluster.devices:
        if d.host is not None and d.name in busy:
            cores = hosts[d.host].cores
            work[d.host] += busy[d.name] * min(d.threads or cores, cores)
    net = cost.network
    for tr in transfers:
        half = net.runtime_ms(tr.nbytes, tr.src, tr.dst) / 2.0
        for end in (tr.src, tr.dst):
            if where.get(end) is not None:
                work[where[end]] += half
    for extra in request_costs(plan, graph, cost, cpu=True):
        for k, ms in extra.items():
            for h in (where.get(plan.stages[k].device), coordinator):
                if h is not None:
                    work[h] += ms / 2.0
    return {h: w / hosts[h].cores for h, w in work.items() if w > 0}


def quota_devices(cost: CostTable) -> dict[str, tuple[float, int | None]]:
    """{device: (its quota in cores, its threads)} of the devices profiled under a CPU quota that share no
    machine (a shared machine's `hosts:` bound covers those)."""
    return {d.name: (d.profile.cpu_quota_cores, d.threads) for d in cost.cluster.devices
            if d.host is None and d.profile.cpu_quota_cores is not None}


def quota_periods(plan: Plan, graph: LayerGraph, cost: CostTable, busy: dict[str, float],
                   transfers) -> dict[str, float]:
    """Per device of the plan whose profile was measured under a CPU quota (`cpu_quota.cores`: a container's
    limit, a cgroup's) and that shares no machine (`hosts:` bounds those): the work one input gives the quota,
    over it. The work: its compute, times the cores it runs on (its threads, at most the quota; its figures
    already follow the quota), and the runtime's own work on every message with an end there and on each
    request it takes inputs for or gives outputs of, counted as in `host_periods`. ZeroMQ's I/O threads
    encrypt and copy in the worker's process, so inside the same quota as its compute: the device cannot
    stream faster than the quota lets both through, however its compute alone is priced."""
    quota = {name: q for name, q in quota_devices(cost).items() if name in busy}
    if not quota:
        return {}
    work = {d: busy[d] * min(threads or cores, cores) for d, (cores, threads) in quota.items()}
    net = cost.network
    for tr in transfers:
        half = net.runtime_ms(tr.nbytes, tr.src, tr.dst) / 2.0
        for end in (tr.src, tr.dst):
            if end in work:
                work[end] += half
    for extra in request_costs(plan, graph, cost, cpu=True):
        for k, ms in extra.items():
            if plan.stages[k].device in work:
                work[plan.stages[k].device] += ms / 2.0
    return {d: w / quota[d][0] for d, w in work.items()}




def request_costs(plan: Plan, graph: LayerGraph, cost: CostTable, cpu: bool = False,
                  lone: bool = False) -> tuple[dict[int, float], dict[int, float]]:
    """({stage: ms}, {stage: ms}) of the runtime's per-request cost: a device pays its request_in_ms at its
    first stage that reads a model input, and its request_out_ms at its first stage that gives a model
    output (after that stage's sends: the manifest sends outputs to the host in the same burst), each for
    the bytes of every model input it reads / output it gives (the host sends them all at the request's
    start; runtime/manifest/replay.py charges the same). A generative step's caches are neither (they stay
    on their stage) and its logits leave as the token id (generate.py StepIO). Empty when no device has the
    figures. With `lone`, as a lone request's timeline meets them (CostTable.lone_network)."""
    net = cost.lone_network if lone else cost.network
    io = cost.io if isinstance(cost, GenerativeCostTable) else None
    taken: dict[str, int] = {}
    given: dict[str, int] = {}
    reads: dict[str, dict[str, int]] = {}
    gives: dict[str, dict[str, int]] = {}
    for k, s in enumerate(plan.stages):
        layers = graph.layers[s.lo:s.hi]
        read = {t for layer in layers for t in layer.inputs}
        made = {t for layer in layers for t in layer.outputs}
        ins = ({t: graph.tensors[t].nbytes for t in read if t in graph.inputs} if io is None
               else io.inputs(graph, read))
        outs = ({t: graph.tensors[t].nbytes for t in made if t in graph.outputs} if io is None
                else io.outputs(graph, made))
        if ins:
            taken.setdefault(s.device, k)
            reads.setdefault(s.device, {}).update(ins)
        if outs:
            given.setdefault(s.device, k)
            gives.setdefault(s.device, {}).update(outs)

    return ({k: ms for d, k in taken.items() if (ms := net.request_in_ms(d, sum(reads[d].values()), cpu)) > 0},
            {k: ms for d, k in given.items() if (ms := net.request_out_ms(d, sum(gives[d].values()), cpu)) > 0})
