"""The Focus stem tiles (issue 12): yolo_focus under --strategy spatial on four rpi5 tiles from the model input,
strided Slices and their Concat inside the tiled region, and the split model reproduces onnxruntime on the
whole (`edgec run --verify`)."""
from __future__ import annotations

import pytest

from edgec import models
from tests.e2e.test_end_to_end import compile_and_verify
from tests.e2e.test_tiling_anywhere import pi5_cluster
from tests.matrix import quick_only


@pytest.mark.parametrize("strategy", quick_only(["spatial", "hybrid"], {"hybrid"}))
def test_focus_stem_inside_the_tiled_region_verifies(strategy, tmp_path):
    # at 1000 Mbps: at 100 Mbps scattering the 1.2 MB image costs more than tiling saves (see the report)
    summary, _ = compile_and_verify(models.ensure("yolo_focus"), pi5_cluster(tmp_path, 4, 1000), tmp_path / "out",
                                    "--strategy", strategy)
    first = summary["stages"][0]
    assert first["layers"][0] == 0 and first["spatial"]  # the region starts at the model input
    assert first["first_layer"] == "slice_0"
    assert len({t["device"] for seg in first["spatial"]["segments"] for t in seg["tiles"]}) == 4
