"""The exact DP's tables for a problem with riders (pipeline_riders.py), once per routing and first stage.

Which riders may go direct, and the link they take into each stage, depend on the first stage: its device d0
sends them, and only those it computes. So for each routing (a set of riders sent direct, the others
forwarded) the DP runs once per first stage [0, j) on d0 that computes them (`routed_runs`), on tables
where that is the only first stage: the transfer into the second stage (its chain tensors and its riders,
one link from d0) is a term of the stage that starts at j, in its latency and in its bottleneck term, and
every later stage on d has the link of its riders from d0 in its bottleneck term (StageTables.Cmax); the
chain's transfers carry no rider sent direct. Plus one run with every rider forwarded, on the ordinary
tables. A plan is in one run per routing it allows, priced there as `PipelineProblem.evaluate` prices that
routing, so the best of the runs' best are the best under the problem's price (the best routing of each).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Iterator

import numpy as np

from .pipeline_problem import PipelineProblem
from .pipeline_tables import StageTables, transfer_table

__all__ = ["routed_runs"]


def routed_runs(problem: PipelineProblem, tab: StageTables, objective: str) -> Iterator[tuple[float, StageTables]]:
    """(bound, tables) of every run (module docstring), each routed run with its first device in a class of its
    own; the bound is a value of the objective no plan of the run beats (its first stage's compute and the
    least transfer of the chain out of it, and for latency the rest of the blocks on their fastest devices),
    for the DP to skip runs that cannot make its top k. The runs of a routing come in the order of their first stage's end."""
    riders, B = problem.riders, tab.B
    yield 0.0, tab  # every rider forwarded: the ordinary tables, any first stage
    bw, lat = np.asarray(problem.bandwidth_bytes_per_ms), np.asarray(problem.link_latency_ms)
    for direct in riders.routings()[1:]:
        chain = riders.chain_bytes(direct)
        T = transfer_table(replace(problem, riders=None, cut_tensor_bytes=chain,
                                   cut_bytes=np.array([sum(c) for c in chain], dtype=np.float64)))
        ready = riders.ready(direct)
        for d0 in range(tab.D):
            if tab.cls[d0] != d0 or not np.isfinite(tab.C[0, ready:, d0]).any():
                continue  # a device interchangeable with d0 runs the mirror plans; or no first stage here
            side = riders.side_table(bw[d0], lat[d0], direct)  # [lo, hi, d]: what d0 sends a stage [lo, hi) on d
            side[:, :, d0] = np.inf
            later = np.maximum(tab.C, side)  # a later stage: its compute and its riders' link
            for j in range(ready, B + 1):
                first = float(tab.C[0, j, d0])
                if np.isfinite(first):  # the second stage's link takes at least its chain's least transfer
                    into = float(T[j - 1, d0].min()) if j < B else 0.0
                    bound = first + into + float(tab.lat_rest[j]) if objective == "latency" else max(first, into)
                    yield bound, _first_stage(tab, T, side, later, d0, j)


def _first_stage(tab: StageTables, T: np.ndarray, side: np.ndarray, later: np.ndarray, d0: int, j: int) -> StageTables:
    """The tables of the plans whose first stage is [0, j) on d0 (module docstring)."""
    run = copy.copy(tab)
    run.cls = _alone(tab.cls, d0)
    C = tab.C.copy()
    C[:j] = np.inf  # no stage but the first starts before j: the DP's work is on the blocks after it
    C[0, j, d0] = tab.C[0, j, d0]
    Cmax = later.copy()
    Cmax[:j] = C[:j]
    run.T = T
    if j < tab.B:
        into = T[j - 1, d0][None, :] + side[j]  # [hi, d]: the chain and the riders, one link from d0
        C[j] = tab.C[j] + into
        Cmax[j] = np.maximum(tab.C[j], into)
        run.T = T.copy()
        run.T[j - 1, d0] = np.where(np.isfinite(T[j - 1, d0]), 0.0, np.inf)  # in the second stage's terms
    run.C, run.Cmax = C, Cmax
    return run


def _alone(cls: np.ndarray, d: int) -> np.ndarray:
    """`cls` with device d in a class of its own (the others of its class keep theirs, under their lowest)."""
    out = cls.copy()
    mates = np.flatnonzero((cls == cls[d]) & (np.arange(cls.size) != d))
    out[mates] = mates.min() if mates.size else 0
    out[d] = d
    return out
