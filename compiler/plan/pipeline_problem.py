"""The pipeline planners' problem: the chain of blocks between the graph's pipeline cuts, priced on every
device (`PipelineProblem`, built by `pipeline_problem`), a placement of it (`StageChoice` stages, priced as a
`PipelineSolution`), the checks of a request, and a solution as a Plan (`to_plan`).

The exact DP (pipeline_dp.py), the baselines (baselines.py), the energy planner (pipeline_energy.py) and the
pipeline tails of hybrid plans (pipeline.py `PipelineTail`) all solve this problem.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edgec.runtime.linkmodel import message_ms, wire_ms

from ..cost import CostTable
from ..graph import LayerGraph
from ..plan_types import Plan, Stage
from .pipeline_riders import Riders, riders_of

__all__ = ["PIPELINE_OBJECTIVES", "PipelineProblem", "StageChoice", "PipelineSolution", "pipeline_problem", "to_plan",
           "first_device_problems",
           "validate_request", "solution_sort_key"]

PIPELINE_OBJECTIVES = ("latency", "throughput")  # what the pipeline DP optimises (energy: pipeline_energy.py)


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
    higher, so a plan never runs slower than its DP price); except `riders` (a generative build's rotary
    tables and mask, pipeline_riders.py), which the first stage may send straight to each stage that reads
    them when it computes them: a plan is priced at its best routing of them (`evaluate(stages, objective)`),
    the link into the second stage carrying its chain tensors and its direct riders (one link, in the latency
    too), and the link from the first stage's device to each later stage its direct riders (in the bottleneck
    only: the latency assumes they arrive before the chain does). That is a bound of `evaluate`'s price of the
    plan, which routes tensor by tensor and times each arrival: equal where its routing is the best one and
    the riders are not late (pipeline.py `_plan_generative` searches on until no plan unseen can beat the
    best it evaluated). A first stage that ends before a rider is computed forwards it in this price, as any
    other tensor that skips a stage (a residual around a stage of a norm alone), which evaluate may beat.
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
    # (device_classes).  None: nothing beyond the arrays
    traits: tuple | None = None
    riders: Riders | None = None  # a generative build's riders, priced at their best routing (above); None: none

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
        if self.cut_tensor_bytes is None:  # one message of the cut's bytes
            return float(wire_ms(self.cut_bytes[cut], bw, lat))
        total = 0.0
        for nbytes in self.cut_tensor_bytes[cut]:
            total += message_ms(nbytes, bw, lat)
        return float(total)

    def chain_transfer_ms(self, cut: int, src: int, dst: int, direct: frozenset[int]) -> float:
        """`transfer_ms` of the tensors crossing `cut` but the riders `direct`, which go straight there."""
        bw, lat = self.bandwidth_bytes_per_ms[src, dst], self.link_latency_ms[src, dst]
        total = 0.0
        for nbytes in self.riders.chain_bytes(direct)[cut]:
            total += message_ms(nbytes, bw, lat)
        return float(total)

    def side_ms(self, lo: int, hi: int, src: int, dst: int, direct: frozenset[int]) -> float:
        """The riders `direct`'s messages from `src` (the first stage's device) to the stage [lo, hi) on `dst`."""
        return self.riders.side_ms(lo, hi, self.bandwidth_bytes_per_ms[src, dst], self.link_latency_ms[src, dst], direct)

    def routings(self, stages: tuple["StageChoice", ...]) -> list[frozenset[int]]:
        """The sets of riders these stages may send direct from the first stage (class docstring): those it
        computes; [frozenset()] (all forwarded) when there are none or one stage."""
        if self.riders is None or len(stages) < 2 or stages[0].lo != 0:
            return [frozenset()]
        return [d for d in self.riders.routings() if not d or self.riders.ready(d) <= stages[0].hi]

    def stage_memory(self, lo: int, hi: int) -> int:
        return int(self.block_param_bytes[lo:hi].sum() + self.block_peak_act_bytes[lo:hi].max())

    def evaluate(self, stages: tuple["StageChoice", ...], objective: str = "latency") -> "PipelineSolution":
        """Score a placement under the cost model (no feasibility check; see `fits`): with riders, under the
        routing of them that is best for `objective` (a bound of what evaluate's routing gives, below)."""
        sols = [self._routed(stages, d) for d in self.routings(stages)]
        return min(sols, key=lambda s: s.key(objective))

    def _routed(self, stages: tuple["StageChoice", ...], direct: frozenset[int]) -> "PipelineSolution":
        compute = [self.stage_ms(s.lo, s.hi, s.device) for s in stages]
        sides: list[float] = []  # the riders' links from the first stage's device to the third stage on
        if direct:
            d0 = stages[0].device
            transfers = [self.chain_transfer_ms(a.hi - 1, a.device, b.device, direct) for a, b in zip(stages, stages[1:])]
            transfers[0] = transfers[0] + self.side_ms(stages[1].lo, stages[1].hi, d0, stages[1].device, direct)
            sides = [self.side_ms(s.lo, s.hi, d0, s.device, direct) for s in stages[2:]]
        else:
            transfers = [self.transfer_ms(a.hi - 1, a.device, b.device) for a, b in zip(stages, stages[1:])]
        link = (sum(transfers) + sum(sides) if self.medium == "shared" else max(transfers + sides)) if transfers else 0.0
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
                       request_in_ms=self.request_in_ms if first == 0 else None,  # only block 0 takes the input
                       riders=self.riders if first == 0 else None)


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
    state = [0] * len(blocks) if cost.generate is None else [cost.generate.stage_state_bytes(lo, hi) for lo, hi in blocks]
    return PipelineProblem(
        devices=cost.devices,
        block_ms=np.stack([cost.layer_ms[lo:hi].sum(axis=0) for lo, hi in blocks]),
        # a generative build's caches at the maximum context stay with their layers' stage, like weights
        block_param_bytes=np.array([sum(graph.layers[i].param_bytes for i in range(lo, hi)) + s
                                    for (lo, hi), s in zip(blocks, state)]),
        block_peak_act_bytes=np.array([graph.peak_activation_bytes(lo, hi) for lo, hi in blocks]),
        cut_bytes=np.array([graph.cut_bytes(hi) for _, hi in blocks[:-1]], dtype=np.float64),
        device_mem_bytes=np.array([d.usable_bytes for d in cluster.devices]),
        bandwidth_bytes_per_ms=bw,
        link_latency_ms=lat,
        medium=cluster.medium,
        traits=tuple(d.traits for d in cluster.devices),
        cut_tensor_bytes=tuple(tuple(graph.tensors[t].nbytes for t in graph.live_across(hi)) for _, hi in blocks[:-1]),
        **_request_costs(cost),
        # routed riders: a generative build on a switched network (on a shared medium the riders' sends would
        # hold the one channel while the chain waits: priced forwarded there, a bound evaluate never exceeds)
        riders=riders_of(graph, blocks) if cost.generate is not None and cluster.medium == "switched" else None,
    )


def first_device_problems(problem: PipelineProblem, cost: CostTable) -> list[PipelineProblem]:
    """A generative build's problem once per first device d0 (index order): a stage starting at block 0 only
    on d0 (request_in_ms inf elsewhere), and the last stage paying the token id's transfer back to d0
    (cost/generate.py token_ms, added to request_out_ms: evaluate holds the last stage's device until it is
    sent too). Each is an ordinary problem, which the exact DP solves; together they cover every plan."""
    gen, D = cost.generate, problem.n_devices
    r_in = np.zeros(D) if problem.request_in_ms is None else np.asarray(problem.request_in_ms, dtype=np.float64)
    r_out = np.zeros(D) if problem.request_out_ms is None else np.asarray(problem.request_out_ms, dtype=np.float64)
    out = []
    for d0, first in enumerate(problem.devices):
        token = np.array([gen.token_ms(cost, d, first) for d in problem.devices])
        out.append(replace(problem, request_in_ms=np.where(np.arange(D) == d0, r_in, np.inf),
                           request_out_ms=r_out + token))
    return out


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


def validate_request(problem: PipelineProblem, objective: str) -> None:
    """Raise ValueError on an unknown objective or malformed problem arrays."""
    if objective not in PIPELINE_OBJECTIVES:
        raise ValueError(f"objective must be one of {PIPELINE_OBJECTIVES}, got {objective!r}")
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
