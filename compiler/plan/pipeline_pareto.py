"""The pipeline planner's Pareto DP for the shared medium (pipeline.py runs it; see its docstring).

On a shared medium the link term of the bottleneck is the SUM of the transfers, so the bottleneck
max(max compute, transfer sum) does not decompose over stages. A label is (latency, max compute,
transfer sum) and each state (blocks done, devices used per class, last device's class) keeps its k-Pareto set: the
labels dominated by fewer than k others. The bounds the caller passes only prune; the result is exact.

Peak memory: the states' labels, 48 bytes each (three floats and three back pointers), kept until the plans
are read back: at most `LABEL_BUDGET` of them, beyond which the DP refuses (`TooManyStates`, one line naming
the size) and the planner goes on as beyond its state budget (pipeline_dp.py: Size), with the relaxation and
the exact DP over fewer devices, reported not exact; the tables per class are the caller's.
"""

from __future__ import annotations

import numpy as np

from .pipeline_space import TooManyStates
from .stats import count as count_work

__all__ = ["pareto_dp", "REL_SLACK", "LABEL_BUDGET"]

# The most labels the Pareto DP keeps (48 bytes each in its arrays, and their states' share of the dicts):
# a few hundred MB at most.
LABEL_BUDGET = 5_000_000

REL_SLACK = 1e-9  # slack on latency bounds (latency sums are rounded in a different order than evaluate's)

Span = tuple[int, int, int]  # (lo, hi, device): one stage



def _kpareto(lat: np.ndarray, mc: np.ndarray, st: np.ndarray, k: int, latency_first: bool) -> np.ndarray:
    """Indices of the labels dominated by fewer than k others (ties broken by position, deterministic).

    Dominance: all of (lat, mc, st) <= ; with latency_first, also any strictly smaller latency.
    """
    n = lat.size
    count_work("labels", n)
    if n <= k:
        return np.arange(n)
    order = np.lexsort((st, mc, lat))
    l, m, s = lat[order], mc[order], st[order]
    if latency_first:
        first = np.searchsorted(l, l, side="left")  # labels with strictly smaller latency
        n2 = int(np.searchsorted(first, k, side="left"))  # only a prefix can survive
        l, m, s, base = l[:n2], m[:n2], s[:n2], first[:n2]
    else:
        n2, base = n, np.zeros(n, dtype=np.int64)
    count = base.copy()
    chunk = max(1, 4_000_000 // max(n2, 1))
    for c0 in range(0, n2, chunk):  # count[i] += #{i' < i : i' dominates i}
        cols = slice(c0, min(n2, c0 + chunk))
        ii = np.arange(cols.start, cols.stop)
        rows = slice(0, cols.stop)
        dom = (m[rows, None] <= m[None, cols]) & (s[rows, None] <= s[None, cols])
        if latency_first:
            dom &= l[rows, None] == l[None, cols]
        dom &= np.arange(cols.stop)[:, None] < ii[None, :]
        count[cols] += dom.sum(axis=0)
    return order[:n2][count < k]


def _hold(held: int, n: int, sp, j: int, B: int) -> int:
    """held + n, or TooManyStates when that is over LABEL_BUDGET (module docstring: Peak memory)."""
    held += n
    if held > LABEL_BUDGET:
        raise TooManyStates(f"the shared-medium Pareto DP would keep more than {LABEL_BUDGET:,} labels (by block {j} "
                            f"of {B}, over {sp.n:,} states of {sp.Q} classes of devices)")
    return held


class _Labels:
    __slots__ = ("lat", "mc", "st", "i", "a", "r")

    def __init__(self, lat, mc, st, i, a, r):
        self.lat, self.mc, self.st, self.i, self.a, self.r = lat, mc, st, i, a, r

    def extend(self, other: "_Labels") -> "_Labels":
        return _Labels(*(np.concatenate([getattr(self, f), getattr(other, f)]) for f in self.__slots__))


def pareto_dp(
    tab, sp, k: int, S: int, objective: str, ub: tuple[float, float], lb_bn: float
) -> list[tuple[float, float, list[Span]]]:
    """k best plans for the shared medium as (latency, bottleneck, stages), best first.

    `tab` holds the stage and transfer tables and `sp` the device states to visit (counts per class of
    interchangeable devices), with at most S stages (pipeline_tables.py's StageTables and
    pipeline_space.py's Space).

    `ub` is (latency, bottleneck) of the k-th best plan already known (inf if fewer are known) and
    `lb_bn` a lower bound on every plan's bottleneck; both only prune, the result stays exact.
    """
    B = tab.B
    C, T = tab.C, tab.T  # by class, as the states count devices (the classes of sp and tab are one)
    latency_first = objective == "latency"
    ub_lat, ub_bn = ub
    ub_lat_slack = ub_lat + REL_SLACK * abs(ub_lat) if np.isfinite(ub_lat) else np.inf

    def prune(lab_lat, mc, st, j):
        lat_lb = lab_lat + tab.lat_rest[j]
        bn_lb = np.maximum(mc, st)
        if latency_first:
            bad = lat_lb > ub_lat_slack
        else:
            bad = (bn_lb > ub_bn) | ((bn_lb == ub_bn) & (lat_lb > ub_lat_slack))
        return ~bad & np.isfinite(lab_lat)

    # need[j]: least number of stages that can cover blocks j..B-1 (memory, and compute <= ub_bn when
    # ranking by bottleneck); a state that has used too many devices for what is left is dropped whole.
    ok = np.isfinite(tab.C).any(axis=2) if latency_first else (tab.C <= ub_bn).any(axis=2)
    need = np.full(B + 1, B + 1)
    need[B] = 0
    for j in range(B - 1, -1, -1):
        hs = np.flatnonzero(ok[j, j + 1 :]) + j + 1
        if hs.size:
            need[j] = 1 + need[hs].min()
    # stage ends: (state, class, devices used), each state's classes in the order of their last devices
    pairs = [(int(m), int(q), int(sp.pc[m])) for m, q in zip(sp.pm, sp.pq)]
    adds = [(m, np.flatnonzero(sp.inc[m] >= 0).tolist(), int(sp.pc[m])) for m in range(sp.n)]
    adds = [(m, qs, c) for m, qs, c in adds if qs]  # transfers: (state, next classes, |state|)
    V: dict[tuple[int, int, int], _Labels] = {}  # (j, m, p): labels after a stage on class p ending at j
    W: dict[tuple[int, int], _Labels] = {}  # (m, q): all labels entering q's next device after m (any j), j in .i
    empty_i = np.zeros(0, dtype=np.int64)
    held = 0  # labels kept in V and W, against LABEL_BUDGET
    for q in np.flatnonzero(sp.inc[sp.empty] >= 0).tolist():
        z = np.zeros(1)
        W[(sp.empty, q)] = _Labels(z, z, z, np.zeros(1, np.int64), np.full(1, -1), np.full(1, -1))
    for j in range(1, B + 1):
        clamp = 0.0 if latency_first else max(lb_bn, float(tab.max_rest[j]))
        # stages ending at j
        for m, q, c in pairs:
            if c + need[j] > S:
                continue
            src = W.get((int(sp.dec[m, q]), q))
            if src is None:
                continue
            cc = C[src.i, j, q]
            lat = src.lat + cc
            mc = np.maximum(src.mc, cc)
            if clamp:
                mc = np.maximum(mc, clamp)
            keep = np.nonzero(prune(lat, mc, src.st, j))[0]
            if keep.size == 0:
                continue
            sel = keep[_kpareto(lat[keep], mc[keep], src.st[keep], k, latency_first)]
            held = _hold(held, sel.size, sp, j, B)
            V[(j, m, q)] = _Labels(lat[sel], mc[sel], src.st[sel], empty_i, empty_i, sel)  # r -> W index
        if j == B:
            break
        # transfers into the next stage starting at j
        for m, next_classes, c in adds:
            if c + need[j] > S:
                continue
            present = [(p, V[(j, m, p)]) for p in sp.order[m].tolist() if (j, m, p) in V]
            if not present:
                continue
            lat0 = np.concatenate([lab.lat for _, lab in present])
            mc0 = np.concatenate([lab.mc for _, lab in present])
            st0 = np.concatenate([lab.st for _, lab in present])
            a0 = np.concatenate([np.full(lab.lat.size, p) for p, lab in present])
            r0 = np.concatenate([np.arange(lab.lat.size) for _, lab in present])
            for q in next_classes:
                t = T[j - 1, a0, q]
                lat, st = lat0 + t, st0 + t
                keep = np.nonzero(prune(lat, mc0, st, j))[0]
                if keep.size == 0:
                    continue
                sel = keep[_kpareto(lat[keep], mc0[keep], st[keep], k, latency_first)]
                held = _hold(held, sel.size, sp, j, B)
                new = _Labels(lat[sel], mc0[sel], st[sel], np.full(sel.size, j), a0[sel], r0[sel])
                W[(m, q)] = W[(m, q)].extend(new) if (m, q) in W else new
    # final selection by the objective's key, then reconstruction
    finals = [(key, lab) for key, lab in V.items() if key[0] == B]
    if not finals:
        return []
    lat = np.concatenate([lab.lat for _, lab in finals])
    bn = np.concatenate([np.maximum(lab.mc, lab.st) for _, lab in finals])
    owner = np.concatenate([np.full(lab.lat.size, n) for n, (_, lab) in enumerate(finals)])
    row = np.concatenate([np.arange(lab.lat.size) for _, lab in finals])
    order = np.lexsort((bn, lat) if latency_first else (lat, bn))[:k]
    out = []
    for o in order.tolist():
        (h, m, q), lab = finals[owner[o]]
        r = int(row[o])
        stages = []
        while True:
            w = int(lab.r[r])
            src = W[(int(sp.dec[m, q]), q)]
            j = int(src.i[w])
            stages.append((j, h, sp.device(m, q)))
            if j == 0:
                break
            m = int(sp.dec[m, q])
            q, r, h = int(src.a[w]), int(src.r[w]), j
            lab = V[(h, m, q)]
        out.append((float(lat[o]), float(bn[o]), stages[::-1]))
    return out
