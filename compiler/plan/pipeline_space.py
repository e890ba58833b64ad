"""The pipeline DPs' device states: how many devices of each class of interchangeable devices a plan has
used so far (a count per class), never a subset of the devices.

Devices that are interchangeable bit for bit (pipeline_tables.py `device_classes`) form a class, and a plan
takes the members of a class in index order (the canonical member of the relabellings of a plan; the DPs
return it and pipeline_dp.py generates the copies when asked). A state is then a count per class, and
there are at most prod(n_c + 1) of them (fewer with at most S stages), built directly from the counts:
32 identical devices are 33 states, not 2^32 subsets. The state of counts n is the subset made of the
first n_c members of every class, and the states are ordered as those subsets' bitmasks are ordered (by
the highest device in which they differ), so the DPs break exact ties as they did over subsets.

The last device of a stage matters only by its class (its compute, memory and links are its class's), so
the DPs index it by class, as the stage and transfer tables are built (pipeline_tables.py `StageTables`, whose
classes are these, in the same order).

Peak memory: O(n Q) integers for n states (counts, moves, last devices and their order), and, to order the
states as their subsets' bitmasks, one bit per device per state while they are sorted (O(n D / 8) bytes);
n Q is at most STATE_BUDGET, checked before anything is built.
"""

from __future__ import annotations

import numpy as np

from .planner import InfeasibleError

__all__ = ["Space", "Relaxed", "count_states", "STATE_BUDGET", "TABLE_BUDGET", "RELAX_FIRST", "TooManyStates"]

# The most (count vector, last class) pairs the DPs visit, and the most bytes of tables a DP may hold for
# them (the latency DP: 48 bytes per pair, block and top-k slot). A DP over either refuses before allocating.
STATE_BUDGET = 2_000_000
TABLE_BUDGET = 1 << 30
# Above this many (count vector, class) pairs the DPs try the relaxation first (pipeline_dp.py: Size): its
# plans, when real, are the exact best, found in a fraction of the time; below it, the count states are cheap.
RELAX_FIRST = 2_000


class TooManyStates(InfeasibleError):
    """The exact DP's state space exceeds STATE_BUDGET, or the shared medium's Pareto labels their budget
    (pipeline_pareto.py LABEL_BUDGET); the message says by how much and why."""


def count_states(sizes: list[int], S: int) -> int:
    """How many count vectors (n_c <= sizes[c], sum <= S) there are, without building them: the
    coefficients up to x^S of prod_c (1 + x + ... + x^sizes[c])."""
    poly = [1] + [0] * S
    for n in sizes:
        new = [0] * (S + 1)
        for deg, coef in enumerate(poly):
            if coef:
                for c in range(min(n, S - deg) + 1):
                    new[deg + c] += coef
        poly = new
    return sum(poly)


class Space:
    """The count vectors the DPs visit (at most S devices in all), with the moves between them.

    cnt[m, q]: devices of class q used in state m; inc[m, q] / dec[m, q]: the state with one more / one
    fewer of class q (-1: none, as the class is exhausted, S is reached or none is used); device(m, q): the
    last device of class q used in m; order[m]: the classes ordered by that device's index (unused last).
    """

    def __init__(self, cls: np.ndarray, S: int, pair_bytes: int = 0, budget: int | None = None):
        cls = np.asarray(cls)
        self.rep = np.unique(cls)  # each class's lowest device, ascending: the class order
        self.Q = Q = self.rep.size
        self.members = [np.flatnonzero(cls == r) for r in self.rep]
        sizes = [min(m.size, S) for m in self.members]
        n = count_states(sizes, S)
        budget = TABLE_BUDGET if budget is None else budget
        if n * Q > STATE_BUDGET or n * Q * pair_bytes > budget:
            raise TooManyStates(
                f"the exact pipeline DP would need {n * Q:,} states ({n:,} ways to use at most {S} of "
                f"{cls.size} devices in {Q} classes of interchangeable devices) and {n * Q * pair_bytes / (1 << 20):,.0f}"
                f" MB of tables, over its budget of {STATE_BUDGET:,} states and {budget / (1 << 20):,.0f} MB")
        cnt = np.zeros((1, Q), dtype=np.int64)
        for q, size in enumerate(sizes):  # every vector with sum <= S, one class at a time
            total = cnt.sum(axis=1)
            cnt = np.concatenate([cnt[total + c <= S] + np.eye(Q, dtype=np.int64)[q] * c for c in range(size + 1)])
        cnt = cnt[self._mask_order(cnt)]
        self.cnt, self.n = cnt, cnt.shape[0]
        self._index = _Index(cnt, sizes)
        self.pc = cnt.sum(axis=1)
        self.empty = int(np.flatnonzero(self.pc == 0)[0])
        self.inc = self._neighbours(cnt, +1, np.array([m.size for m in self.members]), S)
        self.dec = self._neighbours(cnt, -1, None, S)
        last = np.full((self.n, Q), cls.size, dtype=np.int64)  # cls.size: sorts after every device
        for q, mem in enumerate(self.members):
            used = cnt[:, q] > 0
            last[used, q] = mem[cnt[used, q] - 1]
        self.last = last
        self.order = np.argsort(last, axis=1, kind="stable")  # [n, Q]
        # (m, q) pairs a stage can end in (q used in m), per m in the order of their last devices
        rank = np.take_along_axis(cnt, self.order, 1) > 0
        pm, pos = np.nonzero(rank)
        self.pm, self.pq = pm, self.order[pm, pos]
        self.psrc = self.dec[self.pm, self.pq]

    def _mask_order(self, cnt: np.ndarray) -> np.ndarray:
        """The permutation sorting count vectors as the bitmasks of their subsets sort (numerically)."""
        D = sum(m.size for m in self.members)
        words = np.zeros(((D + 63) // 64, cnt.shape[0]), dtype=np.uint64)
        for q, mem in enumerate(self.members):
            for rank, d in enumerate(mem.tolist()):  # d is in the subset when q's count exceeds its rank
                words[d // 64] |= (cnt[:, q] > rank).astype(np.uint64) << np.uint64(d % 64)
        return np.lexsort(tuple(words))  # the last key (the highest word) is the primary one

    def device(self, m: int, q: int) -> int:
        """The device of class q that a stage ending in state m ran on (the last of q that m uses)."""
        return int(self.members[q][self.cnt[m, q] - 1])

    def _neighbours(self, cnt: np.ndarray, step: int, sizes: np.ndarray | None, S: int) -> np.ndarray:
        out = np.full(cnt.shape, -1, dtype=np.int64)
        for q in range(self.Q):
            moved = cnt.copy()
            moved[:, q] += step
            ok = moved[:, q] >= 0 if step < 0 else (moved[:, q] <= sizes[q]) & (moved.sum(axis=1) <= S)
            out[ok, q] = self._lookup(moved[ok])
        return out

    def _lookup(self, rows: np.ndarray) -> np.ndarray:
        """The state index of each count vector in `rows` (all of them states)."""
        return self._index.find(rows)


class _Index:
    """Count vector -> state index: by a mixed-radix code in one int64 when the counts' ranges allow it
    (sorted codes, binary search), else by the vectors' bytes in a dict."""

    def __init__(self, cnt: np.ndarray, sizes: list[int]):
        radix = 1
        self.radix = []
        for n in sizes:
            self.radix.append(radix)
            radix *= n + 1
        if radix < 1 << 62:
            self.radix = np.array(self.radix, dtype=np.int64)
            codes = cnt @ self.radix
            self.perm = np.argsort(codes)
            self.codes = codes[self.perm]
            self.table = None
        else:
            self.table = {row.tobytes(): i for i, row in enumerate(cnt)}

    def find(self, rows: np.ndarray) -> np.ndarray:
        if self.table is not None:
            return np.array([self.table[row.tobytes()] for row in rows], dtype=np.int64)
        return self.perm[np.searchsorted(self.codes, rows @ self.radix)]


class Relaxed(Space):
    """The DPs' relaxation: any class may run any number of stages (a device may be used twice), so the state
    is the last class alone. Its best plan is a lower bound on every real plan's objective, and a real plan
    itself when it uses no class more often than the class has devices (`as_devices`)."""

    def __init__(self, cls: np.ndarray):
        # not Space.__init__: the count vectors it builds are what the relaxation drops
        cls = np.asarray(cls)
        self.rep = np.unique(cls)
        self.Q = Q = self.rep.size
        self.members = [np.flatnonzero(cls == r) for r in self.rep]
        self.n, self.empty = 1, 0
        self.cnt = np.zeros((1, Q), dtype=np.int64)
        self.pc = np.zeros(1, dtype=np.int64)
        self.inc = np.zeros((1, Q), dtype=np.int64)  # every class may always run the next stage
        self.dec = np.zeros((1, Q), dtype=np.int64)
        self.order = np.arange(Q)[None, :]
        self.pm, self.pq = np.zeros(Q, dtype=np.int64), np.arange(Q)
        self.psrc = self.dec[self.pm, self.pq]

    def device(self, m: int, q: int) -> int:
        return int(self.rep[q])  # the class, by its first device: as_devices maps a plan to real devices

    def as_devices(self, plan: list[tuple[int, int, int]], S: int) -> list[tuple[int, int, int]] | None:
        """A relaxed plan (stages on classes, by their first device) on real devices: the k-th stage on a class
        runs on its k-th device, as the exact DP's canonical plans do; None when a class runs more stages than
        it has devices, or the plan more than S stages."""
        if len(plan) > S:
            return None
        q_of = {int(r): q for q, r in enumerate(self.rep)}
        used = [0] * self.Q
        out = []
        for lo, hi, d in plan:
            q = q_of[d]
            if used[q] >= self.members[q].size:
                return None
            out.append((lo, hi, int(self.members[q][used[q]])))
            used[q] += 1
        return out
