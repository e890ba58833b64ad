"""Plan: the one object handed from planning to emission (frozen, JSON round-trip, self-checking).

It sits beside graph.py, below cost/ (which evaluates plans), plan/ (whose planners produce them) and
the emitter (which turns them into fragments and a manifest), so that none of those imports another to
name what a plan is.
"""

from __future__ import annotations

import itertools
import numbers
from dataclasses import asdict, dataclass
from typing import Any

from .graph import LayerGraph

__all__ = ["Tile", "Segment", "SpatialGroup", "Stage", "Plan", "PlanError"]


class PlanError(Exception):
    """A plan that breaks an invariant: a planner bug, never a user error."""


@dataclass(frozen=True)
class Tile:
    """Rows (or columns) [start, stop) of a segment's output tensor that one device computes, along the
    group's axis. With `cols` (a 2-D grid, group axis height only), the tile is rows [start, stop) by
    columns [cols[0], cols[1]); None means every column (all 1-D plans)."""

    device: str
    start: int
    stop: int
    cols: tuple[int, int] | None = None


@dataclass(frozen=True)
class Segment:
    """Layers [lo, hi) run fused on every tile: no exchange inside, overlapping halo rows recomputed.

    Segment boundaries lie on serial-block cuts, so a segment's output is one tensor, tiled by `tiles`.
    Between consecutive segments each device receives from its neighbours only the halo rows it needs.
    """

    lo: int
    hi: int
    tiles: tuple[Tile, ...]


@dataclass(frozen=True)
class SpatialGroup:
    """Height (axis 2) or width (axis 3) partitioning of a stage's layers across a group of devices; a
    grid (tiles with `cols`, axis 2) partitions height and width at once."""

    axis: int
    segments: tuple[Segment, ...]

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.device for seg in self.segments for t in seg.tiles))

    @property
    def grid(self) -> bool:
        """Tiles cut height and width (each tile has `cols`), as DeepThings' N x M grid."""
        return any(t.cols is not None for seg in self.segments for t in seg.tiles)

    @property
    def axes(self) -> tuple[int, ...]:
        """The tiled axes: (axis,), or (2, 3) for a grid (a tile's rows, then its columns)."""
        return (2, 3) if self.grid else (self.axis,)


@dataclass(frozen=True)
class Stage:
    """Layers [lo, hi) of the graph's topological order, run on one device, or, with `spatial`, tiled
    across a group of devices whose results are gathered on `device`."""

    device: str
    lo: int
    hi: int
    spatial: SpatialGroup | None = None


@dataclass(frozen=True)
class Plan:
    strategy: str  # the planner that produced it: pipeline, single, even, neurosurgeon, ...
    objective: str  # latency | throughput
    stages: tuple[Stage, ...]
    # ((device, mode), ...): the devices the plan needs in a power mode other than their top level's
    # (plan/pipeline_energy.py); the driver prices it on CostTable.with_modes and the manifest names them.
    modes: tuple[tuple[str, str], ...] = ()

    def ensures(self, graph: LayerGraph) -> "Plan":
        """Every layer placed exactly once and stages in dependency order; spatial segments cover their
        stage and their tiles cover each segment output exactly, in order."""
        if not self.stages:
            raise PlanError("plan has no stages")
        pos = 0
        for s in self.stages:
            if s.lo != pos or s.hi <= s.lo:
                raise PlanError(f"stage {s} does not continue at layer {pos}")
            pos = s.hi
        if pos != len(graph.layers):
            raise PlanError(f"plan covers {pos} of {len(graph.layers)} layers")
        for s in self.stages:
            if s.spatial is not None:
                _check_group(s, graph)
        return self

    def stage_of_layer(self) -> list[int]:
        out = []
        for k, s in enumerate(self.stages):
            out.extend([k] * (s.hi - s.lo))
        return out

    def to_dict(self) -> dict:
        """The plan as plain data (the manifest's `plan` section): what `from_dict` reads back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "Plan":
        """The plan `to_dict` gave, also as JSON reads it back (lists for tuples). ValueError at the first
        thing that does not fit, naming its JSON location: "plan.stages[0].lo: expected an integer"."""
        d = _obj(d, "plan")
        stages = _seq(d.get("stages"), "plan.stages")
        modes = _seq(d.get("modes", ()), "plan.modes")
        return cls(_str(d, "strategy", "plan"), _str(d, "objective", "plan"),
                   tuple(_stage_from_dict(s, f"plan.stages[{i}]") for i, s in enumerate(stages)),
                   tuple(_mode_from_dict(m, f"plan.modes[{k}]") for k, m in enumerate(modes)))


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ValueError(f"{where}: expected {what}")


def _obj(v: Any, where: str, what: str = "an object") -> dict:
    _need(isinstance(v, dict), where, what)
    return v


def _seq(v: Any, where: str) -> list | tuple:
    _need(isinstance(v, (list, tuple)), where, "a list")
    return v


def _str(d: dict, key: str, where: str) -> str:
    _need(isinstance(d.get(key), str), f"{where}.{key}", "a string")
    return d[key]


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _int(d: dict, key: str, where: str) -> int:
    _need(_is_int(d.get(key)), f"{where}.{key}", "an integer")
    return int(d[key])


def _mode_from_dict(m: Any, where: str) -> tuple[str, str]:
    _need(isinstance(m, (list, tuple)) and len(m) == 2 and all(isinstance(x, str) for x in m), where,
          "[device, mode] strings")
    return (m[0], m[1])


def _stage_from_dict(d: Any, where: str) -> Stage:
    d = _obj(d, where)
    sp, group = d.get("spatial"), None
    if sp is not None:
        sp = _obj(sp, f"{where}.spatial", "an object or null")
        segments = _seq(sp.get("segments"), f"{where}.spatial.segments")
        group = SpatialGroup(_int(sp, "axis", f"{where}.spatial"),
                             tuple(_segment_from_dict(g, f"{where}.spatial.segments[{j}]") for j, g in enumerate(segments)))
    return Stage(_str(d, "device", where), _int(d, "lo", where), _int(d, "hi", where), group)


def _segment_from_dict(g: Any, where: str) -> Segment:
    g = _obj(g, where)
    tiles = _seq(g.get("tiles"), f"{where}.tiles")
    return Segment(_int(g, "lo", where), _int(g, "hi", where),
                   tuple(_tile_from_dict(t, f"{where}.tiles[{k}]") for k, t in enumerate(tiles)))


def _tile_from_dict(t: Any, where: str) -> Tile:
    t = _obj(t, where)
    cols = t.get("cols")
    if cols is not None:
        _need(isinstance(cols, (list, tuple)) and len(cols) == 2 and all(_is_int(c) for c in cols),
              f"{where}.cols", "[start, stop] integers or null")
        cols = (int(cols[0]), int(cols[1]))
    return Tile(_str(t, "device", where), _int(t, "start", where), _int(t, "stop", where), cols)


def _check_group(stage: Stage, graph: LayerGraph) -> None:
    g = stage.spatial
    if g.axis not in (2, 3):
        raise PlanError(f"spatial axis {g.axis} is neither height (2) nor width (3)")
    if g.grid and (g.axis != 2 or any(t.cols is None for seg in g.segments for t in seg.tiles)):
        raise PlanError("a grid's tiles all have columns, and its axis is height")
    pos = stage.lo
    for seg in g.segments:
        if seg.lo != pos or seg.hi <= seg.lo:
            raise PlanError(f"segment {seg.lo}-{seg.hi} does not continue at layer {pos}")
        pos = seg.hi
        outs = graph.live_across(seg.hi) if seg.hi < len(graph.layers) else graph.layers[seg.hi - 1].outputs
        if len(outs) != 1:
            raise PlanError(f"segment {seg.lo}-{seg.hi} does not end on a single tensor: {outs}")
        shape = graph.tensors[outs[0]].shape
        if g.grid:  # row-major: bands of equal rows continue down, each band's columns across
            bands = [(k, [t.cols for t in ts]) for k, ts in itertools.groupby(seg.tiles, key=lambda t: (t.start, t.stop))]
            _check_cover([k for k, _ in bands], shape[2], f"rows of {outs[0]}")
            for (a, b), cols in bands:
                _check_cover(cols, shape[3], f"columns of {outs[0]} in rows {a}:{b}")
        else:
            _check_cover([(t.start, t.stop) for t in seg.tiles], shape[g.axis], f"rows of {outs[0]}")
        if len({t.device for t in seg.tiles}) != len(seg.tiles):
            raise PlanError(f"a device holds two tiles of {outs[0]}")
    if pos != stage.hi:
        raise PlanError(f"segments cover layers {stage.lo}-{pos}, not {stage.lo}-{stage.hi}")


def _check_cover(ranges: list[tuple[int, int]], size: int, what: str) -> None:
    """Ranges continue one another from 0 to size: a grid's row bands, or one band's columns."""
    at = 0
    for a, b in ranges:
        if a != at or b <= a:
            raise PlanError(f"tile range {a}:{b} does not continue at {at} ({what})")
        at = b
    if at != size:
        raise PlanError(f"tiles cover {at} of {size} {what}")
