"""Tile layout: each tile of a spatial stage as a TileSpec (its rows, store names and fragment id) with the
row math of every tiled axis (no ONNX: emit/tiles.py builds the tiles' models from this)."""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import LayerGraph
from ..plan_types import Stage
from .regions import SegmentMaps, TileRegion, segment_maps, segment_region

__all__ = ["tile_name", "TileSpec", "Geometry", "stage_layout"]

# A tile's row math on each tiled axis: ((maps, region),) along the group's axis, or, for a 2-D grid
# tile, the height pair then the width pair (windows are separable: each axis is independent).
Geometry = tuple[tuple[SegmentMaps, TileRegion], ...]


def tile_name(tensor: str, device: str, start: int, stop: int, cols: tuple[int, int] | None = None) -> str:
    """Store name of rows [start, stop) (and, for a 2-D tile, columns cols) of graph tensor `tensor`
    held by `device`: `t@dev[a:b]`, or `t@dev[a:b,c:d]`.

    The same name always means the same rows on the same device, so a piece that is exactly what a
    fragment needs is used as is; graph names never contain "@...[a:b]" in practice (checked in emit)."""
    span = f"{start}:{stop}" if cols is None else f"{start}:{stop},{cols[0]}:{cols[1]}"
    return f"{tensor}@{device}[{span}]"


@dataclass(frozen=True)
class TileSpec:
    """One tile fragment of a spatial stage: segment j's layers on `device`, producing rows `out_rows` of
    `output` from rows `in_rows` of `input` (the segment's input, clipped to the tensor)."""

    stage: int
    segment: int
    index: int
    device: str
    lo: int
    hi: int
    axis: int
    input: str
    in_rows: tuple[int, int]
    output: str
    out_rows: tuple[int, int]
    in_cols: tuple[int, int] | None = None  # a 2-D tile's columns (axis 3); None: all of them
    out_cols: tuple[int, int] | None = None

    @property
    def fid(self) -> str:
        return f"f{self.stage}s{self.segment}t{self.index}"

    @property
    def in_name(self) -> str:
        return tile_name(self.input, self.device, *self.in_rows, self.in_cols)

    @property
    def out_name(self) -> str:
        return tile_name(self.output, self.device, *self.out_rows, self.out_cols)

    @property
    def axes(self) -> tuple[int, ...]:
        return (self.axis,) if self.out_cols is None else (2, 3)

    @property
    def in_box(self) -> tuple[tuple[int, int], ...]:
        """The input's range on each of `axes`."""
        return (self.in_rows,) if self.in_cols is None else (self.in_rows, self.in_cols)

    @property
    def out_box(self) -> tuple[tuple[int, int], ...]:
        return (self.out_rows,) if self.out_cols is None else (self.out_rows, self.out_cols)


def stage_layout(graph: LayerGraph, stage: Stage, k: int) -> list[tuple[SegmentMaps, list[tuple[TileSpec, Geometry]]]]:
    """Per segment of spatial stage k: its row maps (along the group's axis) and each tile's spec and
    geometry (one (maps, region) pair per tiled axis; a grid tile adds the width's).

    Consecutive segments must chain (segment j's input is segment j-1's output): the emitter moves only
    that one tensor between segments."""
    out = []
    prev = None
    for j, seg in enumerate(stage.spatial.segments):
        maps = segment_maps(graph, seg.lo, seg.hi, stage.spatial.axis)
        cross = segment_maps(graph, seg.lo, seg.hi, 3) if stage.spatial.grid else None
        if prev is not None and maps.input != prev:
            raise ValueError(f"segment {seg.lo}-{seg.hi} reads {maps.input}, not the previous segment's {prev}")
        tiles = []
        for i, t in enumerate(seg.tiles):
            geo = ((maps, segment_region(maps, t.start, t.stop)),)
            if cross is not None:
                geo += ((cross, segment_region(cross, *t.cols)),)
            in_cols = geo[1][1].rows[maps.input] if cross is not None else None
            spec = TileSpec(k, j, i, t.device, seg.lo, seg.hi, maps.axis, maps.input, geo[0][1].rows[maps.input],
                            maps.output, (t.start, t.stop), in_cols, t.cols)
            tiles.append((spec, geo))
        out.append((maps, tiles))
        prev = maps.output
    return out
