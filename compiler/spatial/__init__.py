"""Spatial tiling, no ONNX: exact row ranges of tiles through Type-1/Type-2 layers (regions.py, no costs), and
each spatial stage's tiles laid out from them (tiles.py). emit/tiles.py builds the tiles' ONNX models."""

from .regions import (
    AXES, Need, NotTileable, SegmentMaps, TileRegion, segment_io, segment_maps, segment_region, spatial_cuts,
    tile_pads, tileable, window_need, window_rows,
)
from .tiles import Geometry, TileSpec, stage_layout, tile_name

__all__ = [
    "AXES", "Need", "NotTileable", "SegmentMaps", "TileRegion", "segment_io", "segment_maps", "segment_region",
    "spatial_cuts", "tile_pads", "tileable", "window_need", "window_rows",
    "Geometry", "TileSpec", "stage_layout", "tile_name",
]
