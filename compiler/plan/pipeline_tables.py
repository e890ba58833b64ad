"""The pipeline DP's tables: every stage's compute on every device (inf where it does not fit memory), every
cut's transfer between every pair of devices, and which devices are interchangeable (symmetry), summed so
that they equal `PipelineProblem.evaluate`'s figures bit for bit."""

from __future__ import annotations

import copy

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from edgec.runtime.linkmodel import wire_ms

from .pipeline_problem import PipelineProblem

__all__ = ["Span", "StageTables", "transfer_table", "device_classes"]

Span = tuple[int, int, int]  # (lo, hi, device): one stage of the DPs


class StageTables:
    """Stage compute C[lo, hi, d] (inf when the stage does not fit d's memory) and transfers T[c, a, b].

    Cmax[lo, hi, d] is a stage's term of the bottleneck, C its term of the latency: the same table, except
    where a stage also takes a link of its own (the riders' direct sends, pipeline_routed.py), whose time
    is in Cmax as max(compute, link) and, for the stage after the first, in C too."""

    def __init__(self, problem: PipelineProblem, full: "StageTables | None" = None, first: int = 0):
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
        self.C = self.Cmax = C
        self.T = transfer_table(problem) if B > 1 else np.zeros((0, D, D))
        rowmin = bm.min(axis=1)
        self.lat_rest = np.concatenate([np.cumsum(rowmin[::-1])[::-1], [0.0]])  # lower bound, blocks j..B-1
        self.max_rest = np.concatenate([np.maximum.accumulate(rowmin[::-1])[::-1], [0.0]])
        self._symmetry(problem)

    def _slice(self, problem: PipelineProblem, full: "StageTables", first: int) -> None:
        # A window sum of blocks does not depend on where the window starts, and the suffix sums run
        # from the end: every slice is bit-identical to building the suffix's tables (test_plan_tail.py).
        self.B, self.D = full.B - first, full.D
        self.C, self.mem_ok = full.C[first:, first:], full.mem_ok[first:, first:]
        self.Cmax = full.Cmax[first:, first:]
        self.T = full.T[first:] if self.B > 1 else np.zeros((0, self.D, self.D))
        self.lat_rest, self.max_rest = full.lat_rest[first:], full.max_rest[first:]
        self._symmetry(problem)  # devices may be interchangeable on a suffix and not on the whole chain

    def _symmetry(self, problem: PipelineProblem) -> None:
        self.cls = device_classes(problem)  # the DPs' states count devices per class (pipeline_space.py)
        self.relaxed = False  # True: the DPs search the relaxation where a class runs any number of stages
        self.budget: int | None = None  # bytes of DP tables allowed (None: pipeline_space.TABLE_BUDGET)

    def relaxation(self) -> "StageTables":
        """These tables, for the DPs to search the relaxation (pipeline_space.py `Relaxed`)."""
        out = copy.copy(self)
        out.relaxed = True
        return out

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
            lat += float(self.C[lo, hi, d])
            mc = max(mc, float(self.Cmax[lo, hi, d]))
            prev = d
        return lat, mc, mt, st


def transfer_table(problem: PipelineProblem) -> np.ndarray:
    """T[c, a, b] = problem.transfer_ms(c, a, b), bit for bit (the messages are added in the same order);
    inf where a == b or the link has no bandwidth."""
    bw = np.asarray(problem.bandwidth_bytes_per_ms, dtype=np.float64)[None]
    lat = np.asarray(problem.link_latency_ms, dtype=np.float64)[None]
    with np.errstate(divide="ignore", invalid="ignore"):
        if problem.cut_tensor_bytes is None:
            T = wire_ms(np.asarray(problem.cut_bytes)[:, None, None], bw, lat)
        else:
            per_cut = problem.cut_tensor_bytes
            sizes = np.zeros((len(per_cut), max(map(len, per_cut), default=0)))
            for c, row in enumerate(per_cut):
                sizes[c, :len(row)] = row
            T = np.zeros((len(per_cut), *bw.shape[1:]))
            for i in range(sizes.shape[1]):
                nb = sizes[:, i, None, None]
                T = T + np.where(nb > 0, wire_ms(nb, bw, lat), 0.0)  # message_ms, element by element
    T = np.asarray(T, dtype=np.float64)
    T[~np.isfinite(T)] = np.inf
    T[:, bw[0] == 0] = np.inf  # zero bandwidth: no link
    D = T.shape[1]
    T[:, np.arange(D), np.arange(D)] = np.inf
    return T


def device_classes(problem: PipelineProblem) -> np.ndarray:
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
