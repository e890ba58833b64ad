"""Device classes: devices that price identically and sit on the same links are interchangeable, so a
service's share of the cluster is a count per class, not a set of names."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from ..cluster import ClusterModel
from ..cost import CostTable
from ..plan_types import Plan, Stage, Tile

__all__ = ["DeviceClasses", "device_classes", "sub_cluster", "restrict", "rename_plan", "Counts"]

Counts = tuple[int, ...]  # devices per class, in class order


@dataclass(frozen=True)
class DeviceClasses:
    """`members[k]`: the names of class k's devices, in cluster order; `labels[k]` names the class."""

    members: tuple[tuple[str, ...], ...]
    labels: tuple[str, ...]

    @property
    def sizes(self) -> Counts:
        return tuple(len(m) for m in self.members)

    def counts(self, names) -> Counts:
        """How many of `names` fall in each class."""
        wanted = set(names)
        return tuple(sum(n in wanted for n in m) for m in self.members)

    def class_of(self, name: str) -> int:
        return next(k for k, m in enumerate(self.members) if name in m)

    def first(self, counts: Counts) -> tuple[str, ...]:
        """The first counts[k] devices of each class: the sub-cluster a count vector is planned on."""
        return tuple(n for m, c in zip(self.members, counts) for n in m[:c])


def device_classes(cluster: ClusterModel) -> DeviceClasses:
    """Devices of one profile file, memory, thread count, power mode and traits (machine and power figures,
    DeviceSpec.traits) form a class; a device that a per-pair link names is a class of its own (its links
    differ from its peers')."""
    linked = {name for pair in cluster.links for name in pair}
    groups: dict[tuple, list[str]] = {}
    for d in cluster.devices:
        key = ("linked", d.name) if d.name in linked else (d.profile.path, d.memory_mb, d.threads, d.mode, d.traits)
        groups.setdefault(key, []).append(d.name)
    members = tuple(tuple(g) for g in groups.values())
    labels = tuple(_label(cluster, m) for m in members)
    return DeviceClasses(members, labels)


def _label(cluster: ClusterModel, members: tuple[str, ...]) -> str:
    prof = cluster.device(members[0]).profile.name
    return members[0] if len(members) == 1 else f"{prof} x{len(members)}"


def sub_cluster(cluster: ClusterModel, names) -> ClusterModel:
    """The cluster of `names` alone, in cluster order, with the links between them."""
    keep = set(names)
    return replace(cluster, devices=tuple(d for d in cluster.devices if d.name in keep),
                   links={pair: link for pair, link in cluster.links.items() if pair <= keep})


# CostTable fields holding one entry per device: a column of an [L, D] array, or an item of a tuple; and
# fields that hold for any devices (source: the graph and model, to price the table again).
_PER_DEVICE_COLUMNS = ("layer_ms", "overhead_ms", "priced_ms", "shared_weight_ms")
_PER_DEVICE_ITEMS = ("devices", "measured", "curves")
_SHARED = ("out_elems", "out_positions", "source")


def restrict(cost: CostTable, cluster: ClusterModel) -> CostTable:
    """`cost` (priced on a larger cluster) for the devices of `cluster` only: what build_cost_table would
    price for it, without pricing every layer again. A CostTable field this does not know is an error,
    so that a new per-device field cannot be carried over unrestricted."""
    idx = [cost.index(n) for n in cluster.device_names]
    kw = {}
    for f in fields(CostTable):
        value = getattr(cost, f.name)
        if f.name in _PER_DEVICE_COLUMNS:
            kw[f.name] = None if value is None else np.ascontiguousarray(value[:, idx])
        elif f.name in _PER_DEVICE_ITEMS:
            kw[f.name] = tuple(value[i] for i in idx)
        elif f.name in _SHARED:
            kw[f.name] = value
        elif f.name != "cluster":
            raise RuntimeError(f"restrict() does not know CostTable field {f.name!r}: teach it how to restrict it")
    return CostTable(cluster=cluster, **kw)


def rename_plan(plan: Plan, names: dict[str, str]) -> Plan:
    """The same plan on other devices of the same classes: every device `d` becomes `names[d]`."""
    def stage(s: Stage) -> Stage:
        sp = s.spatial
        if sp is not None:
            sp = replace(sp, segments=tuple(replace(g, tiles=tuple(_tile(t, names) for t in g.tiles))
                                            for g in sp.segments))
        return replace(s, device=names[s.device], spatial=sp)

    return replace(plan, stages=tuple(stage(s) for s in plan.stages))


def _tile(t: Tile, names: dict[str, str]) -> Tile:
    return replace(t, device=names[t.device])
