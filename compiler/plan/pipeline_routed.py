"""The exact DP's tables for a problem with riders (pipeline_riders.py), once per first stage.

Whether the riders go direct, and the link they take into each stage, depend on the first stage: its device
d0 sends them, and only when it ends at or after `Riders.ready`. So the DP runs once per first stage
[0, j) on d0 with j >= ready (`routed_runs`): on tables where that is the only first stage, the transfer
into the second stage (chain tensors and riders, one link from d0) is a term of the stage that starts at j,
in its latency and its bottleneck term, and every later stage on d has the link of its riders from d0 in its
bottleneck term (StageTables.Cmax); the chain's transfers carry no rider. Plus one run for the first stages
that end before `ready`, on the ordinary tables (riders forwarded). The runs partition the plans, so the best
of their best are the best, each priced as `PipelineProblem.evaluate` prices it.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Iterator

import numpy as np

from .pipeline_problem import PipelineProblem
from .pipeline_tables import StageTables, transfer_table

__all__ = ["routed_runs"]


def routed_runs(problem: PipelineProblem, tab: StageTables) -> Iterator[StageTables]:
    """The tables of every run (module docstring), each with its first device in a class of its own."""
    riders, B = problem.riders, tab.B
    early = copy.copy(tab)  # first stages that end before the riders are computed: forwarded, as tab prices them
    early.C = tab.C.copy()
    early.C[0, riders.ready:, :] = np.inf
    early.Cmax = early.C
    yield early
    chain = replace(problem, riders=None, cut_tensor_bytes=riders.chain_bytes,
                    cut_bytes=np.array([sum(c) for c in riders.chain_bytes], dtype=np.float64))
    T = transfer_table(chain)
    bw, lat = np.asarray(problem.bandwidth_bytes_per_ms), np.asarray(problem.link_latency_ms)
    for d0 in range(tab.D):
        if tab.cls[d0] != d0 or not np.isfinite(tab.C[0, riders.ready:, d0]).any():
            continue  # a device interchangeable with d0 runs the mirror plans; or no first stage here
        side = riders.side_table(bw[d0], lat[d0])  # [lo, hi, d]: the riders d0 sends a stage [lo, hi) on d
        side[:, :, d0] = np.inf
        base_max = np.maximum(tab.C, side)  # a later stage: its compute and its riders' link
        for j in range(riders.ready, B + 1):
            first = tab.C[0, j, d0]
            if not np.isfinite(first):
                continue
            run = copy.copy(tab)
            run.cls = _alone(tab.cls, d0)
            C = tab.C.copy()
            C[0] = np.inf
            C[0, j, d0] = first
            Cmax = base_max.copy()
            Cmax[0] = C[0]
            if j < B:
                into = T[j - 1, d0][None, :] + side[j]  # [hi, d]: chain and riders, one link from d0
                C[j] = tab.C[j] + into
                Cmax[j] = np.maximum(tab.C[j], into)
                run.T = T.copy()
                run.T[j - 1, d0] = np.where(np.isfinite(T[j - 1, d0]), 0.0, np.inf)  # in the stage's term
            else:
                run.T = T
            run.C, run.Cmax = C, Cmax
            yield run


def _alone(cls: np.ndarray, d: int) -> np.ndarray:
    """`cls` with device d in a class of its own (the others of its class keep theirs, under their lowest)."""
    out = cls.copy()
    mates = np.flatnonzero((cls == cls[d]) & (np.arange(cls.size) != d))
    out[mates] = mates.min() if mates.size else 0
    out[d] = d
    return out
