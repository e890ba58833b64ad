"""Contention-aware send order: a spatial stage's exchanges (the scatter, the halo exchanges, the gather),
and a stage's burst of messages to several later stages.

Spatial stages. In an exchange every holder of the tensor sends each receiver the rows it needs, one
message after another on the holder's uplink (switched network) or on the one channel (shared medium).
Which receiver a holder serves first decides when each tile can start: the need order (tile order) that
the emitter used to fix can leave the slowest tile device waiting behind messages to devices that finish
early anyway.

The decision, exchange by exchange in the stage's timeline (stage_timeline.run_stage), greedy with a look at the
whole stage: at each exchange a few candidate orders are timed over the whole stage (the exchanges after
it in need order) and the best stays, need order on ties. The candidates:
- The exchange's own best (`exchange_order`), for this objective: max over the stage's devices of (when
  it may start its next tile: its own sends done and its rows arrived) + its remaining work (its compute
  in this and every later segment), the makespan if later exchanges cost nothing (critical path).
  - One sender (the scatter): longest remaining work first (Jackson's rule), which is exact for it: the
    messages share one link or the channel from one start, and a receiver's start is the end of its
    message (or its own clock, which no order moves), so this is one machine with delivery times.
  - Several senders, exact when the choices are few: every combination of each holder's send order (the
    product of the factorials of each holder's message counts) is tried when there are at most
    EXACT_LIMIT (5040, as many as the orders of 7 sends), by replaying the exchange under the timeline's
    state. Brute force rather than an LP or CP-SAT model: the counts that occur are small (halo messages
    to at most 2 neighbours per holder, or 8 on a grid), a replay is exact under the very model
    `evaluate` and `simulate` use (the channel's first-come-first-served bursts included), and it needs
    no solver.
  - Beyond that, each holder sends first to the receiver with the longest remaining work (Jackson's rule
    for each holder alone; holders that share a receiver or the channel make it inexact).
- Shortest remaining work first: on a shared channel the critical-path order can backfire, as the tiles
  served first finish first and their next messages (halo, gather) hold the channel while the slow tile's
  wait; timing the stage whole catches it.

Bursts (`order_bursts`). After it computes, a stage (a pipeline stage, or a spatial stage once gathered)
sends what later stages need as one burst: its outputs and the tensors it passes on, in `hops` order
(receiving stage, then producer). When they go to several stages on other devices (multi-tensor cuts,
skip connections, a hybrid plan's gather followed by sends), the order decides when each receiver can
start. Stage by stage in stage order, candidate orders of the burst are each timed over the plan's whole
timeline (evaluate's `_Flow`, the model `evaluate` reports and the replay of the manifest follows) and the
best stays, `hops` order on ties. The candidates:
- Messages to one stage stay together and the ones that stay on the sender's device go last: a stage
  starts after its last message, so splitting a stage's messages only delays the others'. On a switched
  network, where the timeline is monotone in when each stage gets its inputs, every order is dominated by
  its grouped one; on a shared channel a stage served earlier may take the channel first and delay a
  more critical burst, so there it is a restriction of the search (the guarantee below still holds).
- Every order of the receiving stages when there are at most 7 (EXACT_LIMIT orders), exact for the burst
  given the others on a switched network: brute force for the reasons above (the counts that occur are
  small: in the benchmark's plans at most 5 receiving stages, the transformer's attention mask sent
  direct to every stage that reads it).
- Beyond that, longest remaining work first (its compute, then the longest chain of message + remaining
  work after it: Jackson's rule) and shortest first (on a shared channel the stages served first take the
  channel for their own bursts sooner).
`hops` order is receiving-stage order, which is already the best wherever each stage waits for the one
before it (a chain); another order pays where a later stage does not wait for the earlier ones, e.g. a
branch placed on a slower device than the branch before it.

Across senders nothing is decided statically: on a shared medium, bursts take the channel in the order
their holders are ready (the coordinator arbitrates first come first served at run time, runtime/coordinator/emulate.py),
which a static order cannot change; the timelines model it so (stage_timeline.py within a spatial stage, evaluate's
`_Flow` between stages, runtime/manifest/replay.py for the manifest).

Guarantee: a candidate is kept only when the result is better with it: a lower latency and no device held
longer (`span_ms` for a stage, `bottleneck_ms` for the plan: what throughput sees), or the same latency and
the longest hold shorter (`better`). So the result is never predicted worse than need order or `hops`
order; when nothing is better, `order_stage` returns None, `order_bursts` nothing, and the plan is emitted
exactly as before.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, NamedTuple, Sequence

from ..graph import LayerGraph
from ..plan_types import Stage
from .table import CostTable
from .stage_timeline import StageWork, run_stage

__all__ = ["EXACT_LIMIT", "Message", "better", "order_bursts", "order_stage", "exchange_order"]

EXACT_LIMIT = 5040

# per exchange: None (need order) or, per holder, the needs' indices in send order
StageOrder = tuple[tuple[tuple[int, ...], ...] | None, ...]


def order_stage(stage: Stage, graph: LayerGraph, cost: CostTable) -> tuple[dict, StageOrder | None]:
    """(the stage's timeline, its send orders): the contention-aware orders when they predict a better
    stage than need order, else need order's timeline and None.

    Exchange by exchange, each candidate order (`_candidates`) is timed over the whole stage, the exchanges
    after it in need order; the best stays (need order on ties), so each step is no worse than the last."""
    work = StageWork.build(stage, graph, cost)
    tails = _tails(work)
    fixed = _run(stage, graph, cost, work, [])
    best, orders = fixed, []
    for j in range(len(work.segments) + 1):
        per_cell = work.segments[j][1] if j < len(work.segments) else work.out_bytes  # the gather: output rows
        found: list = []
        _run(stage, graph, cost, work, orders,
             lambda tl, holders, needs: found.extend(_candidates(tl, holders, needs, per_cell, tails[j])))
        pick = None
        for order in found:
            trial = _run(stage, graph, cost, work, [*orders, order])
            if _better(trial, best):
                best, pick = trial, order
        orders.append(pick)
    return (fixed, None) if best is fixed else (best, tuple(orders))


def _run(stage: Stage, graph: LayerGraph, cost: CostTable, work: StageWork, orders: list, probe=None) -> dict:
    """The stage's timeline with exchange j's sends in orders[j] (None: need order), and need order after
    them; `probe(timeline, holders, needs)` sees the state at the first exchange beyond `orders`."""
    def choose(j, tl, holders, needs):
        if j < len(orders):
            return orders[j]
        if j == len(orders) and probe is not None:
            probe(tl, holders, needs)
        return None
    return run_stage(stage, graph, cost, work, choose)


def _candidates(tl, holders, needs, per_cell: float, tail: dict[str, float]) -> list:
    """Orders worth timing over the whole stage: the exchange's own best (exchange_order), and each
    holder's sends shortest remaining work first, which on a shared channel lets the tiles that finish
    first take the channel for the next exchange before the slow ones need it."""
    own = exchange_order(tl, holders, needs, per_cell, tail)
    sends = [_sent(h, needs, range(len(needs))) for h in holders]
    shortest = tuple(_complete(sorted(m, key=lambda n: tail.get(needs[n][0], 0.0)), len(needs)) for m in sends)
    moot = tuple(tuple(m) for m in sends)  # need order
    return list(dict.fromkeys(o for o in (own, shortest)
                              if tuple(tuple(_sent(h, needs, p)) for h, p in zip(holders, o)) != moot))


def _sent(holder, needs, order) -> list[int]:
    """The needs, in `order`, to which the holder sends a message."""
    return [n for n in order if needs[n][0] != holder[0] and _overlaps(holder[1], needs[n][1])]


def _better(trial: dict, fixed: dict) -> bool:
    """A stage's timeline against another's (`better`), its longest hold the longest span."""
    return better(trial["latency_ms"], max(trial["span_ms"].values()), fixed["latency_ms"], max(fixed["span_ms"].values()))


def better(latency: float, held: float, was_latency: float, was_held: float) -> bool:
    """Lower latency and the longest hold (of a device or link: what throughput sees) no longer, or the
    same latency and the longest hold shorter."""
    if latency < was_latency:
        return held <= was_held
    return latency == was_latency and held < was_held


def _tails(work: StageWork) -> list[dict[str, float]]:
    """Per exchange (before each segment, then the gather): each device's compute from there on."""
    tails = [{}]
    for _, _, tiles in reversed(work.segments):
        tail = dict(tails[0])
        for d, _, _, ms in tiles:
            tail[d] = tail.get(d, 0.0) + ms
        tails.insert(0, tail)
    return tails


def exchange_order(tl, holders, needs, per_cell: float, tail: dict[str, float]) -> tuple[tuple[int, ...], ...]:
    """Per holder, the needs' indices in the order it should send (see the module docstring): exact over
    every combination when there are at most EXACT_LIMIT, else longest remaining work first."""
    ms = [{n: _message_ms(tl.cost, src, have, dst, need, per_cell) for n, (dst, need) in enumerate(needs)
           if dst != src and _overlaps(have, need)} for src, have in holders]
    senders = sum(1 for m in ms if m)
    if senders == 1 or math.prod(math.factorial(len(m)) for m in ms) > EXACT_LIMIT:
        return tuple(_complete(sorted(m, key=lambda n: -tail.get(needs[n][0], 0.0)), len(needs)) for m in ms)
    replay = _ExchangeReplay(tl, holders, needs, ms, tail)
    best, best_key = None, None
    for combo in itertools.product(*(itertools.permutations(m) for m in ms)):  # need order comes first
        key = replay.makespan(combo)
        if best_key is None or key < best_key:
            best, best_key = combo, key
    return tuple(_complete(list(c), len(needs)) for c in best)


def _complete(first: list[int], n: int) -> tuple[int, ...]:
    """A permutation of range(n): `first`, then the needs it leaves out (no message: order is moot)."""
    return (*first, *(k for k in range(n) if k not in first))


def _overlaps(have, need) -> bool:
    return all(min(s1, n1) > max(s0, n0) for (s0, s1), (n0, n1) in zip(have, need))


def _message_ms(cost: CostTable, src: str, have, dst: str, need, per_cell: float) -> float:
    """The message's time as _Timeline.exchange prices it."""
    nbytes = int(round(math.prod(min(s1, n1) - max(s0, n0) for (s0, s1), (n0, n1) in zip(have, need)) * per_cell))
    return cost.transfer_ms(nbytes, src, dst)


class _ExchangeReplay:
    """_Timeline.exchange reduced to what one candidate order changes, with every message priced once:
    the search replays it for each combination."""

    def __init__(self, tl, holders, needs, ms: list[dict[int, float]], tail: dict[str, float]):
        self.clock, self.channel, self.shared = tl.clock, tl.channel, tl.cost.cluster.medium == "shared"
        self.rank = sorted(range(len(holders)), key=lambda e: (tl.clock[holders[e][0]], holders[e][1]))
        self.src = [h[0] for h in holders]
        self.dst = [n[0] for n in needs]
        self.ms, self.tail = ms, tail

    def makespan(self, combo) -> tuple[float, float]:
        """(max, sum) over the devices of when each may start its next tile after the exchange plus its
        remaining work; the sum breaks ties towards more slack for the exchanges after this one."""
        clock, chan, ready = dict(self.clock), self.channel, {}
        for e in self.rank:
            src, ms = self.src[e], self.ms[e]
            for n in combo[e]:
                end = (max(clock[src], chan) if self.shared else clock[src]) + ms[n]
                clock[src] = end
                chan = end if self.shared else chan
                if end > ready.get(self.dst[n], 0.0):
                    ready[self.dst[n]] = end
        ends = [max(c, ready.get(d, 0.0)) + self.tail.get(d, 0.0) for d, c in clock.items()]
        return max(ends), sum(ends)


class Message(NamedTuple):
    """One message of a stage's burst, as the burst order search sees it."""

    to: int  # the receiving stage
    ms: float
    wire: bool  # False: the receiving stage is on the sender's device, nothing is sent


# a candidate's (latency, the sum of the stages' ready times) over the plan's whole timeline
Timeline = Callable[[dict[int, tuple[int, ...]]], tuple[float, float]]

_TIE_MS = 1e-9  # a candidate must gain more than float noise to displace the order before it


def order_bursts(bursts: dict[int, list[Message]], stage_ms: Sequence[float], timeline: Timeline
                 ) -> dict[int, tuple[int, ...]]:
    """{stage: its messages' indices in send order} for the stages whose burst is better in another order
    than the given one (see the module docstring); empty when none is.

    Stage by stage in stage order, each candidate order of the stage's burst is timed over the plan's
    whole timeline (`timeline`, with the bursts already chosen and the given order for the rest), and
    kept when it lowers the latency or, at the same latency, the sum of the stages' ready times (more
    slack for the bursts after it); the given order on ties. The caller keeps the result only if the
    whole plan is better with it (`better`), so ties at the end go back to the given order too."""
    tails = _stage_tails(bursts, stage_ms)
    orders: dict[int, tuple[int, ...]] = {}
    best = timeline(orders)
    for k in sorted(bursts):
        pick = None
        for order in _burst_candidates(bursts[k], tails):
            trial = timeline({**orders, k: order})
            if trial[0] < best[0] - _TIE_MS or (trial[0] <= best[0] + _TIE_MS and trial[1] < best[1] - _TIE_MS):
                best, pick = trial, order
        if pick is not None:
            orders[k] = pick
    return orders


def _stage_tails(bursts: dict[int, list[Message]], stage_ms: Sequence[float]) -> list[float]:
    """Per stage, its remaining work: its compute, then the longest chain of message + remaining work
    of a stage it sends to (the critical path from it, ignoring contention)."""
    tails = list(stage_ms)
    for k in reversed(range(len(stage_ms))):
        tails[k] += max((m.ms + tails[m.to] for m in bursts.get(k, [])), default=0.0)
    return tails


def _burst_candidates(msgs: list[Message], tails: list[float]):
    """Orders of one burst worth timing, none of them the given order. Messages to one stage go
    together in the given order (a stage waits for its last one, so splitting them only delays the
    others), and the ones that stay on the device go last (in the runtime that device's later stages
    run after the whole burst anyway). The receiving stages in every order when there are at most 7
    (EXACT_LIMIT orders); beyond that, longest remaining work first (Jackson's rule) and shortest first
    (on a shared channel, the stages served first send their own bursts sooner)."""
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(msgs):
        if m.wire:
            groups.setdefault(m.to, []).append(i)
    if len(groups) < 2:
        return
    local = tuple(i for i, m in enumerate(msgs) if not m.wire)
    stages = list(groups)
    if math.factorial(len(stages)) <= EXACT_LIMIT:
        perms = itertools.permutations(stages)
    else:
        perms = (sorted(stages, key=lambda b: -tails[b]), sorted(stages, key=lambda b: tails[b]))
    given = tuple(range(len(msgs)))
    for perm in perms:
        order = tuple(i for b in perm for i in groups[b]) + local
        if order != given:
            yield order
