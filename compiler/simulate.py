"""Simulate: Plan -> predicted per-device timeline, latency, throughput and traffic under the cost model."""

from __future__ import annotations

from dataclasses import dataclass

from .cost import CostTable
from .graph import LayerGraph
from .plan.types import Plan

__all__ = ["Transfer", "Event", "Prediction", "crossing_tensors", "simulate"]


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

    @property
    def bytes_transferred(self) -> int:
        return sum(t.nbytes for t in self.transfers)

    def to_dict(self) -> dict:
        return {
            "latency_ms": round(self.latency_ms, 4),
            "throughput_ips": round(self.throughput_ips, 4),
            "bottleneck_ms": round(self.bottleneck_ms, 4),
            "bytes_transferred": self.bytes_transferred,
            "devices": {d: {"busy_ms": round(v, 4)} for d, v in sorted(self.busy_ms.items())},
        }


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


def simulate(plan: Plan, graph: LayerGraph, cost: CostTable) -> Prediction:
    """One input flows through the stages; a stage starts when all its inputs have arrived.

    Throughput is set by the busiest resource when inputs stream through: a device's compute, or a link
    (each pair its own link on a switched network; one channel for all transfers on a shared medium).
    """
    stage_ms = tuple(float(cost.layer_ms[s.lo:s.hi, cost.index(s.device)].sum()) for s in plan.stages)
    transfers = tuple(
        Transfer(t, plan.stages[a].device, plan.stages[b].device, graph.tensors[t].nbytes,
                 cost.transfer_ms(graph.tensors[t].nbytes, plan.stages[a].device, plan.stages[b].device))
        for t, a, b in crossing_tensors(plan, graph)
    )
    ready = [0.0] * len(plan.stages)
    finish = [0.0] * len(plan.stages)
    events: list[Event] = []
    channel_free = 0.0  # shared medium: one transfer at a time
    by_src: dict[int, list[tuple[Transfer, int]]] = {}
    for tr, (_, a, b) in zip(transfers, crossing_tensors(plan, graph)):
        by_src.setdefault(a, []).append((tr, b))
    for k, s in enumerate(plan.stages):
        finish[k] = ready[k] + stage_ms[k]
        events.append(Event(s.device, "compute", f"stage {k} layers {s.lo}-{s.hi - 1}", ready[k], finish[k]))
        t0 = finish[k]
        for tr, b in by_src.get(k, []):
            start = max(t0, channel_free) if cost.cluster.medium == "shared" else t0
            end = start + tr.ms
            if cost.cluster.medium == "shared":
                channel_free = end
            else:
                t0 = end  # one sender sends its tensors one after another
            events.append(Event(s.device, "transfer", f"{tr.tensor} -> {tr.dst}", start, end))
            ready[b] = max(ready[b], end)
    busy: dict[str, float] = {}
    for s, ms in zip(plan.stages, stage_ms):
        busy[s.device] = busy.get(s.device, 0.0) + ms
    links: dict[frozenset, float] = {}
    for tr in transfers:
        key = frozenset(["*"]) if cost.cluster.medium == "shared" else frozenset([tr.src, tr.dst])
        links[key] = links.get(key, 0.0) + tr.ms
    bottleneck = max([*busy.values(), *links.values()])
    return Prediction(
        latency_ms=max(finish),
        throughput_ips=1000.0 / bottleneck if bottleneck > 0 else float("inf"),
        bottleneck_ms=bottleneck,
        busy_ms=busy,
        stage_ms=stage_ms,
        transfers=transfers,
        timeline=tuple(events),
    )


def simulate_manifest(manifest: dict) -> dict:
    """Replay a manifest's static schedule with its predicted fragment times and its network.

    Each device executes its steps in order; a `run` takes the fragment's predicted_ms, a `send` occupies
    the sender (and, on a shared medium, the one channel) for bytes / bandwidth + latency, a `recv` waits
    for the matching send to finish. Host transfers (inputs in, outputs out) are free, as in the planner.
    """
    net = manifest["network"]
    links = {frozenset((l["a"], l["b"])): l for l in net.get("links", [])}
    frag_ms = {f["id"]: float(f["predicted_ms"]) for f in manifest["fragments"]}
    sizes = {(t["tensor"], t["src"], t["dst"]): int(t["bytes"]) for t in manifest["transfers"]}
    steps = manifest["steps"]
    pc = {d: 0 for d in steps}
    clock = {d: 0.0 for d in steps}
    arrived: dict[tuple[str, str, str], float] = {}
    channel = 0.0
    events = []
    progress = True
    while progress:
        progress = False
        for dev, seq in steps.items():
            while pc[dev] < len(seq):
                s = seq[pc[dev]]
                if s["op"] == "recv":
                    key = (s["tensor"], s["from"], dev)
                    if s["from"] != "@host":
                        if key not in arrived:
                            break
                        clock[dev] = max(clock[dev], arrived[key])
                elif s["op"] == "run":
                    start = clock[dev]
                    clock[dev] += frag_ms[s["fragment"]]
                    events.append({"device": dev, "kind": "compute", "what": s["fragment"], "start_ms": start, "end_ms": clock[dev]})
                elif s["op"] == "send" and s["to"] != "@host":
                    name = s.get("as", s["tensor"])
                    link = links.get(frozenset((dev, s["to"])), net)
                    ms = sizes.get((s["tensor"], dev, s["to"]), 0) / (float(link["bandwidth_mbps"]) * 125.0) + float(link["latency_ms"])
                    start = max(clock[dev], channel) if net["medium"] == "shared" else clock[dev]
                    clock[dev] = start + ms
                    channel = clock[dev] if net["medium"] == "shared" else channel
                    arrived[(name, dev, s["to"])] = clock[dev]
                    events.append({"device": dev, "kind": "transfer", "what": f"{s['tensor']} -> {s['to']}", "start_ms": start, "end_ms": clock[dev]})
                pc[dev] += 1
                progress = True
    stuck = [d for d in steps if pc[d] < len(steps[d])]
    if stuck:
        raise ValueError(f"schedule deadlocks: {', '.join(stuck)} wait for tensors that are never sent")
    busy = {d: sum(e["end_ms"] - e["start_ms"] for e in events if e["device"] == d and e["kind"] == "compute") for d in steps}
    return {
        "latency_ms": max(clock.values(), default=0.0),
        "devices": {d: {"busy_ms": busy[d], "finish_ms": clock[d]} for d in steps},
        "bytes_transferred": sum(sizes.values()),
        "timeline": sorted(events, key=lambda e: (e["start_ms"], e["device"])),
    }
