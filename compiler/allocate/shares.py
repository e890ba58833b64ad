"""The shares plan_shares visits, in its order (largest first, then in class order), never listing them all.

A share is a count vector over the device classes; a cluster of 100 devices in 8 classes has 13^4 x 14^4
of them (about 1.1 billion). plan_shares plans the first share in visiting order that no earlier run
covers (a box [used, share]) and that no hopeless share holds (a share whose subsets all miss the SLA).
That first share is always a maximal one of what is left (a larger share comes earlier), so `Shares`
keeps the maximal shares still to visit, an antichain, and the regions ruled out, and finds the next
share by splitting the first maximal share that a region rules out into the maximal shares below it that
the region leaves (for a box [lo, hi]: the share with class c lowered to lo[c] - 1, for each c with
lo[c] > 0; below a hopeless share: none). Without a device limit it visits the shares the full list would,
in the same order, in time and memory that grow with the planner runs and the classes, not with the number
of shares.

With a device limit (a service's max_devices) on a fleet, the maximal shares within it are an antichain
as large as the ways to choose that many devices from the classes (330 for 4 devices of 8 classes, 5,475
for 8), and no box of one rules out another: listing them made a planner run of each. So beyond LISTED
shares the walk starts from the whole (offered) cluster whatever the limit, and a share over the limit is
a probe: its plan, when it uses no more devices than the limit, rules out the box [used, share] as any
run does (every share within the limit in that box gets that plan); when it misses the SLA, everything
under it is hopeless; and when its plan uses more devices than the limit, the walk goes on from the maximal
shares within the limit below it (a box of more devices than the limit holds none of them). A plan over
the limit is no option (candidates.py). The runs then follow the classes a service's plans use, not the
shares within its limit: one probe suffices when the best plan on the whole cluster is within the limit.

>>> s = Shares((2, 1), limit=3)
>>> s.next()
(2, 1)
>>> s.cover((1, 0), (2, 1))       # the plan on (2, 1) used one device of the first class
>>> s.next()
(0, 1)
"""

from __future__ import annotations

import heapq
import itertools
import math

__all__ = ["Shares", "every_share", "offered", "LISTED", "CLASS_CAP"]

Counts = tuple[int, ...]

# Up to this many shares the visiting order is the sorted list of every share (`every_share`); above it,
# the maximal shares left (the module docstring). Both visit the same shares in the same order.
LISTED = 100_000
# Beyond LISTED shares (a fleet), a share offers at most this many devices of one class: every planner run
# is then on at most CLASS_CAP x classes devices, and a plan that would tile over more alike devices than
# that is not found.
CLASS_CAP = 4


def offered(sizes: Counts) -> tuple[Counts, bool]:
    """(the most devices of each class a share offers, whether that is fewer than the class has): every
    device while there are at most LISTED shares; beyond that, at most CLASS_CAP of each class."""
    if math.prod(s + 1 for s in sizes) <= LISTED:
        return tuple(sizes), False
    capped = tuple(min(s, CLASS_CAP) for s in sizes)
    return capped, capped != tuple(sizes)


def every_share(sizes: Counts, limit: float) -> list[Counts]:
    """Every non-empty share of at most `limit` devices, largest first (then in class order)."""
    every = [c for c in itertools.product(*(range(s, -1, -1) for s in sizes)) if 0 < sum(c) <= limit]
    return sorted(every, key=lambda c: -sum(c))


def _order(c: Counts) -> tuple:
    """The visiting order's key (smallest first): larger shares first, then lexicographically greater."""
    return (-sum(c), tuple(-x for x in c))


def _top(sizes: Counts, limit: int) -> list[Counts]:
    """The maximal shares of at most `limit` devices: every share of exactly min(limit, all) devices."""
    total = min(limit, sum(sizes))
    out: list[Counts] = []

    def fill(prefix: list[int], c: int, left: int) -> None:
        if c == len(sizes):
            if left == 0:
                out.append(tuple(prefix))
            return
        room = sum(sizes[c + 1:])
        for k in range(min(sizes[c], left), max(0, left - room) - 1, -1):
            fill(prefix + [k], c + 1, left - k)

    fill([], 0, total)
    return out


class Shares:
    """The shares still to visit (`next`), as regions are ruled out (`cover`, `hopeless`)."""

    def __init__(self, sizes: Counts, limit: float):
        self.sizes = tuple(sizes)
        total = sum(self.sizes)
        limit = total if limit == math.inf else int(min(limit, total))
        self._listed = (every_share(self.sizes, limit)
                        if math.prod(s + 1 for s in self.sizes) <= LISTED else None)
        self._at = 0
        self._heap: list = []  # the maximal shares left, by visiting order
        self._live: set[Counts] = set()
        self.limit = limit
        if self._listed is None and limit > 0:
            self._push(self.sizes)  # the whole cluster: a probe when it is over the limit (module docstring)
        self._covered: list[tuple[Counts, Counts]] = []
        self._hopeless: list[Counts] = []
        self._last: Counts | None = None

    def cover(self, lo: Counts, hi: Counts) -> None:
        """Every share w with lo <= w <= hi needs no plan."""
        self._covered.append((tuple(lo), tuple(hi)))

    def hopeless(self, share: Counts) -> None:
        """Every share w <= share needs no plan."""
        self._hopeless.append(tuple(share))

    def next(self) -> Counts | None:
        """The first share in visiting order not ruled out; None when there is none. Beyond LISTED shares it
        may be over the limit (a probe: the module docstring)."""
        if self._listed is not None:
            while self._at < len(self._listed):
                share = self._listed[self._at]
                self._at += 1
                if self._region(share) is None:
                    return share
            return None
        if self._last is not None:  # the share visited last: what it ruled out splits it now
            self._push(self._last)
        while self._heap:
            _, share = heapq.heappop(self._heap)
            self._live.discard(share)
            lo = self._region(share)
            if lo is None and share != self._last:
                self._last = share
                return share
            lo = share if lo is None else lo  # visited and ruled out nothing: only itself is done
            if sum(lo) > self.limit:  # a probe whose box is over the limit: the shares within it below
                children = _top(share, self.limit)
            else:  # the maximal shares below `share` outside the box
                children = [share[:c] + (low - 1,) + share[c + 1:] for c, low in enumerate(lo) if low > 0]
            for child in children:
                if sum(child) > 0 and not any(_le(child, m) for m in self._live):
                    self._push(child)
        self._last = None
        return None

    def _push(self, share: Counts) -> None:
        self._live.add(share)
        heapq.heappush(self._heap, (_order(share), share))

    def _region(self, share: Counts) -> Counts | None:
        """None when `share` is still to visit; else the lower corner of a box holding it (all zeros
        below a hopeless share: nothing under it is left)."""
        for h in self._hopeless:
            if _le(share, h):
                return (0,) * len(share)
        for lo, hi in self._covered:
            if _le(lo, share) and _le(share, hi):
                return lo
        return None


def _le(a: Counts, b: Counts) -> bool:
    return all(x <= y for x, y in zip(a, b))
