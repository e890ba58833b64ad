"""Tiling after an untileable stem: the Focus-stem detector compiles under spatial and hybrid with a stem
stage before the tiled region, and the split model reproduces onnxruntime on the whole (`edgec run --verify`)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edgec import models
from tests.e2e.test_end_to_end import compile_and_verify
from tests.matrix import quick_only


def pi5_cluster(tmp: Path, n: int, mbps: float) -> Path:
    doc = {"devices": [{"name": f"pi5-{i}", "profile": "rpi5"} for i in range(n)],
           "network": {"bandwidth_mbps": mbps, "latency_ms": 0.2, "medium": "switched"}}
    path = tmp / f"pi5x{n}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("strategy", quick_only(["spatial", "hybrid"], {"spatial"}))
def test_focus_detector_tiles_on_two_devices_and_verifies(strategy, tmp_path):
    # at 1000 Mbps the detector is worth tiling on two rpi5 (at 100 Mbps the scatter of its 1.2 MB input
    # costs more than the tiles save). Its Focus stem tiles too (strided Slices), so the tiled
    # region may start at the model input; test_spatial_stem covers a region after an untileable stem.
    summary, run = compile_and_verify(models.ensure("yolo_focus"), pi5_cluster(tmp_path, 2, 1000), tmp_path / "out",
                                      "--strategy", strategy)
    stages = summary["stages"]
    k = next(k for k, s in enumerate(stages) if s["spatial"])
    assert len({t["device"] for seg in stages[k]["spatial"]["segments"] for t in seg["tiles"]}) == 2
