"""Spatial tiling: exact row ranges of tiles through Type-1/Type-2 layers (regions.py: no ONNX, no costs), and
the ONNX models of the tiles built from them (tiles.py)."""

from .regions import (
    AXES, Need, NotTileable, SegmentMaps, TileRegion, segment_io, segment_maps, segment_region, spatial_cuts,
    tile_pads, tileable, window_need, window_rows,
)

__all__ = [
    "AXES", "Need", "NotTileable", "SegmentMaps", "TileRegion", "segment_io", "segment_maps", "segment_region",
    "spatial_cuts", "tile_pads", "tileable", "window_need", "window_rows",
]
