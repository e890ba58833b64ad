"""Evaluate: Plan -> Prediction, the per-device timeline, latency, throughput and traffic under the cost model
(the replay of a manifest's static schedule is simulate.py)."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace

from ..graph import LayerGraph
from ..plan_types import Plan
from ..cluster.power import DevicePower
from .energy import Energy, request_energy
from .order import Message, better, order_bursts, order_stage
from .table import CostTable
from .stage_timeline import StageWork, predict_stage, run_stage
from .cpu_bounds import host_periods, quota_devices, quota_periods, request_costs, streaming_weights
from .quota_burst import lone_stage_ms

__all__ = ["Transfer", "Event", "Prediction", "Hop", "crossing_tensors", "tensor_hops", "evaluate"]

Hop = tuple[str, int, int]  # (tensor, sending stage, receiving stage)


@dataclass(frozen=True)
class Transfer:
    tensor: str
    src: str
    dst: str
    nbytes: int
    ms: float


@dataclass(frozen=True)
class Event:
    device: str
    kind: str  # compute | transfer
    what: str
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class Prediction:
    latency_ms: float
    throughput_ips: float
    bottleneck_ms: float
    busy_ms: dict[str, float]  # compute per input, per device
    stage_ms: tuple[float, ...]
    transfers: tuple[Transfer, ...]
    timeline: tuple[Event, ...]
    tile_ms: dict = field(default_factory=dict)  # (stage, segment, tile) -> compute ms of that tile
    hops: tuple[Hop, ...] = ()  # the stage-to-stage messages timed here (tensor_hops); the emitter sends these
    period_ms: dict = field(default_factory=dict)  # per device: how long one input holds it (see evaluate)
    host_ms: dict = field(default_factory=dict)  # per shared machine (cluster `hosts:`): its cores' work per input / cores
    coordinator_ms: float = 0.0  # the coordinator's hand-offs of one request's inputs in and outputs out
    energy: Energy | None = None  # one request's energy (energy.py), over the span latency_ms
    # per spatial stage whose contention-aware send order beats need order: per exchange, None (need order)
    # or per holder the needs' indices in send order (order.py); the emitter sends in this order
    send_order: dict = field(default_factory=dict)
    # per stage whose burst of messages to later stages is better in another order than `hops` order: the
    # indices of its messages (the hops it sends, in `hops` order) in send order (order.py order_bursts)
    burst_order: dict = field(default_factory=dict)
    # a generative build's per-token figures (`_per_token`): tpot_ms, tokens_per_s, ttft_ms, token_ms and the
    # context they are priced at; None: an ordinary build
    generation: dict | None = None

    @property
    def energy_mj(self) -> float | None:
        """Energy per request in mJ; None when a device the plan uses has no power figures."""
        return None if self.energy is None else self.energy.total_mj

    @property
    def bytes_transferred(self) -> int:
        return sum(t.nbytes for t in self.transfers)

    def to_dict(self) -> dict:
        return {
            "latency_ms": round(self.latency_ms, 4),
            "throughput_ips": round(self.throughput_ips, 4),
            "bottleneck_ms": round(self.bottleneck_ms, 4),
            "bytes_transferred": self.bytes_transferred,
            "devices": {d: {"busy_ms": round(v, 4), **self._device_energy(d)} for d, v in sorted(self.busy_ms.items())},
            **({} if self.energy is None else {"energy_mj": _round(self.energy.total_mj)}),
            # what bounds throughput on a machine several devices share (cluster `hosts:`), when there is one
            **({"hosts": {h: {"period_ms": round(v, 4)} for h, v in sorted(self.host_ms.items())}}
               if self.host_ms else {}),
            **({} if self.generation is None else
               {k: round(v, 4) if isinstance(v, float) else v for k, v in sorted(self.generation.items())}),
        }

    def _device_energy(self, device: str) -> dict:
        e = None if self.energy is None else self.energy.devices.get(device)
        return {} if e is None else {"energy_mj": round(e.total_mj, 4)}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def cluster_power(cost: CostTable) -> dict[str, DevicePower]:
    """{device: its power figures} of the cost table's cluster."""
    return {d.name: d.power for d in cost.cluster.devices}


def transfer_bytes(transfers) -> tuple[dict[str, float], dict[str, float]]:
    """({device: bytes it sends}, {device: bytes it receives}) of one request's transfers."""
    sent: dict[str, float] = {}
    received: dict[str, float] = {}
    for t in transfers:
        if t.nbytes:
            sent[t.src] = sent.get(t.src, 0.0) + t.nbytes
            received[t.dst] = received.get(t.dst, 0.0) + t.nbytes
    return sent, received


def with_energy(pred: Prediction, cost: CostTable) -> Prediction:
    """The prediction with its energy per request (energy.py: the span is its latency)."""
    sent, received = transfer_bytes(pred.transfers)
    return replace(pred, energy=request_energy(pred.latency_ms, pred.busy_ms, sent, received, cluster_power(cost)))


def crossing_tensors(plan: Plan, graph: LayerGraph) -> list[tuple[str, int, int]]:
    """(tensor, producing stage, consuming stage) for every activation that leaves its stage."""
    stage_of = plan.stage_of_layer()
    out = []
    for t, users in graph.consumers.items():
        p = graph.producer.get(t)
        if p is None:
            continue
        for k in sorted({stage_of[u] for u in users} - {stage_of[p]}):
            out.append((t, stage_of[p], k))
    return sorted(out, key=lambda x: (x[1], x[2], graph.producer[x[0]], x[0]))


def tensor_hops(plan: Plan, graph: LayerGraph, direct: frozenset[str] = frozenset()) -> list[Hop]:
    """The messages that carry activations between stages, sorted (sender, receiver, producer, name).

    A tensor in `direct` goes from its producer's stage straight to each stage that uses it; any other
    is forwarded stage to stage up to its last user, each stage in between receiving it and passing it on
    (how the pipeline planner prices it). A tensor is never forwarded through a spatial stage (whose
    boundaries carry one tensor each, so none passes through it): it goes direct. A stage whose device
    already holds the tensor (consecutive stages on one device share its store) takes it from that
    device's stage that got it first: a hop between stages on one device, free and sent by nobody.
    """
    stage_of = plan.stage_of_layer()
    devs = [s.device for s in plan.stages]
    out = []
    for t, users in graph.consumers.items():
        p = graph.producer.get(t)
        if p is None:
            continue
        src = stage_of[p]
        dsts = sorted({stage_of[u] for u in users} - {src})
        if not dsts:
            continue
        if t in direct or not _forwardable(plan, src, dsts[-1]):
            pairs = [(src, b) for b in dsts]
        else:
            pairs = [(j, j + 1) for j in range(src, dsts[-1])]
        first = {devs[src]: src}  # device -> the stage at which it got t
        for a, b in pairs:
            out.append((t, first.get(devs[b], a), b))
            first.setdefault(devs[b], b)
    return sorted(out, key=lambda x: (x[1], x[2], graph.producer[x[0]], x[0]))


def _forwardable(plan: Plan, src: int, last: int) -> bool:
    return all(plan.stages[j].spatial is None for j in range(src + 1, last))


def evaluate(plan: Plan, graph: LayerGraph, cost: CostTable, contention_order: bool = True) -> Prediction:
    """One input flows through the stages; a stage starts when all its inputs have arrived.

    Throughput is set by the resource one input holds longest when inputs stream through (`period_ms`,
    `bottleneck_ms`), under what the runtime does: each device runs its steps for one input before the
    next input's, and hands a message to ZeroMQ, which sends it while the device goes on.
    - A device is held, per stage it works in: a pipeline stage, for its compute; a spatial stage, for
      its span in the stage's timeline (stage_timeline.py `_spans`: the stage's device from scatter to gather, a
      tile device from its first tile to the end of its last, with the halo sends and the waits for halo
      rows between them, which the latency model, the emulator and the runtime all make it wait for).
    - The coordinator is held for the runtime's per-request cost, all of a request's model inputs in and
      outputs out (`coordinator_ms`): with the runtime's default requests in flight (schedule.py
      pipeline_depth counts these hand-offs as resources of their own), the next request's input arrives
      while a device computes. (Until 2026-11-26 a device was held for its own hand-offs too, and the
      runtime kept one request in flight on one device: a one-device MobileNetV2 streamed at 182-195/s, at
      222-240/s with the next input arriving during the run, its compute alone being 241/s.)
    - A link is held for its transfers: each pair its own link on a switched network, one channel for all
      transfers on a shared medium, which the stages' bursts take first come first served (`_Flow`).
    - A machine several devices share (the cluster's `hosts:`) is held for the work one input gives its
      cores, over their number (cpu_bounds.py `host_periods`, `host_ms`); a device profiled under a CPU
      quota, for its compute and its runtime's messaging work over the quota, when that is longer
      (`quota_periods`). The planners' own searches leave both out; they bound the throughput evaluated
      here, which picks among their plans.
    A pipeline stage's period is its compute, as in the pipeline planner's DP (plan/pipeline.py), whose
    bottleneck is the same max(stage compute, transfers); on a machine it shares with another device of
    the plan, its weights' streaming beside that one comes on top (`streaming_weights`; the DP leaves it
    out, as it leaves out the host bound).
    The latency is of lone inputs one after another (as `edgec run --inflight 1` measures): a device profiled
    under a CPU quota computes a lone input at full speed while its burst lasts (quota_burst.py `lone_stage_ms`:
    the timeline's compute), and the inputs follow each other no faster than its period (its `quota_periods`),
    so the latency is at least that.
    The runtime's per-request cost (the profiles' `runtime.request_ms`; network.py request_in_ms and
    request_out_ms) delays the first stage of a device that reads a model input (once its other inputs
    are there) and follows the sends of the first stage of a device that gives a model output.
    Each tensor that skips a stage is forwarded or sent direct (`tensor_hops`) as `_route` decides.
    A spatial stage's exchanges send in the contention-aware order where it is better (order.py;
    `send_order`), and so does a stage's burst of messages to several later stages (`burst_order`), once
    the routes are chosen; unless `contention_order` is False: tile order and `hops` order throughout
    (what the emitter did before; the benchmark's and the tests' reference).
    """
    # Spatial stages (tiles across devices) are timed by the tile cost model: scatter .. gather, each
    # exchange's sends in the contention-aware order when it is better than tile order (order.py).
    spatial = {}
    for k, s in enumerate(plan.stages):
        if s.spatial is not None and not contention_order:
            spatial[k] = predict_stage(s, graph, cost)
        elif s.spatial is not None:
            spatial[k], order = order_stage(s, graph, cost)
            if order is not None:
                spatial[k]["order"] = order
    stage_ms = tuple(spatial[k]["latency_ms"] if k in spatial else float(cost.layer_ms[s.lo:s.hi, cost.index(s.device)].sum())
                     for k, s in enumerate(plan.stages))
    lone_events: dict[int, list] = {}

    def lone_spatial(k: int, burst) -> float:
        """Spatial stage k's timeline as a lone request meets it (quota_burst.py), in the send order chosen."""
        s, order = plan.stages[k], spatial[k].get("order")
        lone = run_stage(s, graph, cost, StageWork.build(s, graph, cost),
                         lambda j, *_: None if order is None else order[j], burst)
        lone_events[k] = lone["events"]
        return lone["latency_ms"]

    times = _StageTimes(stage_ms, lone_stage_ms(plan, cost, stage_ms, spatial, lone_spatial), lone_events)
    pred = _route(plan, graph, cost, spatial, times)
    if contention_order:
        pred = _ordered_bursts(plan, graph, cost, spatial, times, pred)
    if cost.generate is not None:
        pred = _per_token(plan, cost, pred)
    return with_energy(pred, cost)


@dataclass(frozen=True)
class _StageTimes:
    """Per stage, its compute priced at the device's figures (`held`: what holds the device while inputs
    stream) and in a lone request's timeline (`lone`: a quota'd device's burst, quota_burst.py)."""

    held: tuple[float, ...]
    lone: tuple[float, ...]
    spatial_events: dict[int, list] = field(default_factory=dict)  # a spatial stage's lone timeline, where it differs


def _per_token(plan: Plan, cost: CostTable, step: Prediction) -> Prediction:
    """A generative build's decode step `step` as per-token figures: the last stage sends the token id to
    the first (generate.py token_ms) and the sequence's next step starts when it arrives, so
    tpot = the step's latency + that transfer; the last stage's device is held until it has sent it, so with
    sequences in flight (as many as the stages keep busy) a token leaves every bottleneck_ms:
    tokens_per_s = 1000 / bottleneck. ttft = the prefill of prompt_len tokens through the same stages
    (its last stage chooses the first token). A step's latency is at least every quota'd device's period
    (_predict), the last one's with the token's send. latency_ms, bottleneck_ms and throughput_ips become the per-token
    figures, so that every planner and the choice among them compare plans by them."""
    gen = cost.generate
    first, last = plan.stages[0].device, plan.stages[-1].device
    token = gen.token_ms(cost, last, first)
    period = dict(step.period_ms)
    period[last] = period.get(last, 0.0) + token
    bottleneck = max(step.bottleneck_ms, period[last])
    prefill = evaluate(plan, gen.prefill_graph, gen.prefill)
    tpot = step.latency_ms + token
    if last in quota_devices(cost):
        tpot = max(tpot, period[last])  # one sequence's steps follow each other no faster than its quota lets
    figures = {"tpot_ms": tpot, "tokens_per_s": 1000.0 / bottleneck if bottleneck > 0 else float("inf"),
               "ttft_ms": prefill.latency_ms, "token_ms": token, "priced_past": gen.priced_past,
               "prompt_len": gen.prompt_len, "max_context": gen.max_context}
    return replace(step, latency_ms=tpot, bottleneck_ms=bottleneck, period_ms=period,
                   throughput_ips=figures["tokens_per_s"], generation=figures)


def _ordered_bursts(plan: Plan, graph: LayerGraph, cost: CostTable, spatial: dict, times: _StageTimes,
                    fixed: Prediction) -> Prediction:
    """`fixed` (each burst in `hops` order) with the stages' bursts in the contention-aware order
    (order.py order_bursts) when that predicts a better plan: a lower latency and no device or link
    held longer (`better`); else `fixed` itself."""
    hops = list(fixed.hops)
    flow = _Flow(plan, graph, cost, times.lone, hops)
    orders = order_bursts(flow.bursts(), times.lone, flow.key)
    if not orders:
        return fixed
    trial = _predict(plan, graph, cost, spatial, times, hops, orders)
    return trial if better(trial.latency_ms, trial.bottleneck_ms, fixed.latency_ms, fixed.bottleneck_ms) else fixed


EVERY_ROUTING = 4  # up to this many tensors skipping a stage, `_route` tries every set of them sent direct


def _route(plan: Plan, graph: LayerGraph, cost: CostTable, spatial: dict, times: _StageTimes) -> Prediction:
    """The prediction with the best routes: starting from every tensor forwarded (the pipeline planner's
    price), each tensor that skips a stage, in (producer, name) order, goes direct when that is no worse
    under the plan's objective (ties go direct: fewer messages). Never worse than all forwarded. Where at
    most EVERY_ROUTING tensors skip a stage, every other set of them sent direct is tried too, and taken
    when strictly better: so every routing the pipeline planner prices (a decoder's riders, pipeline_riders.py)
    is tried, and its price is never below this one."""
    def key(pred: Prediction) -> tuple[float, float]:
        main = (pred.latency_ms, pred.bottleneck_ms)
        return main[::-1] if plan.objective == "throughput" else main  # energy: its idle share falls with latency

    direct: frozenset[str] = frozenset()
    best = _predict(plan, graph, cost, spatial, times, tensor_hops(plan, graph, direct))
    skipping = _skipping(plan, graph)
    tried = {direct}
    for t in skipping:
        tried.add(direct | {t})
        trial = _predict(plan, graph, cost, spatial, times, tensor_hops(plan, graph, direct | {t}))
        if key(trial) <= key(best):
            direct, best = direct | {t}, trial
    if len(skipping) <= EVERY_ROUTING:
        for n in range(1, len(skipping) + 1):
            for combo in itertools.combinations(skipping, n):
                if frozenset(combo) in tried:
                    continue
                trial = _predict(plan, graph, cost, spatial, times, tensor_hops(plan, graph, frozenset(combo)))
                if key(trial) < key(best):
                    best = trial
    return best


def _skipping(plan: Plan, graph: LayerGraph) -> list[str]:
    """Tensors whose last user is beyond the stage after their producer's, in (producer, name) order:
    the ones that forwarding and direct sending route differently."""
    last: dict[str, tuple[int, int]] = {}  # tensor -> (producing stage, last consuming stage)
    for t, src, k in crossing_tensors(plan, graph):
        last[t] = (src, max(k, last.get(t, (src, k))[1]))
    return [t for t in sorted(last, key=lambda t: (graph.producer[t], t))
            if last[t][1] > last[t][0] + 1 and _forwardable(plan, *last[t])]


def _predict(plan: Plan, graph: LayerGraph, cost: CostTable, spatial: dict, times: _StageTimes,
             hops: list[Hop], burst_order: dict[int, tuple[int, ...]] | None = None) -> Prediction:
    """The timeline of one input when the stages exchange `hops` (each stage sends after it computes), each
    stage's burst in `burst_order` (see _Flow) or else in `hops` order."""
    flow = _Flow(plan, graph, cost, times.lone, hops)
    events: list[Event] = []
    ready, finish, done = flow.run(burst_order or {}, events)
    transfers = flow.transfers
    busy: dict[str, float] = {}
    period: dict[str, float] = {}
    for k, (s, ms) in enumerate(zip(plan.stages, times.held)):
        for dev, dev_ms in (spatial[k]["compute_ms"].items() if k in spatial else [(s.device, ms)]):
            busy[dev] = busy.get(dev, 0.0) + dev_ms
        for dev, dev_ms in (spatial[k]["span_ms"].items() if k in spatial else [(s.device, ms)]):
            period[dev] = period.get(dev, 0.0) + dev_ms
    streaming = dict(busy)  # what a device works per input while inputs stream (cpu_bounds.py streaming_weights)
    for dev, ms in streaming_weights(plan, cost, busy).items():
        period[dev] += ms
        streaming[dev] += ms
    for k, sp in spatial.items():
        events.extend(Event(d, kind, what, ready[k] + t0, ready[k] + t1)
                      for d, kind, what, t0, t1 in times.spatial_events.get(k, sp["events"]))
        transfers += tuple(Transfer(*tr) for tr in sp["transfers"])
    links: dict[frozenset, float] = {}
    for tr in transfers:
        key = frozenset(["*"]) if cost.cluster.medium == "shared" else frozenset([tr.src, tr.dst])
        links[key] = links.get(key, 0.0) + tr.ms
    hosts = host_periods(plan, graph, cost, streaming, transfers)
    quotas = quota_periods(plan, graph, cost, streaming, transfers)
    for dev, ms in quotas.items():
        period[dev] = max(period[dev], ms)
    coordinator = sum(sum(extra.values()) for extra in request_costs(plan, graph, cost))  # streaming: at the share
    bottleneck = max([*period.values(), *links.values(), *hosts.values(), coordinator])
    return Prediction(
        latency_ms=max([_latency(finish, done), *quotas.values()]),
        throughput_ips=1000.0 / bottleneck if bottleneck > 0 else float("inf"),
        bottleneck_ms=bottleneck,
        busy_ms=busy,
        stage_ms=times.held,
        transfers=transfers,
        timeline=tuple(events),
        tile_ms={(k, seg, t): ms for k, sp in spatial.items() for (seg, t), ms in sp["tile_ms"].items()},
        hops=tuple(hops),
        period_ms=period,
        host_ms=hosts,
        coordinator_ms=coordinator,
        send_order={k: sp["order"] for k, sp in spatial.items() if "order" in sp},
        burst_order=dict(burst_order or {}),
    )


def _latency(finish: list[float], done: list[float]) -> float:
    return max(max(finish), max(done))


class _Flow:
    """One input's way through the stages for a given set of hops: a stage starts when its inputs have
    arrived, computes, then sends its messages as one burst, one after another on its uplink (switched) or
    on the one channel (shared medium), which bursts take first come first served (ties in stage order),
    as the runtime's coordinator grants it and the replay of the manifest (runtime/manifest/replay.py) times it.

    A stage's burst is its hops in `hops` order, or in its `burst_order`: the indices of its messages
    (the hops it sends, in `hops` order) in send order. Both `_predict` and the burst order search
    (`_ordered_bursts`, which replays it once per candidate) time it here, so they agree to the bit."""

    def __init__(self, plan: Plan, graph: LayerGraph, cost: CostTable, stage_ms: tuple[float, ...], hops: list[Hop]):
        self.plan, self.stage_ms = plan, stage_ms  # a lone input's compute
        self.shared = cost.cluster.medium == "shared"
        ends = [(t, plan.stages[a].device, plan.stages[b].device) for t, a, b in hops]
        # what each transfer holds its link for while inputs stream; the timeline times a lone input's
        # (CostTable.lone_network: faster to and from a device whose quota bursts, quota_burst.py)
        self.transfers = tuple(Transfer(t, src, dst, graph.tensors[t].nbytes if src != dst else 0,
                                        cost.transfer_ms(graph.tensors[t].nbytes, src, dst)) for t, src, dst in ends)
        lone = cost.lone_network
        lone_ms = [lone.transfer_ms(graph.tensors[t].nbytes, src, dst) for t, src, dst in ends]
        self.req_in, self.req_out = request_costs(plan, graph, cost, lone=True)
        self.by_src: dict[int, list[tuple[Transfer, float, int]]] = {}
        self.inbound = [0] * len(plan.stages)  # per stage, how many hops it receives
        for tr, ms, (_, a, b) in zip(self.transfers, lone_ms, hops):
            self.by_src.setdefault(a, []).append((tr, ms, b))
            self.inbound[b] += 1

    def bursts(self) -> dict[int, list[Message]]:
        """Per sending stage, its messages in `hops` order, as the burst order search sees them."""
        return {k: [Message(b, ms, tr.src != tr.dst) for tr, ms, b in burst] for k, burst in self.by_src.items()}

    def key(self, burst_order: dict[int, tuple[int, ...]]) -> tuple[float, float]:
        """(latency, the sum of the stages' ready times): what the burst order search minimises."""
        ready, finish, done = self.run(burst_order)
        return _latency(finish, done), sum(ready)

    def run(self, burst_order: dict[int, tuple[int, ...]], events: list[Event] | None = None
            ) -> tuple[list[float], list[float], list[float]]:
        """(ready, finish, done) per stage: when its inputs are there, when it has computed, and when its
        device is through with it (its sends, its outputs out); the stages' compute and the messages go
        to `events` in stage order when given.

        Bursts go in the order their stages finish computing (a heap), each taking the channel when it
        is free: a burst starts no earlier than the one before, since every stage that gets ready later
        waits for a message of a burst still to go."""
        n = len(self.plan.stages)
        ready, finish, done = [0.0] * n, [0.0] * n, [0.0] * n
        waiting = list(self.inbound)
        per_stage: list[list[Event]] = [[] for _ in range(n)]
        heap: list[tuple[float, int]] = []

        def computed(k: int) -> None:
            ready[k] += self.req_in.get(k, 0.0)  # the model's inputs come in once its other inputs are there
            finish[k] = ready[k] + self.stage_ms[k]
            if events is not None:
                s = self.plan.stages[k]
                per_stage[k].append(Event(s.device, "compute", f"stage {k} layers {s.lo}-{s.hi - 1}", ready[k], finish[k]))
            heapq.heappush(heap, (finish[k], k))

        for k in range(n):
            if not waiting[k]:
                computed(k)
        channel_free = 0.0  # shared medium: one transfer at a time
        while heap:
            _, k = heapq.heappop(heap)
            t0 = done[k] = finish[k]
            burst = self.by_src.get(k, [])
            for i in burst_order.get(k, range(len(burst))):
                tr, ms, b = burst[i]
                if tr.src == tr.dst:  # nothing is sent (and the channel stays free): the device's stage there
                    start = end = t0  # runs once the messages before are out, as its steps come after them
                else:
                    start = max(t0, channel_free) if self.shared else t0
                    end = t0 = start + ms  # one sender sends its tensors one after another
                    channel_free = end if self.shared else channel_free
                done[k] = end
                if events is not None:
                    per_stage[k].append(Event(tr.src, "transfer", f"{tr.tensor} -> {tr.dst}", start, end))
                ready[b] = max(ready[b], end)
                waiting[b] -= 1
                if not waiting[b]:
                    computed(b)
            done[k] = done[k] + self.req_out[k] if k in self.req_out else finish[k]
        if events is not None:
            events.extend(e for evs in per_stage for e in evs)
        return ready, finish, done
