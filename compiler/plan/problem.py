"""PipelineProblem: what the pipeline planners see, a chain of blocks priced on every device."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PipelineProblem", "StageChoice", "PipelineSolution", "InfeasibleError"]


class InfeasibleError(Exception):
    """No placement fits the cluster's memory; the message says what is needed and what there is."""


@dataclass(frozen=True, eq=False)
class PipelineProblem:
    """A chain of B blocks to place as contiguous stages on distinct devices.

    Cost model (all times in ms):
      - stage compute  = sum(block_ms[lo:hi, d])
      - stage memory   = sum(block_param_bytes[lo:hi]) + max(block_peak_act_bytes[lo:hi]); must be
                         <= device_mem_bytes[d]
      - transfer between consecutive stages on devices a -> b across the cut after block c:
                         cut_bytes[c] / bandwidth_bytes_per_ms[a, b] + link_latency_ms[a, b]
      - latency (one input)  = sum of stage compute + sum of transfers
      - bottleneck (pipelined) = max(max stage compute, link term) where the link term is the largest
                         transfer when medium == "switched" (each pair has its own link) and the sum of all
                         transfers when medium == "shared" (one channel carries every transfer)
      - throughput = 1000 / bottleneck (inputs per second)
    Input delivery to the first stage and output collection from the last are outside the model.
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

    @property
    def n_blocks(self) -> int:
        return int(self.block_ms.shape[0])

    @property
    def n_devices(self) -> int:
        return int(self.block_ms.shape[1])

    def transfer_ms(self, cut: int, src: int, dst: int) -> float:
        return float(self.cut_bytes[cut] / self.bandwidth_bytes_per_ms[src, dst] + self.link_latency_ms[src, dst])

    def stage_memory(self, lo: int, hi: int) -> int:
        return int(self.block_param_bytes[lo:hi].sum() + self.block_peak_act_bytes[lo:hi].max())

    def evaluate(self, stages: tuple["StageChoice", ...]) -> "PipelineSolution":
        """Score a placement under the cost model (no feasibility check; see `fits`)."""
        compute = [float(self.block_ms[s.lo:s.hi, s.device].sum()) for s in stages]
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
