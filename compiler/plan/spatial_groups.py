"""Which devices the spatial and hybrid searches tile over: classes of interchangeable devices, and the
device groups drawn from them.

Two devices are interchangeable when swapping them changes nothing the planner sees: same profile,
memory, per-layer times and traits (machine and power figures, DeviceSpec.traits), and equal links to
every third device. Swaps compose, so any k members of a class are as good as the first k, and a group
is a count per class (its first members). The classes are found once per planner run, comparing each
device with one member of every class found so far: O(D x Q) comparisons of D-long rows.

The groups (`groups`): every mix of class counts of two devices or more while there are at most MIXES of
them; beyond that (many kinds, or many devices of a few: 256 devices of 8 kinds have 33^8 mixes), the
fastest 2, 4, 8, ... devices and all of them (by summed layer time, ties in cluster order). The mixes are
counted before any is built. Peak memory: O(D^2) for the links between devices, O(D) classes, and at
most MIXES groups (or log2 D + 1 of the fastest devices).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..cluster import LinkSpec
from ..cost import CostTable

__all__ = ["Groups", "class_ids", "classes", "device_classes", "groups", "MIXES"]

MIXES = 16  # the most device groups searched as every mix of class counts


@dataclass(frozen=True)
class Groups:
    """The device groups to tile over, and whether they are every mix of class counts (else the fastest
    2, 4, 8, ... devices: `rule` says so, for --json)."""

    groups: list[list[str]]
    every_mix: bool
    rule: str


def class_ids(cost: CostTable) -> dict[str, int]:
    """Device name -> the cluster index of the first device of its class."""
    cl = cost.cluster
    names = list(cl.device_names)
    col = {n: i for i, n in enumerate(names)}
    spec = {d.name: d for d in cl.devices}
    default = LinkSpec(cl.bandwidth_mbps, cl.latency_ms)
    kinds = {default: 0}
    links = np.zeros((len(names), len(names)), dtype=np.int64)  # [a, b]: which link joins a and b
    for pair, link in cl.links.items():
        a, b = (col[n] for n in sorted(pair))
        links[a, b] = links[b, a] = kinds.setdefault(link, len(kinds))

    def key(n: str) -> tuple:
        d = spec[n]
        return d.profile.name, d.memory_mb, d.threads, d.traits

    def same(x: str, y: str) -> bool:
        if key(x) != key(y) or not bool((cost.layer_ms[:, cost.index(x)] == cost.layer_ms[:, cost.index(y)]).all()):
            return False
        a, b = col[x], col[y]
        third = np.ones(len(names), dtype=bool)
        third[[a, b]] = False
        return bool((links[a, third] == links[b, third]).all())

    reps: list[str] = []
    out: dict[str, int] = {}
    for n in cost.devices:
        rep = next((r for r in reps if same(r, n)), None)
        if rep is None:
            reps.append(n)
            rep = n
        out[n] = col[rep]
    return out


def classes(cost: CostTable, names, ids: dict[str, int] | None = None) -> list[list[str]]:
    """The interchangeable classes among `names`, each in the order of `names`, in order of first member."""
    ids = class_ids(cost) if ids is None else ids
    out: dict[int, list[str]] = {}
    for n in names:
        out.setdefault(ids[n], []).append(n)
    return list(out.values())


def device_classes(cost: CostTable, names, ids: dict[str, int] | None = None) -> list[str]:
    """One device per interchangeable class among `names` (its first)."""
    return [members[0] for members in classes(cost, names, ids)]


def groups(cost: CostTable, ids: dict[str, int] | None = None) -> Groups:
    """Device groups worth tiling over (the module docstring)."""
    names = list(cost.devices)
    members = classes(cost, names, ids)
    mixes = math.prod(len(m) + 1 for m in members) - 1 - len(members)  # less the empty and one-device mixes
    if mixes <= MIXES:
        combos = [cnt for cnt in itertools.product(*[range(len(m) + 1) for m in members]) if sum(cnt) >= 2]
        return Groups([[n for m, k in zip(members, cnt) for n in m[:k]] for cnt in combos], True,
                      "every mix of class counts")
    order = sorted(names, key=lambda n: cost.layer_ms[:, cost.index(n)].sum())
    sizes = sorted({*(2 ** i for i in range(1, len(order).bit_length())), len(order)})
    return Groups([order[:k] for k in sizes], False,
                  f"the fastest {', '.join(map(str, sizes))} devices, of {_mixes_text(mixes)} mixes of "
                  f"{len(members)} classes")


def _mixes_text(n: int) -> str:
    return f"{n:,}" if n < 10**9 else f"~10^{math.log10(n):.0f}"
