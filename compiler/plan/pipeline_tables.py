"""The pipeline DP's tables: which devices are interchangeable (their classes), every stage's compute on each
class (inf where it does not fit memory) and every cut's transfer between each pair of classes, summed so
that they equal `PipelineProblem.evaluate`'s figures bit for bit. Peak memory: O(B^2 Q + B Q^2) for B blocks
and Q classes, beside the class test's O(D^2) per comparison (the problem's link matrices are [D, D])."""

from __future__ import annotations

import copy

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from edgec.runtime.linkmodel import wire_ms

from .pipeline_problem import PipelineProblem

__all__ = ["Span", "StageTables", "transfer_table", "device_classes", "column_classes", "class_pairs",
           "regroup_stages", "regroup_transfers"]

Span = tuple[int, int, int]  # (lo, hi, device): one stage of the DPs


class StageTables:
    """The DPs' tables per class of interchangeable devices (`device_classes`), never per device: stage compute
    C[lo, hi, q] on a device of class q (inf when the stage does not fit its memory), and transfers T[c, p, q]
    over cut c from a device of class p to one of class q, T[c, q, q] between two distinct devices of q (inf
    when q has one device). rep[q] is class q's lowest device (the classes in ascending order of it, as the
    DPs' states order them: pipeline_space.py), cq[d] device d's class: a stage on d costs C[lo, hi, cq[d]] and
    a transfer from a to b (a != b) T[c, cq[a], cq[b]]. The swap of two devices of a class maps every link to
    an equal link, so every pair of distinct devices of two classes (or of one) has the same transfer.

    Cmax[lo, hi, q] is a stage's term of the bottleneck, C its term of the latency: the same table, except
    where a stage also takes a link of its own (the riders' direct sends, pipeline_routed.py), whose time
    is in Cmax as max(compute, link) and, for the stage after the first, in C too.

    Size: with Q classes, (B + 1)^2 Q entries of C (and mem_ok) and (B - 1) Q^2 of T: 256 devices of 8 kinds
    hold the 8^2 transfers a cut has, not 256^2."""

    def __init__(self, problem: PipelineProblem, full: "StageTables | None" = None, first: int = 0, *,
                 classes: np.ndarray | None = None, device: np.ndarray | None = None):
        """The tables of `problem`; with `full`, those of the problem it is the suffix of (from block
        `first` on), sliced from `full` instead of summed again (the sums are the same numbers).

        `classes` and `device` are for a problem whose devices are columns (the energy DP's operating points,
        pipeline_energy.py): `classes` per column the lowest column of its class (default `device_classes`),
        `device` each column's physical device. A transfer between two classes is then between columns on two
        distinct devices (a plan never uses two columns of one device), which the classes must make one number."""
        if full is not None:
            self._slice(problem, full, first)
            return
        B, D = problem.n_blocks, problem.n_devices
        self.B, self.D = B, D
        self._symmetry(device_classes(problem) if classes is None else np.asarray(classes))
        rep, Q = self.rep, self.Q
        bm = np.asarray(problem.block_ms, dtype=np.float64)
        bmT = np.ascontiguousarray(bm[:, rep].T)  # [Q, B]; window sums below match evaluate's slice sums bit for bit
        params = np.asarray(problem.block_param_bytes)
        act = np.asarray(problem.block_peak_act_bytes)
        dev_mem = np.asarray(problem.device_mem_bytes)[rep]
        C = np.full((B + 1, B + 1, Q), np.inf)
        self.mem_ok = np.zeros((B + 1, B + 1, Q), dtype=bool)
        for L in range(1, B + 1):
            lo = np.arange(B - L + 1)
            sums = sliding_window_view(bmT, L, axis=1).sum(axis=2)  # [Q, B-L+1]
            stage_mem = sliding_window_view(params, L).sum(axis=1) + sliding_window_view(act, L).max(axis=1)
            if np.issubdtype(stage_mem.dtype, np.floating):
                stage_mem = np.trunc(stage_mem)  # stage_memory() applies int()
            ok = stage_mem[:, None] <= dev_mem[None, :]  # [B-L+1, Q]
            self.mem_ok[lo, lo + L] = ok
            C[lo, lo + L] = np.where(ok, sums.T, np.inf)
        for first, extra in ((True, problem.request_in_ms), (False, problem.request_out_ms)):
            if extra is not None and np.any(np.asarray(extra) != 0):
                rows = C[0, :] if first else C[:, B]  # [hi or lo, Q]: stages that start at 0 / end at B
                rows += np.asarray(extra, dtype=np.float64)[rep][None, :]
        self.C = self.Cmax = C
        self.T = transfer_table(problem, self.cls, device) if B > 1 else np.zeros((0, Q, Q))
        rowmin = bm.min(axis=1)
        self.lat_rest = np.concatenate([np.cumsum(rowmin[::-1])[::-1], [0.0]])  # lower bound, blocks j..B-1
        self.max_rest = np.concatenate([np.maximum.accumulate(rowmin[::-1])[::-1], [0.0]])

    def _slice(self, problem: PipelineProblem, full: "StageTables", first: int) -> None:
        # A window sum of blocks does not depend on where the window starts, and the suffix sums run
        # from the end: every slice is bit-identical to building the suffix's tables (test_plan_tail.py).
        self.B, self.D = full.B - first, full.D
        self.lat_rest, self.max_rest = full.lat_rest[first:], full.max_rest[first:]
        self._symmetry(device_classes(problem))  # devices may be interchangeable on a suffix and not on the whole chain
        T = full.T[first:] if self.B > 1 else np.zeros((0, full.Q, full.Q))
        same = np.array_equal(self.cls, full.cls)
        C, Cmax, mem_ok = (x[first:, first:] if same else regroup_stages(x[first:, first:], full.cq, self.cls)
                           for x in (full.C, full.Cmax, full.mem_ok))
        self.C, self.mem_ok = C, mem_ok
        self.Cmax = C if full.Cmax is full.C else Cmax
        self.T = T if same else regroup_transfers(T, full.cq, self.cls)

    def _symmetry(self, cls: np.ndarray) -> None:
        self.set_classes(cls)
        self.relaxed = False  # True: the DPs search the relaxation where a class runs any number of stages
        self.budget: int | None = None  # bytes of DP tables allowed (None: pipeline_space.TABLE_BUDGET)

    def set_classes(self, cls: np.ndarray) -> None:
        """Take `cls` (per device, the lowest device of its class) as the classes the tables are indexed by;
        the caller re-indexes the tables to match (`regroup_stages`, `regroup_transfers`)."""
        self.cls = cls  # the DPs' states count devices per class (pipeline_space.py)
        self.rep, self.cq = np.unique(cls, return_inverse=True)
        self.cq = self.cq.reshape(-1)
        self.Q = int(self.rep.size)

    def relaxation(self) -> "StageTables":
        """These tables, for the DPs to search the relaxation (pipeline_space.py `Relaxed`)."""
        out = copy.copy(self)
        out.relaxed = True
        return out

    def replay(self, stages: list[Span]) -> tuple[float, float, float, float]:
        """(latency, max compute, max transfer, transfer sum) accumulated exactly as the DPs do."""
        lat = mc = mt = st = 0.0
        prev = None
        cq = self.cq
        for lo, hi, d in stages:
            if prev is not None:
                t = float(self.T[lo - 1, cq[prev], cq[d]])
                lat += t
                st += t
                mt = max(mt, t)
            lat += float(self.C[lo, hi, cq[d]])
            mc = max(mc, float(self.Cmax[lo, hi, cq[d]]))
            prev = d
        return lat, mc, mt, st


def class_pairs(cls: np.ndarray, device: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rep, dst) of the classes of `cls`: rep[q] the lowest device of class q (ascending) and dst[p, q] the
    device of q that a transfer from rep[p] goes to: the lowest of q on another device than rep[p] (-1: none),
    which is rep[q] when p != q, or q's second device when p = q; with `device` (columns: each one's physical
    device), the lowest column of q on another physical device than rep[p]'s."""
    rep = np.unique(cls)
    phys = np.arange(cls.size) if device is None else np.asarray(device)
    dst = np.full((rep.size, rep.size), -1, dtype=np.int64)
    for q, r in enumerate(rep.tolist()):
        mates = np.flatnonzero(cls == r)
        other = phys[mates][None, :] != phys[rep][:, None]  # [p, member of q]: on another device than rep[p]
        found = other.any(axis=1)
        dst[found, q] = mates[other.argmax(axis=1)[found]]
    return rep, dst


def regroup_stages(C: np.ndarray, cq: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """A stage table [lo, hi, class] indexed by the classes of `cls` instead (cq: each device's class in C's)."""
    return C[:, :, cq[np.unique(cls)]]


def regroup_transfers(T: np.ndarray, cq: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """A transfer table [cut, class, class] indexed by the classes of `cls` instead (cq: each device's class in
    T's): the transfer between the devices `class_pairs` names, inf where a class of one device meets itself."""
    rep, dst = class_pairs(cls)
    out = T[:, cq[rep][:, None], cq[np.maximum(dst, 0)]]
    out[:, dst < 0] = np.inf
    return out


def transfer_table(problem: PipelineProblem, cls: np.ndarray, device: np.ndarray | None = None) -> np.ndarray:
    """T[c, p, q] = problem.transfer_ms(c, a, b) between the devices a = rep[p], b = dst[p, q] of
    `class_pairs(cls, device)`, bit for bit (the messages are added in the same order); inf where there is no
    such b (q has one device and p = q) or the link has no bandwidth."""
    rep, dst = class_pairs(cls, device)
    one = dst < 0
    dst = np.maximum(dst, 0)
    bw = np.asarray(problem.bandwidth_bytes_per_ms, dtype=np.float64)[rep[:, None], dst][None]
    lat = np.asarray(problem.link_latency_ms, dtype=np.float64)[rep[:, None], dst][None]
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
    T[:, one] = np.inf  # no device of q but rep[p]'s (a class of one device and itself)
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


def column_classes(problem: PipelineProblem, device: np.ndarray) -> np.ndarray:
    """Per column, the lowest column of its class. Two devices are alike with all their columns when swapping
    them, the i-th column of one for the i-th of the other (their modes in the same order), changes nothing the
    tables hold: the same number of columns, pairwise the same block times and memory, and every link between
    columns of two distinct devices (the only links a plan takes) unchanged by the swap. The i-th columns of
    alike devices form a class: a fleet of 256 devices of 8 kinds in 416 operating points has as many classes
    as its kinds have modes. The problem's devices are columns (the energy DP's operating points) and `device`
    is each column's physical device; what is per column beyond the tables (power, radio) the energy DP
    prices itself."""
    K = problem.n_devices
    dev = np.asarray(device)
    own = [np.flatnonzero(dev == d) for d in np.unique(dev)]  # each device's columns, ascending
    bm, mem = np.asarray(problem.block_ms), np.asarray(problem.device_mem_bytes)
    mats = [np.asarray(problem.bandwidth_bytes_per_ms), np.asarray(problem.link_latency_ms)]
    apart = dev[:, None] != dev[None, :]  # links between columns of two devices
    label = np.arange(K)
    leaders: list[np.ndarray] = []  # the first device of each class of devices, by its columns
    for mine in own:
        for theirs in leaders:
            if theirs.size != mine.size or not (np.array_equal(bm[:, theirs], bm[:, mine])
                                                 and np.array_equal(mem[theirs], mem[mine])):
                continue
            perm = np.arange(K)
            perm[theirs], perm[mine] = mine, theirs
            if all(np.array_equal(x[np.ix_(perm, perm)][apart], x[apart]) for x in mats):
                label[mine] = label[theirs]
                break
        else:
            leaders.append(mine)
    lowest = {}  # a class's label: its lowest column
    for k, lab in enumerate(label.tolist()):
        lowest.setdefault(lab, k)
    return np.array([lowest[lab] for lab in label.tolist()])
