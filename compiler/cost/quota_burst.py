"""A lone request on a device under a CPU quota: its work runs at full speed until the quota's first stall.

A CFS quota is a budget of CPU per period.  A device's figures, profiled under its quota, follow the share
(runtime/profile/quota.py: samples span many periods), which is how fast it streams: requests back to back
spend the budget as it comes.  A request that finds the device idle spends the budget at full speed first:
up to `cpu_quota.burst_ms` of CPU (the profile's burst probe: the CPU a thread ran after idle before its first
stall; about two quotas on Linux, the period's own and what the kernel's per-CPU slices kept), and only the work
beyond it goes at the share.  Measured on the testbed (tests/netbed_limits.py), ShuffleNet's 3.4 ms on a
0.25-core host after idle: 6.0 ms at a 5 ms period (this model: 2.5 + 0.9 / 0.25 = 6.1), 3.9 ms at 10 ms
(3.4), against 13.6 ms at the share.  A four-stage decoder on hosts of 0.35 cores gave a token every 4.6 ms
where the figures at the share said 9.9.

What the cost model does with it (evaluate.py): the stages' compute in a lone request's timeline is
`lone_ms`, each device's burst spent in stage order; and a request cannot follow the one before faster than
any quota'd device's period (its compute and messaging at the share, cpu_bounds.py `quota_periods`), so the
latency of requests one after another (what `edgec run --inflight 1` and a generation of one sequence see) is
at least that period.  Throughput is unchanged: streaming, the budget is spent as fast as it comes.

The planners' DPs price every stage at the share (an upper bound of a lone request's compute there), and
evaluate, which ranks their best plans, times the burst; so on such devices a latency plan is the best of
the DP's top plans as evaluate times them, and the generative planner reports its plans as not exact.

A lone request's messages to and from such a device go at full speed too: their bytes at the profile's CPU
figure (`message_cpu_ms_per_mb`, the runtime's work timed on one CPU) rather than at `message_ms_per_mb`, which
the profile times back to back and so follows the share (DeviceSpec.lone_runtime; CostTable.lone_network prices
the timeline's messages and hand-offs with it, and the links' periods stay at the share).  Measured on the
testbed: a 256 KiB hand-off between two idle 0.3-core hosts took 0.93 ms, where the share's figure (8.3 ms per
MB) said 2.4.

A spatial stage's timeline is run twice: at the share for what it holds its devices for while inputs stream
(its spans, its compute, the links' transfers), and as a lone request meets it for the latency: each tile on a
bursting device spends that device's burst, and its scatter, halo and gather messages go at the lone request's
figures (stage_timeline.py `run_stage`, `burst=`).

Approximations: a device's messaging (ZeroMQ's encryption and copies, inside the same quota) is not drawn from
its burst; a device of t threads (its `threads`, 1 when unset) runs its burst on t cores at once.
"""

from __future__ import annotations

from typing import Callable

from ..plan_types import Plan
from .table import CostTable

__all__ = ["Burst", "bursting_devices", "lone_stage_ms"]


def bursting_devices(cost: CostTable) -> dict[str, tuple[float, int, float]]:
    """{device: (quota cores, threads, burst CPU ms)} of the devices whose quota is below their threads and
    whose profile measured a burst (`cpu_quota.burst_ms`), sharing no machine (`hosts:` prices those)."""
    return {d.name: d.quota_burst for d in cost.cluster.devices if d.quota_burst is not None}


class Burst:
    """What is left of each bursting device's burst as one lone request spends it (`spend`)."""

    def __init__(self, cost: CostTable):
        self.devices = bursting_devices(cost)
        self.left = {d: burst for d, (_, _, burst) in self.devices.items()}

    def spend(self, device: str, ms: float) -> float:
        """The time of `ms` of work priced at the share on `device` when a lone request runs it: its CPU (ms
        times the quota) at full speed on its t threads while the burst lasts, the rest at the share."""
        if device not in self.devices:
            return ms
        q, t, _ = self.devices[device]
        cpu = ms * q
        fast = min(cpu, self.left[device])
        self.left[device] -= fast
        return fast / t + (cpu - fast) / q


def lone_stage_ms(plan: Plan, cost: CostTable, stage_ms: tuple[float, ...], spatial: dict,
                  lone_spatial: Callable[[int, Burst], float] | None = None) -> tuple[float, ...]:
    """Per stage, its compute in a lone request: `stage_ms` (priced at the share), except on a bursting
    device, whose work runs at full speed while the device's burst lasts (`Burst`, spent in stage order) and
    at the share beyond.  A spatial stage's time is `lone_spatial(k, burst)` (its timeline with the tiles'
    bursts and a lone request's messages, evaluate.py), or its `stage_ms` without it."""
    if not bursting_devices(cost):
        return stage_ms
    burst = Burst(cost)
    out = []
    for k, (s, ms) in enumerate(zip(plan.stages, stage_ms)):
        if k in spatial:
            out.append(ms if lone_spatial is None else lone_spatial(k, burst))
        else:
            out.append(burst.spend(s.device, ms))
    return tuple(out)
