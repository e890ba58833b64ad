"""Cross-checks of a parsed manifest's schedule: references, per-device dataflow, send/recv pairs, deadlock."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable, NoReturn

from .types import HOST, Concat, Free, Manifest, Recv, Run, Send, Slice, Step

__all__ = ["validate_schedule", "host_feeds", "host_collects", "working_devices", "recv_keys", "send_targets",
           "pipeline_depth"]

logger = logging.getLogger(__name__)

Fail = Callable[[str, str], NoReturn]


def validate_schedule(m: Manifest, fail: Fail) -> None:
    """Raise (through `fail(where, problem)`) on the first inconsistency in the manifest's schedule."""
    _check_references(m, fail)
    for device, steps in m.steps.items():
        _check_dataflow(m, device, steps, fail)
    _check_pairs(m, fail)
    _check_host(m, fail)
    _check_deadlock(m, fail)


def host_feeds(m: Manifest) -> list[tuple[str, str]]:
    """(device, input name) for every recv from the host, in schedule order."""
    return [(dev, s.tensor) for dev, steps in m.steps.items() for s in steps if isinstance(s, Recv) and s.src == HOST]


def host_collects(m: Manifest) -> dict[str, str]:
    """Output name -> the device that sends it to the host."""
    return {s.name: dev for dev, steps in m.steps.items() for s in steps if isinstance(s, Send) and s.to == HOST}


def working_devices(m: Manifest) -> tuple[str, ...]:
    """The devices with at least one step, in the manifest's order: the only ones that need a worker."""
    return tuple(d for d in m.device_names if m.steps.get(d))


def recv_keys(m: Manifest, device: str) -> set[tuple[str, str]]:
    """(sender, name) of every tensor `device` receives per request: what its inbox may accept."""
    return {(s.src, s.tensor) for s in m.steps.get(device, ()) if isinstance(s, Recv)}


def send_targets(m: Manifest, device: str) -> set[str]:
    """The devices `device` sends tensors to (not the host)."""
    return {s.to for s in m.steps.get(device, ()) if isinstance(s, Send) and s.to != HOST}


def pipeline_depth(m: Manifest) -> int:
    """How many requests can usefully be in flight: one per resource on the schedule's longest chain of
    hand-offs, counting each device-to-device link as a resource of its own and the coordinator's hand-offs
    of the model's inputs in and its outputs out as two more (the cost model's throughput is that of its
    busiest device, link or coordinator, with transfers overlapping computation), and at most the working
    devices plus the links they use plus those two. The chain is measured by running the schedule in
    synchronous rounds, every device advancing until it waits for a tensor sent in the same round: a
    two-stage pipeline takes 2 rounds, so the input in, 2 devices, the link between them and the output
    out: 5; one device: 3 (the next request's input arrives while it computes); a spatial stage that
    scatters to one other device and gathers back takes 3 rounds (7 resources), capped at 2 devices,
    their link and the two hand-offs: 5.
    Measured on a 2-core machine (two 1-thread workers and the coordinator), a two-stage MobileNetV2 streamed
    at 287-334/s with 3 in flight, 300-346 with 5 and 347-362 with 6 (predicted 364); one device at 182-195/s
    one at a time and 222-240 with 3 in flight (its compute alone, 4.15 ms: 241/s)."""
    pc = dict.fromkeys(m.steps, 0)
    delivered: set[tuple[str, str, str]] = set()
    rounds = 0
    while any(pc[d] < len(steps) for d, steps in m.steps.items()):
        rounds += 1
        sent: set[tuple[str, str, str]] = set()
        _advance(m, pc, delivered, sent)
        if not sent and any(pc[d] < len(steps) for d, steps in m.steps.items()):
            break  # a deadlock, which validation refuses before this is ever asked
        delivered |= sent
    links = {frozenset((dev, s.to)) for dev, steps in m.steps.items() for s in steps
             if isinstance(s, Send) and s.to != HOST}
    return max(1, min(2 * rounds + 1, len(working_devices(m)) + len(links) + 2))


def _advance(m: Manifest, pc: dict[str, int], delivered: set, sent: set) -> bool:
    """Run every device's steps on from pc[device] as far as they go: a recv from another device waits
    until its (src, dst, tensor) is in `delivered`; a send to another device adds its key to `sent`
    (pass `delivered` itself to make sends visible at once). True if any step ran."""
    moved = False
    for device, steps in m.steps.items():
        while pc[device] < len(steps):
            step = steps[pc[device]]
            if isinstance(step, Recv) and step.src != HOST and (step.src, device, step.tensor) not in delivered:
                break
            if isinstance(step, Send) and step.to != HOST:
                sent.add((device, step.to, step.name))
            pc[device] += 1
            moved = True
    return moved


def _check_references(m: Manifest, fail: Fail) -> None:
    devices = set(m.device_names)
    for frag in m.fragments.values():
        if frag.device not in devices:
            fail(f"fragment {frag.id}", f"unknown device {frag.device!r}")
    for out in m.outputs:
        if out.device not in devices:
            fail(f"output {out.name}", f"unknown device {out.device!r}")
    for i, lk in enumerate(m.network.links):
        for end in (lk.a, lk.b):
            if end not in devices:
                fail(f"network.links[{i}]", f"unknown device {end!r}")
    for i, tr in enumerate(m.transfers):
        for end in (tr.src, tr.dst):
            if end not in devices:
                fail(f"transfers[{i}]", f"unknown device {end!r}")
    for device in m.steps:
        if device not in devices:
            fail(f"steps.{device}", "steps for an unknown device")


class _Store:
    """The names in one device's tensor store while its steps are walked in order."""

    def __init__(self, device: str, fail: Fail):
        self.device, self.fail, self.names, self.where = device, fail, set(), ""

    def need(self, name: str) -> None:
        if name not in self.names:
            self.fail(self.where, f"tensor {name!r} is not in {self.device}'s store at this step "
                                  "(never received or produced, or freed)")

    def put(self, name: str) -> None:
        if name in self.names:
            self.fail(self.where, f"tensor {name!r} is already in {self.device}'s store (duplicate name; free it first)")
        self.names.add(name)


def _check_dataflow(m: Manifest, device: str, steps: tuple[Step, ...], fail: Fail) -> None:
    """Walk the steps in order tracking the device's tensor store, as the worker will."""
    store = _Store(device, fail)
    for i, step in enumerate(steps):
        store.where = f"steps.{device}[{i}] ({type(step).__name__.lower()})"
        if isinstance(step, Run):
            _check_run(m, device, step, store, fail)
        elif isinstance(step, (Send, Recv)):
            peer = step.to if isinstance(step, Send) else step.src
            if peer == device or (peer != HOST and peer not in m.device_names):
                fail(store.where, "a device cannot talk to itself" if peer == device else f"unknown peer device {peer!r}")
            if isinstance(step, Send):
                store.need(step.tensor)
            else:
                store.put(step.tensor)
        elif isinstance(step, (Slice, Concat)):
            for name in (step.tensor,) if isinstance(step, Slice) else step.parts:
                store.need(name)
            store.put(step.as_name)
        elif isinstance(step, Free):
            for name in step.tensors:
                store.need(name)
                store.names.discard(name)


def _check_run(m: Manifest, device: str, step: Run, store: _Store, fail: Fail) -> None:
    frag = m.fragments.get(step.fragment)
    if frag is None:
        fail(store.where, f"unknown fragment {step.fragment!r}")
    if frag.device != device:
        fail(store.where, f"fragment {frag.id} belongs to device {frag.device}, not {device}")
    for name in frag.inputs:
        if name not in frag.state_inputs:  # a generative build's state: the device keeps it, step to step
            store.need(name)
    for name in frag.outputs:
        store.put(name)


def _check_pairs(m: Manifest, fail: Fail) -> None:
    """Every device-to-device send has exactly one recv, keyed by (src, dst, name as received)."""
    sends = Counter((dev, s.to, s.name) for dev, steps in m.steps.items() for s in steps
                    if isinstance(s, Send) and s.to != HOST)
    recvs = Counter((s.src, dev, s.tensor) for dev, steps in m.steps.items() for s in steps
                    if isinstance(s, Recv) and s.src != HOST)
    for (src, dst, name), n in sends.items():
        if n > 1:
            fail(f"steps.{src}", f"tensor {name!r} is sent to {dst} {n} times per request (duplicate)")
        if (src, dst, name) not in recvs:
            fail(f"steps.{src}", f"send of {name!r} to {dst} has no matching recv on {dst}")
    for (src, dst, name) in recvs:
        if (src, dst, name) not in sends:
            fail(f"steps.{dst}", f"recv of {name!r} from {src} has no matching send on {src}")


def _check_host(m: Manifest, fail: Fail) -> None:
    inputs = {t.name for t in m.inputs}
    for device, name in host_feeds(m):
        if name not in inputs:
            fail(f"steps.{device}", f"recv of {name!r} from {HOST}, which is not a model input")
    sent = Counter(s.name for steps in m.steps.values() for s in steps if isinstance(s, Send) and s.to == HOST)
    collects = host_collects(m)
    for name, n in sent.items():
        if n > 1:
            fail("steps", f"output {name!r} is sent to {HOST} {n} times (duplicate)")
    declared = {o.name: o for o in m.outputs}
    for name, device in collects.items():
        if name not in declared:
            fail(f"steps.{device}", f"send of {name!r} to {HOST}, which is not a model output")
        if declared[name].device != device:
            fail(f"steps.{device}", f"output {name!r} is declared on {declared[name].device} but sent by {device}")
    for name, out in declared.items():
        if name not in collects:
            fail(f"output {name}", f"no step sends it to {HOST} (expected a send on {out.device})")
    unused = inputs - {name for _, name in host_feeds(m)}
    if unused:
        logger.warning("%s: model input(s) %s are never received by any device", m.path, sorted(unused))


def _check_deadlock(m: Manifest, fail: Fail) -> None:
    """Simulate the schedule with non-blocking sends and blocking recvs; all devices must finish."""
    pc = dict.fromkeys(m.steps, 0)
    delivered: set[tuple[str, str, str]] = set()
    while _advance(m, pc, delivered, delivered):
        pass
    stuck = [f"{dev} waits at step {i} for {m.steps[dev][i].tensor!r} from {m.steps[dev][i].src}"
             for dev, i in pc.items() if i < len(m.steps[dev])]
    if stuck:
        fail("steps", "schedule deadlocks: " + "; ".join(stuck))
