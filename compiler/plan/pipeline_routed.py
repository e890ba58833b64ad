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

Peak memory: one run's tables at a time, per class of the run (the first device's class split in two):
O(B^2 Q + B Q^2), and its exact DP's (pipeline_dp.py).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Iterator

import numpy as np

from .pipeline_problem import PipelineProblem
from .pipeline_tables import StageTables, regroup_stages, transfer_table

__all__ = ["routed_runs"]


def routed_runs(problem: PipelineProblem, tab: StageTables, objective: str) -> Iterator[tuple[float, StageTables]]:
    """(bound, tables) of every run (module docstring), each routed run with its first device in a class of its
    own; the bound is a value of the objective no plan of the run beats (its first stage's compute and the
    least transfer of the chain out of it, and for latency the rest of the blocks on their fastest devices),
    for the DP to skip runs that cannot make its top k. The runs of a routing come in the order of their first
    stage's end. A run's tables are per class too: the classes of `tab` with its first device taken out of its own."""
    riders, B = problem.riders, tab.B
    yield 0.0, tab  # every rider forwarded: the ordinary tables, any first stage
    bw, lat = np.asarray(problem.bandwidth_bytes_per_ms), np.asarray(problem.link_latency_ms)
    for direct in riders.routings()[1:]:
        chain = riders.chain_bytes(direct)
        chained = replace(problem, riders=None, cut_tensor_bytes=chain,
                          cut_bytes=np.array([sum(c) for c in chain], dtype=np.float64))
        ready = riders.ready(direct)
        for d0 in tab.rep.tolist():  # a device interchangeable with d0 runs the mirror plans
            q0 = int(tab.cq[d0])
            if not np.isfinite(tab.C[0, ready:, q0]).any():
                continue  # no first stage here
            cls = _alone(tab.cls, d0)
            T = transfer_table(chained, cls)  # [cut, class, class] over the run's classes
            C = regroup_stages(tab.C, tab.cq, cls)
            reps = np.unique(cls)
            r0 = int(np.searchsorted(reps, d0))  # d0's class in the run
            side = riders.side_table(bw[d0][reps], lat[d0][reps], direct)  # [lo, hi, class]: d0's sends to a stage
            side[:, :, r0] = np.inf
            later = np.maximum(C, side)  # a later stage: its compute and its riders' link
            for j in range(ready, B + 1):
                first = float(C[0, j, r0])
                if np.isfinite(first):  # the second stage's link takes at least its chain's least transfer
                    into = float(T[j - 1, r0].min()) if j < B else 0.0
                    bound = first + into + float(tab.lat_rest[j]) if objective == "latency" else max(first, into)
                    yield bound, _first_stage(tab, cls, C, T, side, later, r0, j)


def _first_stage(tab: StageTables, cls: np.ndarray, C0: np.ndarray, T: np.ndarray, side: np.ndarray,
                 later: np.ndarray, r0: int, j: int) -> StageTables:
    """The tables of the plans whose first stage is [0, j) on the device of class r0, alone in its class
    (module docstring); C0, T, side and later are over the run's classes `cls`."""
    run = copy.copy(tab)
    run.set_classes(cls)
    C = C0.copy()
    C[:j] = np.inf  # no stage but the first starts before j: the DP's work is on the blocks after it
    C[0, j, r0] = C0[0, j, r0]
    Cmax = later.copy()
    Cmax[:j] = C[:j]
    run.T = T
    if j < tab.B:
        into = T[j - 1, r0][None, :] + side[j]  # [hi, class]: the chain and the riders, one link from d0
        C[j] = C0[j] + into
        Cmax[j] = np.maximum(C0[j], into)
        run.T = T.copy()
        run.T[j - 1, r0] = np.where(np.isfinite(T[j - 1, r0]), 0.0, np.inf)  # in the second stage's terms
    run.C, run.Cmax = C, Cmax
    run.mem_ok = regroup_stages(tab.mem_ok, tab.cq, cls)
    return run


def _alone(cls: np.ndarray, d: int) -> np.ndarray:
    """`cls` with device d in a class of its own (the others of its class keep theirs, under their lowest)."""
    out = cls.copy()
    mates = np.flatnonzero((cls == cls[d]) & (np.arange(cls.size) != d))
    out[mates] = mates.min() if mates.size else 0
    out[d] = d
    return out
