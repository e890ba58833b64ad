"""The planner's timeline of a manifest's static schedule, replayed from the manifest alone.

A discrete-event replay in time order: each device executes its steps in order; a `run` takes the
fragment's predicted_ms; a burst of consecutive `send`s occupies the sender (and, on a shared medium, the one
channel, which bursts take first come first served, ties in `transfers` order) for each message's time under
the link model (runtime/linkmodel.py: bytes / bandwidth + latency with the runtime's cost of a message from
network.costs folded in; a send step is a message, so one of no bytes takes the latency); a `recv` waits for the matching
send to finish; slice, concat and free are free, as in the planner. Host transfers cost the runtime's
per-request cost (network.costs' request_ms, half in, half out, each with the bytes of the device's model
inputs or outputs at its per-byte message cost), once per device and request, as the planner charges it: the input half before the device's first run or send after it received from the host,
the output half after the burst in which it first sends to the host. A send's bytes are those of its
`transfers` entry (same tensor, src, dst and region).

`Drift` re-prices the replay with measured figures (`edgec run --adapt`): each device's fragments take
its compute factor x their predicted_ms, and each message between two devices its transfer factor x the
link's time. The compiler's `simulate` (compiler/cost/evaluate.py) is this replay with energy added.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..linkmodel import request_half_ms, wire_ms
from .types import HOST, Manifest, Recv, Run, Send

__all__ = ["Drift", "Timeline", "replay"]


@dataclass(frozen=True)
class Drift:
    """Measured / predicted factors: per device for its fragment runs, per (src, dst) for its messages.
    A device or pair not listed keeps its predicted figures (factor 1)."""

    compute: Mapping[str, float] = field(default_factory=dict)
    transfer: Mapping[tuple[str, str], float] = field(default_factory=dict)


@dataclass
class Timeline:
    """What a replay gives: events in start order (each with device, kind "compute" | "transfer", what,
    start_ms, end_ms and the resource it occupies: "device:DEV"; a message "uplink:SENDER", or on a shared
    medium "channel"; a compute event names its fragment, a transfer its tensor, src and dst), each device's
    finish time, and the bytes each device sent to and received from other devices."""

    events: list[dict]
    finish_ms: dict[str, float]
    sent: dict[str, float]
    received: dict[str, float]
    bytes_transferred: int

    @property
    def latency_ms(self) -> float:
        return max(self.finish_ms.values(), default=0.0)

    def busy_ms(self, device: str) -> float:
        return sum(e["end_ms"] - e["start_ms"] for e in self.events if e["device"] == device and e["kind"] == "compute")


def replay(manifest: Manifest, drift: Drift | None = None) -> Timeline:
    """The timeline of one request through `manifest`'s schedule (module docstring), priced by its
    predictions or, with `drift`, by them times the measured factors.

    `manifest` is parsed (parse_manifest or load_manifest), so its schedule has been validated: every
    fragment a run names exists, and no recv waits for a send that never comes (ValueError otherwise)."""
    state = _Replay(manifest, drift or Drift())
    while (nxt := state.next_step()) is not None:
        state.execute(*nxt)
    stuck = [d for d, seq in state.steps.items() if state.pc[d] < len(seq)]
    if stuck:
        raise ValueError(f"schedule deadlocks: {', '.join(stuck)} wait for tensors that are never sent")
    return Timeline(sorted(state.events, key=lambda e: (e["start_ms"], e["device"])), state.clock, state.sent,
                    state.received, sum(state.sizes.values()))


class _Replay:
    """State of a replay: per-device program counters and clocks, arrivals, the shared channel.

    A send and its transfer entry are matched on (tensor, src, dst, region): the parsed regions compare
    equal exactly when the JSON ranges do."""

    def __init__(self, manifest: Manifest, drift: Drift):
        self.net = manifest.network
        self.shared = self.net.medium == "shared"
        self.drift = drift
        self.frag_ms = {f.id: f.predicted_ms * drift.compute.get(f.device, 1.0) for f in manifest.fragments.values()}
        self.sizes: dict[tuple, int] = {}
        self.rank: dict[tuple, int] = {}
        for i, t in enumerate(manifest.transfers):
            key = (t.tensor, t.src, t.dst, t.region)
            self.sizes[key] = t.bytes
            self.rank.setdefault(key, i)
        self.steps = manifest.steps
        self.pc = {d: 0 for d in self.steps}
        self.clock = {d: 0.0 for d in self.steps}
        self.arrived: dict[tuple[str, str, str], float] = {}
        self.channel = 0.0
        self.events: list[dict] = []
        self.owe_in: set[str] = set()  # devices that received from the host and have not paid for it yet
        self.paid_in: set[str] = set()
        self.paid_out: set[str] = set()
        self.sent: dict[str, float] = {}  # bytes each device sends to other devices (radio energy)
        self.received: dict[str, float] = {}
        # the model inputs each device receives from the host, and the outputs it sends there
        specs = {t.name: t.nbytes for t in (*manifest.inputs, *manifest.outputs)}
        self.host_bytes = {d: (sum(specs.get(t, 0) for t in {s.tensor for s in seq if isinstance(s, Recv) and s.src == HOST}),
                               sum(specs.get(t, 0) for t in {s.name for s in seq if isinstance(s, Send) and s.to == HOST}))
                           for d, seq in self.steps.items()}

    def _request_ms(self, dev: str, which: int) -> float:
        """Half the device's per-request cost, plus its host inputs' (which 0) or outputs' (1) bytes at its
        per-byte message cost: what the planner charges (compiler/cost/network.py request_in_ms)."""
        return request_half_ms(self.net.cost(dev), self.host_bytes[dev][which])

    def _in_ms(self, dev: str) -> float:
        return self._request_ms(dev, 0) if dev in self.owe_in else 0.0

    @staticmethod
    def _key(dev: str, s: Send) -> tuple:
        return (s.tensor, dev, s.to, s.region)

    def next_step(self) -> tuple[str, float] | None:
        """The device whose next step can start first (ties: transfer order, then device order)."""
        best = None
        for dev, seq in self.steps.items():
            if self.pc[dev] >= len(seq):
                continue
            s, at, rank = seq[self.pc[dev]], self.clock[dev], len(self.rank)
            if isinstance(s, Recv) and s.src != HOST:
                got = self.arrived.get((s.tensor, s.src, dev))
                if got is None:
                    continue
                at = max(at, got)
            if isinstance(s, (Run, Send)):
                at += self._in_ms(dev)
            if isinstance(s, Send):
                rank = self.rank.get(self._key(dev, s), rank)
            if best is None or (at, rank) < best[0]:
                best = ((at, rank), dev)
        return None if best is None else (best[1], best[0][0])

    def execute(self, dev: str, at: float) -> None:
        seq = self.steps[dev]
        s = seq[self.pc[dev]]
        self.clock[dev] = at
        self.pc[dev] += 1
        if isinstance(s, (Run, Send)):
            self.owe_in.discard(dev)  # `at` includes it (next_step)
        if isinstance(s, Recv) and s.src == HOST and dev not in self.paid_in:
            self.owe_in.add(dev)
            self.paid_in.add(dev)
        if isinstance(s, Run):
            self.clock[dev] += self.frag_ms[s.fragment]
            self.events.append({"device": dev, "kind": "compute", "what": s.fragment, "start_ms": at,
                                "end_ms": self.clock[dev], "fragment": s.fragment, "resource": f"device:{dev}"})
        elif isinstance(s, Send):
            burst = [s]
            while self.pc[dev] < len(seq) and isinstance(seq[self.pc[dev]], Send):
                burst.append(seq[self.pc[dev]])
                self.pc[dev] += 1
            to_devices = [b for b in burst if b.to != HOST]
            if to_devices:
                self._send(dev, to_devices, max(at, self.channel) if self.shared else at)
            if len(to_devices) < len(burst) and dev not in self.paid_out:  # outputs out, after the messages
                self.paid_out.add(dev)
                self.clock[dev] += self._request_ms(dev, 1)

    def _send(self, dev: str, burst: list[Send], t: float) -> None:
        """Messages of a burst back to back from t (holding the channel on a shared medium)."""
        for b in burst:
            nbytes = self.sizes.get(self._key(dev, b), 0)
            ms = wire_ms(nbytes, *self.net.message_link(dev, b.to))  # a send step is a message, even of no bytes
            ms *= self.drift.transfer.get((dev, b.to), 1.0)
            self.sent[dev] = self.sent.get(dev, 0.0) + nbytes
            self.received[b.to] = self.received.get(b.to, 0.0) + nbytes
            self.events.append({"device": dev, "kind": "transfer", "what": f"{b.tensor} -> {b.to}", "start_ms": t,
                                "end_ms": t + ms, "tensor": b.tensor, "src": dev, "dst": b.to,
                                "resource": "channel" if self.shared else f"uplink:{dev}"})
            t += ms
            self.arrived[(b.name, dev, b.to)] = t
        self.clock[dev] = t
        if self.shared:
            self.channel = t
