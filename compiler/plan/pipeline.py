"""Exact pipeline planner: a layer-graph dynamic program over (blocks done, devices used, last device).

`plan_pipeline` is the planner (graph, cost, objective, options) -> [Plan]. It sets up its problem
(`pipeline_problem`: the chain of blocks between the graph's pipeline cuts, priced on every device, a
`PipelineProblem`) and
`solve_pipeline` splits the chain of blocks 0..B-1 into contiguous stages, gives every stage its own
device (any subset of the devices, in any order) and returns the `top_k` best placements that fit
memory, under the cost model of `PipelineProblem`. The pipeline baselines (baselines.py) and the
pipeline tails of hybrid plans (`PipelineTail`, for spatial.py) solve the same problem.

Formulation. A state is (j, m, a): blocks 0..j-1 are placed, `m` is the bitmask of the devices used and
`a` ran the last stage, which ends at j. A transition appends the stage [j, h) on a device b not in m:
it pays the transfer of cut j-1 from a to b and the compute of blocks j..h-1 on b. Device order is part
of the state, so every ordered subset of devices is searched; the answer is the best state with j = B.
Each state keeps labels, and a label is dropped only when at least k other labels of the same state are
at least as good under every possible completion, so the k best complete plans are exact:

  - latency, switched medium: a label is (latency, bottleneck), compared lexicographically. Latency is
    additive and the bottleneck a running max, so a lexicographically smaller label stays smaller after
    any common extension. The k smallest labels per state are kept (vectorised over all states of a
    given j with numpy).
  - throughput, switched medium: the objective (max term, latency) is not monotone under extension (a
    later large stage can hide an earlier difference in bottleneck), so it is solved in two exact passes
    of the same vectorised DP: (1) the k best bottleneck values (a min-max DP, which is monotone) give
    the bottleneck levels of the answer; every plan strictly below the highest level t is in the answer
    and comes out of that pass; (2) the latency DP restricted to stages and transfers <= t gives the
    best latencies at level t.
  - shared medium: the link term is the SUM of the transfers, so the bottleneck max(max compute,
    transfer sum) is not decomposable. A label is (latency, max compute, transfer sum) and each state
    keeps its k-Pareto set (entries dominated by fewer than k others; pareto.py). The search is bounded with an
    exact lower bound on the bottleneck (a parametric search over compute caps: min over c of
    max(c, least transfer sum with every stage <= c)) and an upper bound from plans already known.
    States that have used too many devices to cover the remaining blocks within the bound are dropped.
    With the latency objective, a label with a strictly smaller latency dominates regardless of the
    rest, so the Pareto step only resolves exact latency ties; when the (k+1)-th best latency differs
    from the k-th, the fast latency DP is already exact and the Pareto pass is skipped.

Symmetry: devices that are interchangeable bit for bit (same block_ms column, memory, machine, power
figures, and links to and from every other device) are only used in index order, which removes relabelled
copies of the same plan from the search without losing any cost; for top_k > 1 the copies are generated
back afterwards (they have identical costs), so the result equals the unrestricted search.  The planner
(`plan_pipeline`) asks for none of them back (`copies=False`): its top-K are K distinct plans.

Numerics: stage compute is summed with the same numpy reduction `PipelineProblem.evaluate` uses, and
transfers with the same expression, so bottleneck values are bit-identical to `evaluate`'s. Latency is
accumulated in a different order than `evaluate` (rounding differences ~1e-16 relative); returned plans
are always re-scored with `evaluate`. Transfers over a pair with zero bandwidth are treated as missing
links (never used).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..cost import CostTable
from ..graph import LayerGraph
from ..plan_types import Plan, Stage
from ..units import MB
from .pareto import pareto_dp
from .planner import InfeasibleError, PlanOptions
from .stats import count as count_work

__all__ = ["OBJECTIVES", "PipelineProblem", "StageChoice", "PipelineSolution", "pipeline_problem", "to_plan",
           "plan_pipeline", "solve_pipeline", "PipelineTail", "infeasible_message", "solution_sort_key",
           "validate_request"]

OBJECTIVES = ("latency", "throughput")

Span = tuple[int, int, int]  # (lo, hi, device): one stage of the DPs


# ----------------------------------------------------------------------------------------------------
# the problem


@dataclass(frozen=True, eq=False)
class PipelineProblem:
    """A chain of B blocks to place as contiguous stages on distinct devices.

    Cost model (all times in ms):
      - stage compute  = sum(block_ms[lo:hi, d])
      - stage memory   = sum(block_param_bytes[lo:hi]) + max(block_peak_act_bytes[lo:hi]); must be
                         <= device_mem_bytes[d]
      - transfer between consecutive stages on devices a -> b across the cut after block c: one
                         message per tensor crossing the cut, each bytes / bandwidth_bytes_per_ms[a, b]
                         + link_latency_ms[a, b] (a message of no bytes is free, as in the network
                         model), summed in cut_tensor_bytes[c] order; when cut_tensor_bytes is None, one
                         message of cut_bytes[c]
      - latency (one input)  = sum of stage compute + sum of transfers
      - bottleneck (pipelined) = max(max stage compute, link term) where the link term is the largest
                         transfer when medium == "switched" (each pair has its own link) and the sum of all
                         transfers when medium == "shared" (one channel carries every transfer)
      - throughput = 1000 / bottleneck (inputs per second)
    The runtime's per-request cost (network.py request_in_ms / request_out_ms, 0 without the profiles'
    figures) is part of the first stage (its device takes the model input) and of the last (it gives the
    output), in its latency and its period, as `evaluate` charges it: `request_in_ms[d]` /
    `request_out_ms[d]`, None for none. The bytes of the input and the output are outside the model.

    A tensor used beyond the next stage crosses every cut in between: it is priced as forwarded stage
    to stage (the emitter sends it so, or straight from its producer when evaluate prices that no
    higher, so a plan never runs slower than its DP price).
    """

    devices: tuple[str, ...]
    block_ms: np.ndarray  # [B, D]
    block_param_bytes: np.ndarray  # [B]
    block_peak_act_bytes: np.ndarray  # [B]
    cut_bytes: np.ndarray  # [B-1], bytes crossing the cut after block c
    device_mem_bytes: np.ndarray  # [D]
    bandwidth_bytes_per_ms: np.ndarray  # [D, D]
    link_latency_ms: np.ndarray  # [D, D]
    medium: str = "switched"  # or "shared"
    cut_tensor_bytes: tuple[tuple[int, ...], ...] | None = None  # [B-1]: each crossing tensor's bytes
    request_in_ms: np.ndarray | None = None  # [D]: added to a stage that starts at block 0
    request_out_ms: np.ndarray | None = None  # [D]: added to a stage that ends at block B
    # [D]: what `evaluate` prices a device by beyond these arrays (DeviceSpec.traits: its machine and power
    # figures), compared for equality only.  Two devices are interchangeable only where these are equal too
    # (_device_classes).  None: nothing beyond the arrays
    traits: tuple | None = None

    def __post_init__(self) -> None:
        """Every per-device array has one entry per device, in the order of `devices`, and every per-block
        array one per block: a problem that could index past one of them is refused where it is built
        (ValueError), whoever builds it (pipeline_problem, the energy planner's columns, a suffix, a test)."""
        B, D = np.shape(self.block_ms)[0] if np.ndim(self.block_ms) == 2 else -1, len(self.devices)
        if np.ndim(self.block_ms) != 2 or np.shape(self.block_ms)[1] != D:
            raise ValueError(f"block_ms has shape {np.shape(self.block_ms)}, expected (blocks, {D}) for {D} devices")
        want = {
            "block_param_bytes": (B,), "block_peak_act_bytes": (B,), "cut_bytes": (max(B - 1, 0),),
            "device_mem_bytes": (D,), "bandwidth_bytes_per_ms": (D, D), "link_latency_ms": (D, D),
            "request_in_ms": (D,), "request_out_ms": (D,),
        }
        for name, shape in want.items():
            value = getattr(self, name)
            if value is not None and np.shape(value) != shape:
                raise ValueError(f"{name} has shape {np.shape(value)}, expected {shape}")
        if self.traits is not None and len(self.traits) != D:
            raise ValueError(f"traits has {len(self.traits)} entries, expected one per device ({D})")
        if self.cut_tensor_bytes is not None and len(self.cut_tensor_bytes) != max(B - 1, 0):
            raise ValueError(f"cut_tensor_bytes has {len(self.cut_tensor_bytes)} cuts, expected {max(B - 1, 0)}")

    def stage_ms(self, lo: int, hi: int, device: int) -> float:
        """A stage's compute, plus the per-request costs of the first and the last stage (in the order
        `evaluate` and the DP tables add them)."""
        ms = float(self.block_ms[lo:hi, device].sum())
        if lo == 0 and self.request_in_ms is not None:
            ms += float(self.request_in_ms[device])
        if hi == self.n_blocks and self.request_out_ms is not None:
            ms += float(self.request_out_ms[device])
        return ms

    @property
    def n_blocks(self) -> int:
        return int(self.block_ms.shape[0])

    @property
    def n_devices(self) -> int:
        return int(self.block_ms.shape[1])

    def transfer_ms(self, cut: int, src: int, dst: int) -> float:
        bw, lat = self.bandwidth_bytes_per_ms[src, dst], self.link_latency_ms[src, dst]
        if self.cut_tensor_bytes is None:
            return float(self.cut_bytes[cut] / bw + lat)
        total = 0.0
        for nbytes in self.cut_tensor_bytes[cut]:
            total += nbytes / bw + lat if nbytes > 0 else 0.0
        return float(total)

    def stage_memory(self, lo: int, hi: int) -> int:
        return int(self.block_param_bytes[lo:hi].sum() + self.block_peak_act_bytes[lo:hi].max())

    def evaluate(self, stages: tuple["StageChoice", ...]) -> "PipelineSolution":
        """Score a placement under the cost model (no feasibility check; see `fits`)."""
        compute = [self.stage_ms(s.lo, s.hi, s.device) for s in stages]
        transfers = [self.transfer_ms(a.hi - 1, a.device, b.device) for a, b in zip(stages, stages[1:])]
        link = (sum(transfers) if self.medium == "shared" else max(transfers)) if transfers else 0.0
        return PipelineSolution(
            stages=tuple(stages),
            latency_ms=sum(compute) + sum(transfers),
            bottleneck_ms=max(max(compute), link),
            stage_ms=tuple(compute),
            transfer_ms=tuple(transfers),
        )

    def fits(self, stages: tuple["StageChoice", ...]) -> bool:
        return all(self.stage_memory(s.lo, s.hi) <= self.device_mem_bytes[s.device] for s in stages)

    def suffix(self, first: int) -> "PipelineProblem":
        """The chain from block `first` on (its blocks renumbered from 0)."""
        return replace(self, block_ms=self.block_ms[first:], block_param_bytes=self.block_param_bytes[first:],
                       block_peak_act_bytes=self.block_peak_act_bytes[first:], cut_bytes=self.cut_bytes[first:],
                       cut_tensor_bytes=None if self.cut_tensor_bytes is None else self.cut_tensor_bytes[first:],
                       request_in_ms=self.request_in_ms if first == 0 else None)  # only block 0 takes the input


@dataclass(frozen=True)
class StageChoice:
    lo: int  # first block (inclusive)
    hi: int  # last block (exclusive)
    device: int  # index into PipelineProblem.devices


@dataclass(frozen=True)
class PipelineSolution:
    stages: tuple[StageChoice, ...]
    latency_ms: float
    bottleneck_ms: float
    stage_ms: tuple[float, ...]
    transfer_ms: tuple[float, ...]

    @property
    def throughput_ips(self) -> float:
        return 1000.0 / self.bottleneck_ms if self.bottleneck_ms > 0 else float("inf")

    def key(self, objective: str) -> tuple[float, float]:
        """Sort key: the objective first, the other measure as tie-break."""
        if objective == "latency":
            return (self.latency_ms, self.bottleneck_ms)
        return (self.bottleneck_ms, self.latency_ms)


def pipeline_problem(graph: LayerGraph, cost: CostTable) -> PipelineProblem:
    """Collapse the layer graph into the chain of blocks between its pipeline cuts, priced on every device."""
    blocks = graph.pipeline_blocks
    cluster, net = cost.cluster, cost.network
    n = len(cluster.devices)
    bw = np.ones((n, n))
    lat = np.zeros((n, n))
    for a, da in enumerate(cluster.devices):
        for b, db in enumerate(cluster.devices):
            if a != b:
                bw[a, b] = net.bytes_per_ms(da.name, db.name)
                lat[a, b] = net.latency_ms(da.name, db.name)
    return PipelineProblem(
        devices=cost.devices,
        block_ms=np.stack([cost.layer_ms[lo:hi].sum(axis=0) for lo, hi in blocks]),
        block_param_bytes=np.array([sum(graph.layers[i].param_bytes for i in range(lo, hi)) for lo, hi in blocks]),
        block_peak_act_bytes=np.array([graph.peak_activation_bytes(lo, hi) for lo, hi in blocks]),
        cut_bytes=np.array([graph.cut_bytes(hi) for _, hi in blocks[:-1]], dtype=np.float64),
        device_mem_bytes=np.array([d.usable_bytes for d in cluster.devices]),
        bandwidth_bytes_per_ms=bw,
        link_latency_ms=lat,
        medium=cluster.medium,
        traits=tuple(d.traits for d in cluster.devices),
        cut_tensor_bytes=tuple(tuple(graph.tensors[t].nbytes for t in graph.live_across(hi)) for _, hi in blocks[:-1]),
        **_request_costs(cost),
    )


def _request_costs(cost: CostTable) -> dict:
    """The problem's request_in_ms / request_out_ms: the runtime's per-request cost of each device, or
    nothing when no profile measured it (the tables are then what they were before the figures existed)."""
    net = cost.network
    r_in = np.array([net.request_in_ms(d) for d in cost.devices], dtype=np.float64)
    r_out = np.array([net.request_out_ms(d) for d in cost.devices], dtype=np.float64)
    return {"request_in_ms": r_in, "request_out_ms": r_out} if r_in.any() or r_out.any() else {}


def to_plan(sol: PipelineSolution, strategy: str, objective: str, graph: LayerGraph, problem: PipelineProblem) -> Plan:
    """A solution's block stages as a Plan of layer stages."""
    blocks = graph.pipeline_blocks
    stages = tuple(Stage(problem.devices[s.device], blocks[s.lo][0], blocks[s.hi - 1][1]) for s in sol.stages)
    return Plan(strategy, objective, stages).ensures(graph)


# ----------------------------------------------------------------------------------------------------
# public helpers shared with the baselines


def validate_request(problem: PipelineProblem, objective: str) -> None:
    """Raise ValueError on an unknown objective or malformed problem arrays."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if problem.medium not in ("switched", "shared"):
        raise ValueError(f"medium must be 'switched' or 'shared', got {problem.medium!r}")
    B, D = problem.n_blocks, problem.n_devices  # the shapes agree: PipelineProblem checked them
    if B < 1 or D < 1:
        raise ValueError(f"need at least one block and one device, got B={B}, D={D}")
    for name in ("block_ms", "block_param_bytes", "block_peak_act_bytes", "cut_bytes", "link_latency_ms"):
        arr = np.asarray(getattr(problem, name))
        if arr.size and (np.isnan(arr).any() or (arr < 0).any()):
            raise ValueError(f"{name} must be non-negative (and not NaN)")
    bw = np.asarray(problem.bandwidth_bytes_per_ms)
    if bw.size and (np.isnan(bw).any() or (bw < 0).any()):
        raise ValueError("bandwidth_bytes_per_ms must be non-negative (0 = no link)")
    _validate_cut_tensors(problem)


def _validate_cut_tensors(problem: PipelineProblem) -> None:
    per_cut = problem.cut_tensor_bytes
    if per_cut is None:
        return
    for c, sizes in enumerate(per_cut):
        if any(b < 0 for b in sizes):
            raise ValueError(f"cut_tensor_bytes[{c}] must be non-negative, got {sizes}")
        if sum(sizes) != problem.cut_bytes[c]:
            raise ValueError(f"cut_tensor_bytes[{c}] sums to {sum(sizes)}, but cut_bytes[{c}] is {problem.cut_bytes[c]}")


def solution_sort_key(sol: PipelineSolution, objective: str) -> tuple:
    """Total order used to rank plans: the objective key, then the stages (lo, hi, device) tuple."""
    return (*sol.key(objective), tuple((s.lo, s.hi, s.device) for s in sol.stages))


def infeasible_message(problem: PipelineProblem, max_stages: int | None = None) -> str:
    """One line saying how much memory the model needs and how much the cluster offers."""
    params = np.asarray(problem.block_param_bytes, dtype=np.float64)
    act = np.asarray(problem.block_peak_act_bytes, dtype=np.float64)
    mem = np.asarray(problem.device_mem_bytes, dtype=np.float64)
    weights, peak = float(params.sum()), float(act.max())
    need, total, largest = weights + peak, float(mem.sum()), float(mem.max())
    name = problem.devices[int(np.argmax(mem))]
    offer = f"the devices offer {total / MB:.1f} MB in total (largest {name}, {largest / MB:.1f} MB)"
    block_mem = np.array([problem.stage_memory(i, i + 1) for i in range(problem.n_blocks)], dtype=np.float64)
    worst = int(np.argmax(block_mem))
    if block_mem[worst] > largest:
        return (
            f"block {worst} alone needs {block_mem[worst] / MB:.1f} MB (weights {params[worst] / MB:.1f} MB"
            f" + activations {act[worst] / MB:.1f} MB) but the largest device ({name}) offers {largest / MB:.1f} MB,"
            f" so no split can fit it (the whole model needs at least {need / MB:.1f} MB; {offer})"
        )
    base = (
        f"model needs at least {need / MB:.1f} MB (weights {weights / MB:.1f} MB + peak activations"
        f" {peak / MB:.1f} MB) to fit across the cluster; {offer}"
    )
    if need > total:
        return base
    limit = f"at most {max_stages} " if max_stages is not None and max_stages < problem.n_devices else ""
    if _memory_feasible(problem, max_stages):
        return f"{base}; placements that fit memory exist but every one needs a missing link (zero bandwidth)"
    return f"{base}, but no split into {limit}contiguous stages fits each stage on its own device"


# ----------------------------------------------------------------------------------------------------
# tables


class _Tables:
    """Stage compute C[lo, hi, d] (inf when the stage does not fit d's memory) and transfers T[c, a, b]."""

    def __init__(self, problem: PipelineProblem, full: "_Tables | None" = None, first: int = 0):
        """The tables of `problem`; with `full`, those of the problem it is the suffix of (from block
        `first` on), sliced from `full` instead of summed again (the sums are the same numbers)."""
        if full is not None:
            self._slice(problem, full, first)
            return
        B, D = problem.n_blocks, problem.n_devices
        self.B, self.D = B, D
        bm = np.asarray(problem.block_ms, dtype=np.float64)
        bmT = np.ascontiguousarray(bm.T)  # [D, B]; window sums below match evaluate's slice sums bit for bit
        params = np.asarray(problem.block_param_bytes)
        act = np.asarray(problem.block_peak_act_bytes)
        dev_mem = np.asarray(problem.device_mem_bytes)
        C = np.full((B + 1, B + 1, D), np.inf)
        self.mem_ok = np.zeros((B + 1, B + 1, D), dtype=bool)
        for L in range(1, B + 1):
            lo = np.arange(B - L + 1)
            sums = sliding_window_view(bmT, L, axis=1).sum(axis=2)  # [D, B-L+1]
            stage_mem = sliding_window_view(params, L).sum(axis=1) + sliding_window_view(act, L).max(axis=1)
            if np.issubdtype(stage_mem.dtype, np.floating):
                stage_mem = np.trunc(stage_mem)  # stage_memory() applies int()
            ok = stage_mem[:, None] <= dev_mem[None, :]  # [B-L+1, D]
            self.mem_ok[lo, lo + L] = ok
            C[lo, lo + L] = np.where(ok, sums.T, np.inf)
        for first, extra in ((True, problem.request_in_ms), (False, problem.request_out_ms)):
            if extra is not None and np.any(np.asarray(extra) != 0):
                rows = C[0, :] if first else C[:, B]  # [hi or lo, D]: stages that start at 0 / end at B
                rows += np.asarray(extra, dtype=np.float64)[None, :]
        self.C = C
        self.T = _transfer_table(problem) if B > 1 else np.zeros((0, D, D))
        rowmin = bm.min(axis=1)
        self.lat_rest = np.concatenate([np.cumsum(rowmin[::-1])[::-1], [0.0]])  # lower bound, blocks j..B-1
        self.max_rest = np.concatenate([np.maximum.accumulate(rowmin[::-1])[::-1], [0.0]])
        self._symmetry(problem)

    def _slice(self, problem: PipelineProblem, full: "_Tables", first: int) -> None:
        # A window sum of blocks does not depend on where the window starts, and the suffix sums run
        # from the end: every slice is bit-identical to building the suffix's tables (test_plan_tail.py).
        self.B, self.D = full.B - first, full.D
        self.C, self.mem_ok = full.C[first:, first:], full.mem_ok[first:, first:]
        self.T = full.T[first:] if self.B > 1 else np.zeros((0, self.D, self.D))
        self.lat_rest, self.max_rest = full.lat_rest[first:], full.max_rest[first:]
        self._symmetry(problem)  # devices may be interchangeable on a suffix and not on the whole chain

    def _symmetry(self, problem: PipelineProblem) -> None:
        D = self.D
        self.cls = _device_classes(problem)
        same = self.cls[:, None] == self.cls[None, :]
        lower = same & (np.arange(D)[None, :] < np.arange(D)[:, None])  # [b, x]: x identical to b, x < b
        self.lower_same = (lower * (1 << np.arange(D))[None, :]).sum(axis=1).astype(np.int64)

    def replay(self, stages: list[Span]) -> tuple[float, float, float, float]:
        """(latency, max compute, max transfer, transfer sum) accumulated exactly as the DPs do."""
        lat = mc = mt = st = 0.0
        prev = None
        for lo, hi, d in stages:
            if prev is not None:
                t = float(self.T[lo - 1, prev, d])
                lat += t
                st += t
                mt = max(mt, t)
            c = float(self.C[lo, hi, d])
            lat += c
            mc = max(mc, c)
            prev = d
        return lat, mc, mt, st


def _transfer_table(problem: PipelineProblem) -> np.ndarray:
    """T[c, a, b] = problem.transfer_ms(c, a, b), bit for bit (the messages are added in the same order);
    inf where a == b or the link has no bandwidth."""
    bw = np.asarray(problem.bandwidth_bytes_per_ms, dtype=np.float64)[None]
    lat = np.asarray(problem.link_latency_ms, dtype=np.float64)[None]
    with np.errstate(divide="ignore", invalid="ignore"):
        if problem.cut_tensor_bytes is None:
            T = np.asarray(problem.cut_bytes)[:, None, None] / bw + lat
        else:
            per_cut = problem.cut_tensor_bytes
            sizes = np.zeros((len(per_cut), max(map(len, per_cut), default=0)))
            for c, row in enumerate(per_cut):
                sizes[c, :len(row)] = row
            T = np.zeros((len(per_cut), *bw.shape[1:]))
            for i in range(sizes.shape[1]):
                nb = sizes[:, i, None, None]
                T = T + np.where(nb > 0, nb / bw + lat, 0.0)
    T = np.asarray(T, dtype=np.float64)
    T[~np.isfinite(T)] = np.inf
    T[:, bw[0] == 0] = np.inf  # zero bandwidth: no link
    D = T.shape[1]
    T[:, np.arange(D), np.arange(D)] = np.inf
    return T


def _device_classes(problem: PipelineProblem) -> np.ndarray:
    """cls[d] = lowest index of the devices interchangeable with d (same block_ms column, memory, per-request
    costs, traits (machine, power figures), and links to and from every other device, bit for bit), so swapping
    them maps plans to equal-cost plans, here and in `evaluate`."""
    D = problem.n_devices
    bm = np.asarray(problem.block_ms)
    mem = np.asarray(problem.device_mem_bytes)
    mats = [np.asarray(problem.bandwidth_bytes_per_ms), np.asarray(problem.link_latency_ms)]
    off = ~np.eye(D, dtype=bool)
    cls = np.arange(D)
    for d in range(D):
        for r in range(d):
            if cls[r] != r or mem[r] != mem[d] or not np.array_equal(bm[:, r], bm[:, d]):
                continue
            if any(x is not None and x[r] != x[d]
                   for x in (problem.request_in_ms, problem.request_out_ms, problem.traits)):
                continue
            perm = np.arange(D)
            perm[[r, d]] = [d, r]
            if all(np.array_equal(x[np.ix_(perm, perm)][off], x[off]) for x in mats):
                cls[d] = r
                break
    return cls


class _Space:
    """The device masks the DPs visit: at most S devices, and identical devices taken in index order
    (a plan using a later copy of a device before an earlier one is a relabelling of a canonical plan)."""

    def __init__(self, tab: "_Tables", S: int):
        D = tab.D
        masks = np.arange(1 << D)
        pc = _popcount(masks)
        bits = 1 << np.arange(D)
        has = (masks[:, None] & bits[None, :]) != 0  # [M, D]
        low = tab.lower_same[None, :]
        canon = np.all(~has | ((masks[:, None] & low) == low), axis=1) & (pc <= S)
        self.masks = masks[canon]
        self.mid = np.full(1 << D, -1)
        self.mid[self.masks] = np.arange(self.masks.size)
        self.pc = pc[self.masks]
        self.has = has[self.masks]
        # can device b start the next stage after the devices in m?
        self.add_ok = ~self.has & ((self.masks[:, None] & low) == low) & (self.pc[:, None] < S)  # [nM, D]
        # (m, b) pairs a stage can end in: b in m and m without b is a mask that may add b
        pm, pb = np.nonzero(self.has)
        src = self.mid[self.masks[pm] ^ bits[pb]]
        ok = src >= 0
        ok[ok] = self.add_ok[src[ok], pb[ok]]
        self.pm, self.pb, self.psrc = pm[ok], pb[ok], src[ok]
        self.start = self.add_ok[self.mid[0]]  # devices that may run the first stage


def _popcount(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    n = np.zeros_like(x)
    while np.any(x):
        n += x & 1
        x = x >> 1
    return n


# ----------------------------------------------------------------------------------------------------
# vectorised lexicographic k-best DP


def _select_k(p: np.ndarray, s: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The K lexicographically smallest (p, s) along the last axis: (indices, p, s), each [..., K].

    Exhausted slots come back with p = s = inf. Ties go to the lower index (deterministic).
    """
    n = p.shape[-1]
    if K == 1 or n == 1:
        pm = p.min(axis=-1, keepdims=True)
        idx = np.where(p == pm, s, np.inf).argmin(axis=-1)[..., None]
        out_p = np.take_along_axis(p, idx, -1)
        out_s = np.where(np.isfinite(out_p), np.take_along_axis(s, idx, -1), np.inf)
        if K > 1:  # n == 1: pad
            pad = p.shape[:-1] + (K - 1,)
            idx = np.concatenate([idx, np.zeros(pad, dtype=idx.dtype)], -1)
            out_p = np.concatenate([out_p, np.full(pad, np.inf)], -1)
            out_s = np.concatenate([out_s, np.full(pad, np.inf)], -1)
        return idx, out_p, out_s
    # one stable sort by (p, s) instead of K rounds of min and mask: the same picks, index ties included
    idx = np.lexsort((s, p), axis=-1)[..., :K]
    out_p = np.take_along_axis(p, idx, -1)
    out_s = np.where(np.isfinite(out_p), np.take_along_axis(s, idx, -1), np.inf)
    if n < K:  # fewer candidates than slots: the rest are exhausted
        pad = p.shape[:-1] + (K - n,)
        idx = np.concatenate([idx, np.zeros(pad, dtype=idx.dtype)], -1)
        out_p = np.concatenate([out_p, np.full(pad, np.inf)], -1)
        out_s = np.concatenate([out_s, np.full(pad, np.inf)], -1)
    return idx, out_p, out_s


def _lex_dp(
    tab: _Tables,
    K: int,
    S: int,
    Cp: np.ndarray,
    Cs: np.ndarray,
    Tp: np.ndarray,
    Ts: np.ndarray,
    op_p,
    op_s,
) -> list[tuple[float, float, list[Span]]]:
    """K best plans by the lexicographic label (p, s), best first, as (p, s, stages).

    A stage [lo, hi) on d contributes Cp/Cs[lo, hi, d], a transfer over cut c from a to b Tp/Ts[c, a, b];
    labels combine with op_p / op_s (np.add or np.maximum). inf in Cp or Tp forbids that stage/transfer.
    Exact for the multiset of the K best p values, and for (p, s) whenever extension preserves the
    lexicographic order (p additive, s a running max). At most S stages; canonical device orders only.
    """
    B, D = tab.B, tab.D
    sp = _Space(tab, S)
    nM = sp.masks.size
    pm, pb, psrc = sp.pm, sp.pb, sp.psrc
    P = pm.size
    # W[m, b, j, q]: label after the transfer into b at block j (b not in m); V[m, a, h, r]: after a stage
    # on a ending at h. Masks are indices into sp.masks.
    Wp = np.full((nM, D, B, K), np.inf)
    Ws = np.full((nM, D, B, K), np.inf)
    Wa = np.zeros((nM, D, B, K), dtype=np.int32)
    Wr = np.zeros((nM, D, B, K), dtype=np.int32)
    Vp = np.full((nM, D, B + 1, K), np.inf)
    Vs = np.full((nM, D, B + 1, K), np.inf)
    Vi = np.zeros((nM, D, B + 1, K), dtype=np.int32)
    Vq = np.zeros((nM, D, B + 1, K), dtype=np.int32)
    Wp[sp.mid[0], sp.start, 0, 0] = 0.0
    Ws[sp.mid[0], sp.start, 0, 0] = 0.0
    w_forbid = ~sp.add_ok[:, :, None]  # [nM, D(b), 1]
    CpT = np.ascontiguousarray(Cp.transpose(2, 1, 0))  # [d, hi, lo]
    CsT = np.ascontiguousarray(Cs.transpose(2, 1, 0))
    # stages [j, h) allowed on some device: j >= jlo[h] (shrinking a stage keeps it allowed)
    allowed = np.isfinite(Cp).any(axis=2)  # [lo, hi]
    jlo = np.where(allowed.any(axis=0), allowed.argmax(axis=0), np.arange(B + 1))
    labels = 0
    for h in range(1, B + 1):
        j0 = int(jlo[h])
        n = h - j0
        if n == 0:
            continue
        cand_p = op_p(Wp[psrc, pb, j0:h, :], CpT[pb, h, j0:h, None]).reshape(P, n * K)
        labels += cand_p.size
        cand_s = op_s(Ws[psrc, pb, j0:h, :], CsT[pb, h, j0:h, None]).reshape(P, n * K)
        idx, vp, vs = _select_k(cand_p, cand_s, K)
        Vp[pm, pb, h] = vp
        Vs[pm, pb, h] = vs
        Vi[pm, pb, h] = j0 + idx // K
        Vq[pm, pb, h] = idx % K
        if h == B:
            break
        tp = Tp[h - 1]  # [D(a), D(b)]
        ts = Ts[h - 1]
        cand_p = op_p(Vp[:, :, h, None, :], tp[None, :, :, None])  # [nM, a, b, K]
        cand_s = op_s(Vs[:, :, h, None, :], ts[None, :, :, None])
        cand_p = cand_p.transpose(0, 2, 1, 3).reshape(nM, D, D * K)
        cand_s = cand_s.transpose(0, 2, 1, 3).reshape(nM, D, D * K)
        cand_p = np.where(w_forbid, np.inf, cand_p)
        labels += cand_p.size
        idx, wp_, ws_ = _select_k(cand_p, cand_s, K)
        Wp[:, :, h], Ws[:, :, h] = wp_, ws_
        Wa[:, :, h], Wr[:, :, h] = idx // K, idx % K
    count_work("labels", labels)
    # best final labels over all (m, b)
    fp = Vp[pm, pb, B].reshape(P * K)
    fs = Vs[pm, pb, B].reshape(P * K)
    idx, vp, vs = _select_k(fp, fs, K)
    out = []
    for i, p_val, s_val in zip(idx.tolist(), vp.tolist(), vs.tolist()):
        if not np.isfinite(p_val):
            break
        m, b, r = int(pm[i // K]), int(pb[i // K]), i % K
        h, stages = B, []
        while True:
            j, q = int(Vi[m, b, h, r]), int(Vq[m, b, h, r])
            stages.append((j, h, b))
            if j == 0:
                break
            m = int(sp.mid[sp.masks[m] ^ (1 << b)])
            b, r, h = int(Wa[m, b, j, q]), int(Wr[m, b, j, q]), j
        out.append((p_val, s_val, stages[::-1]))
    return out


def _latency_dp(tab: _Tables, K: int, S: int, cap: float = np.inf) -> list[tuple[float, float, list[Span]]]:
    """K best (latency, switched bottleneck); stages and transfers above `cap` are forbidden."""
    C = tab.C if cap == np.inf else np.where(tab.C <= cap, tab.C, np.inf)
    T = tab.T if cap == np.inf else np.where(tab.T <= cap, tab.T, np.inf)
    return _lex_dp(tab, K, S, C, C, T, T, np.add, np.maximum)


def _bottleneck_dp(tab: _Tables, K: int, S: int) -> list[tuple[float, float, list[Span]]]:
    """K best switched bottlenecks (min-max DP; latency only as a tie-break that may be inexact)."""
    return _lex_dp(tab, K, S, tab.C, tab.C, tab.T, tab.T, np.maximum, np.add)


def _transfer_sum_dp(tab: _Tables, S: int, cap: float) -> list[tuple[float, float, list[Span]]]:
    """Least transfer sum over plans whose every stage computes in <= cap ms."""
    Cp = np.where(tab.C <= cap, 0.0, np.inf)
    return _lex_dp(tab, 1, S, Cp, tab.C, tab.T, tab.T, np.add, np.add)


def _memory_feasible(problem: PipelineProblem, max_stages: int | None) -> bool:
    tab = _Tables(problem)
    S = min(tab.D, tab.B, max_stages or tab.D)
    zero = np.where(np.isfinite(tab.C), 0.0, np.inf)
    return bool(_lex_dp(tab, 1, S, zero, zero, np.zeros_like(tab.T), np.zeros_like(tab.T), np.add, np.add))


# ----------------------------------------------------------------------------------------------------
# objectives


def _solve_latency_switched(tab, k, S):
    return [st for _, _, st in _latency_dp(tab, k, S)]


def _solve_throughput_switched(tab, k, S):
    levels = _bottleneck_dp(tab, k, S)
    if len(levels) < k:  # fewer than k plans exist: all of them
        return [st for _, _, st in levels]
    t = levels[-1][0]
    below = [st for bn, _, st in levels if bn < t]
    at_t = [st for _, bn, st in _latency_dp(tab, k, S, cap=t) if bn == t]
    return below + at_t[: k - len(below)]


def _shared_key(tab, stages, objective):
    lat, mc, _, st = tab.replay(stages)
    bn = max(mc, st)
    return (lat, bn) if objective == "latency" else (bn, lat)


def _upper_bound(tab, plans, k, objective):
    """(latency, bottleneck) of the k-th best of the distinct known plans, or infs."""
    uniq = {tuple(p): _shared_key(tab, p, objective) for p in plans}
    if len(uniq) < k:
        return (np.inf, np.inf)
    key = sorted(uniq.values())[k - 1]
    return key if objective == "latency" else (key[1], key[0])


def _solve_latency_shared(tab, k, S):
    fast = _latency_dp(tab, k + 1, S)
    if len(fast) <= k or fast[k][0] > fast[k - 1][0]:
        return [st for _, _, st in fast[:k]]  # the k best latencies are unique at the boundary: exact
    plans = [st for _, _, st in fast[:k]]
    ub = _upper_bound(tab, plans, k, "latency")
    return [st for _, _, st in pareto_dp(tab, _Space(tab, S), k, S, "latency", ub, 0.0)]


def _min_shared_bottleneck(tab, S, lower: float, upper: float):
    """Exact least shared-medium bottleneck: min over compute caps c of max(c, least transfer sum with
    every stage <= c). The least sum only falls as c grows, so the crossing is found by bisection over
    the distinct stage times in [lower, upper] (bounds on the answer). Returns (value, plans seen)."""
    caps = np.unique(tab.C[np.isfinite(tab.C)])
    plans = []

    def least(i):
        res = _transfer_sum_dp(tab, S, float(caps[i]))
        if res:
            plans.append(res[0][2])
            return res[0][0]
        return np.inf

    # first i with least(i) <= caps[i]; none below `lower`, and caps[i] >= upper qualifies
    lo = int(np.searchsorted(caps, lower, side="left"))
    hi = int(np.searchsorted(caps, upper, side="left"))
    while lo < hi:
        mid = (lo + hi) // 2
        if least(mid) <= caps[mid]:
            hi = mid
        else:
            lo = mid + 1
    best = upper
    if lo < caps.size:
        best = min(best, float(caps[lo]))
    if lo > 0:
        best = min(best, least(lo - 1))
    return best, plans


def _solve_throughput_shared(tab, k, S):
    sw = _bottleneck_dp(tab, 1, S)  # switched bottleneck <= shared bottleneck for every plan
    if not sw:
        return []
    cheap = [sw[0][2]] + [st for _, _, st in _latency_dp(tab, k, S)]
    upper = min(_shared_key(tab, p, "throughput")[0] for p in cheap)
    lb, plans = _min_shared_bottleneck(tab, S, sw[0][0], upper)
    ub = _upper_bound(tab, cheap + plans, k, "throughput")
    return [st for _, _, st in pareto_dp(tab, _Space(tab, S), k, S, "throughput", ub, lb)]


def _relabelings(tab: _Tables, plan: list[Span], limit: int) -> list[list[Span]]:
    """Up to `limit` plans of identical cost: `plan` (canonical, first) with identical devices permuted."""
    positions: dict[int, list[int]] = {}
    for pos, (_, _, d) in enumerate(plan):
        positions.setdefault(int(tab.cls[d]), []).append(pos)
    groups = [(pos, np.flatnonzero(tab.cls == c).tolist()) for c, pos in positions.items()]
    out: list[list[Span]] = []
    devices = [d for _, _, d in plan]

    def rec(g: int):
        if len(out) >= limit:
            return
        if g == len(groups):
            out.append([(lo, hi, devices[i]) for i, (lo, hi, _) in enumerate(plan)])
            return
        pos, members = groups[g]
        for choice in itertools.permutations(members, len(pos)):
            for i, d in zip(pos, choice):
                devices[i] = d
            rec(g + 1)
            if len(out) >= limit:
                return

    rec(0)
    return out


# ----------------------------------------------------------------------------------------------------
# entry points


def plan_pipeline(graph: LayerGraph, cost: CostTable, objective: str, options: PlanOptions) -> list[Plan]:
    """The planner: the `options.top_k` best pipeline plans, best first (`solve_pipeline`); for the energy
    objective, the plan of least energy under `options.energy` (pipeline_energy.py)."""
    if objective == "energy":
        from .pipeline_energy import plan_pipeline_energy  # it builds on this module
        return plan_pipeline_energy(graph, cost, options)
    problem = pipeline_problem(graph, cost)
    return [to_plan(sol, "pipeline", objective, graph, problem)
            for sol in solve_pipeline(problem, objective, top_k=options.top_k, copies=False)]


def solve_pipeline(
    problem: PipelineProblem, objective: str = "latency", top_k: int = 1, max_stages: int | None = None,
    copies: bool = True,
) -> list[PipelineSolution]:
    """The `top_k` best distinct placements of the block chain, best first (exact).

    Stages are contiguous, each on its own device (any subset, any order), each fitting its device's
    memory; at most `max_stages` stages if given. Ranked by `solution.key(objective)` - latency then
    bottleneck, or bottleneck then latency - with the stages tuple as a final deterministic tie-break
    (which of several exactly-tied plans fill the last slots is deterministic but not otherwise
    specified). Fewer than `top_k` are returned only when fewer placements exist.

    Without `copies`, a placement that only swaps devices interchangeable bit for bit (module docstring:
    Symmetry) with another is not a placement of its own: the `top_k` best of those classes, each as its
    canonical member (identical devices in index order). That is what a planner wants of its top-K: on two
    like devices the exact top 3 is a split, its mirror and a second split, the mirror costing the same by
    construction, so it leaves the driver's choice (driver._candidate) and `--keep` one real alternative.
    Raises InfeasibleError (message in MB) when nothing fits, ValueError on bad arguments.
    """
    validate_request(problem, objective)
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if max_stages is not None and max_stages < 1:
        raise ValueError(f"max_stages must be >= 1, got {max_stages}")
    return _solve(problem, _Tables(problem), objective, top_k, max_stages, copies)


def _solve(problem: PipelineProblem, tab: _Tables, objective: str, top_k: int,
           max_stages: int | None, copies: bool = True) -> list[PipelineSolution]:
    """solve_pipeline on the problem's tables, built or sliced (PipelineTail)."""
    S = min(tab.D, tab.B, max_stages or tab.D)
    shared = problem.medium == "shared" and tab.B > 1 and S > 1
    if objective == "latency":
        plans = _solve_latency_shared(tab, top_k, S) if shared else _solve_latency_switched(tab, top_k, S)
    else:
        plans = _solve_throughput_shared(tab, top_k, S) if shared else _solve_throughput_switched(tab, top_k, S)
    if not plans:
        raise InfeasibleError(infeasible_message(problem, max_stages))
    if copies and top_k > 1 and np.any(tab.cls != np.arange(tab.D)):  # the DPs searched canonical orders only
        plans = [q for p in plans for q in _relabelings(tab, p, top_k)]
    sols = [problem.evaluate(tuple(StageChoice(lo, hi, d) for lo, hi, d in p)) for p in plans]
    sols.sort(key=lambda s: solution_sort_key(s, objective))
    return sols[:top_k]


class PipelineTail:
    """The layers after a cut as pipeline stages over all devices (the exact latency DP), entered from a
    given device: what a hybrid plan runs after its spatial prefix (spatial.py)."""

    def __init__(self, graph: LayerGraph, cost: CostTable):
        self.graph, self.cost, self.problem = graph, cost, pipeline_problem(graph, cost)
        self._sols: dict = {}
        self._tables: _Tables | None = None  # the whole chain's, sliced for every suffix
        fastest = self.problem.block_ms.min(axis=1)
        self._least = np.concatenate([np.cumsum(fastest[::-1])[::-1], [0.0]])  # [block]: its suffix, each block on its fastest device
        self._block = {lo: i for i, (lo, _) in enumerate(graph.pipeline_blocks)}

    def lower(self, cut: int) -> float:
        """A lower bound of `best(cut, g)` for any g, without solving: no transfers, fastest devices."""
        return 0.0 if cut >= len(self.graph.layers) else float(self._least[self._block[cut]])

    def _solutions(self, cut: int):
        if cut not in self._sols:
            bi = self._block[cut]
            sub = self.problem.suffix(bi)
            try:
                validate_request(sub, "latency")
                if self._tables is None:
                    self._tables = _Tables(self.problem)
                self._sols[cut] = (bi, _solve(sub, _Tables(sub, self._tables, bi), "latency", 3, None))
            except InfeasibleError:
                self._sols[cut] = (bi, [])
        return self._sols[cut]

    def best(self, cut: int, g: str) -> tuple[float, tuple[Stage, ...]]:
        """(least latency, stages) of the layers from `cut` on, their input sent from device g; (inf, ())
        when no placement fits."""
        n = len(self.graph.layers)
        if cut >= n:
            return 0.0, ()
        bi, sols = self._solutions(cut)
        sizes = [self.graph.tensors[t].nbytes for t in self.graph.live_across(cut)]
        best = (math.inf, ())
        for sol in sols:
            first = self.problem.devices[sol.stages[0].device]
            total = sum(self.cost.transfer_ms(nb, g, first) for nb in sizes) + sol.latency_ms
            blocks = self.graph.pipeline_blocks
            stages = tuple(Stage(self.problem.devices[s.device], blocks[bi + s.lo][0], blocks[bi + s.hi - 1][1]) for s in sol.stages)
            best = min(best, (total, stages), key=lambda x: x[0])
        return best
