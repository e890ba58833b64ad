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

Approximations: a device's messaging (ZeroMQ's encryption and copies, inside the same quota) is not drawn from
its burst; a spatial stage's tiles are timed at the share; a device of t threads (its `threads`, 1 when unset)
runs its burst on t cores at once.
"""

from __future__ import annotations

from ..plan_types import Plan
from .table import CostTable

__all__ = ["bursting_devices", "lone_stage_ms"]


def bursting_devices(cost: CostTable) -> dict[str, tuple[float, int, float]]:
    """{device: (quota cores, threads, burst CPU ms)} of the devices whose quota is below their threads and
    whose profile measured a burst (`cpu_quota.burst_ms`), sharing no machine (`hosts:` prices those)."""
    out = {}
    for d in cost.cluster.devices:
        p = d.profile
        q, burst, t = p.cpu_quota_cores, p.cpu_quota_burst_ms, d.threads or 1
        if d.host is None and q is not None and burst is not None and q < t:
            out[d.name] = (q, t, burst)
    return out


def lone_stage_ms(plan: Plan, cost: CostTable, stage_ms: tuple[float, ...], spatial: dict) -> tuple[float, ...]:
    """Per stage, its compute in a lone request: `stage_ms` (priced at the share), except a pipeline stage of
    a bursting device, whose CPU (its price times the quota) runs at full speed on its t threads while the
    device's burst lasts (spent by its stages in order) and at the share beyond."""
    bursting = bursting_devices(cost)
    if not bursting:
        return stage_ms
    left = {d: burst for d, (_, _, burst) in bursting.items()}
    out = []
    for k, (s, ms) in enumerate(zip(plan.stages, stage_ms)):
        if k in spatial or s.device not in bursting:
            out.append(ms)
            continue
        q, t, _ = bursting[s.device]
        cpu = ms * q
        fast = min(cpu, left[s.device])
        left[s.device] -= fast
        out.append(fast / t + (cpu - fast) / q)
    return tuple(out)
