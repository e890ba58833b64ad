"""Every spatial strategy, through the CLI: compile -> run -> outputs equal the whole model; the JSON
summary names the tiles; bad spatial options are one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgec import models
from tests.matrix import checkerboard

HERE = Path(__file__).resolve().parent
SPATIAL = ["spatial", "hybrid", "bbgrap", "edgeflow", "deepthings"]


def edgec(*args):
    return subprocess.run([sys.executable, "-m", "edgec.compiler", *map(str, args)], capture_output=True, text=True, timeout=900)


def compile_run(model, cluster, out, *extra):
    c = edgec("compile", model, "--devices", cluster, "-o", out, "--json", *extra)
    if c.returncode != 0:
        return None, c
    r = edgec("run", out / "manifest.json", "--random-inputs", "--seed", "5", "--verify", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["verify"]["passed"]
    return json.loads(c.stdout), c


@pytest.mark.parametrize(("strategy", "cluster"), checkerboard(SPATIAL, ["two", "four"]))
def test_spatial_strategies_verify(strategy, cluster, tmp_path):
    summary, proc = compile_run(models.ensure("tinyconv"), HERE / "clusters" / f"{cluster}.yaml", tmp_path / "o",
                                "--strategy", strategy)
    if summary is None:  # a planner may find no plan for a cluster; it must say why, in one line, exit 2
        assert proc.returncode == 2 and strategy in proc.stderr and "Traceback" not in proc.stderr
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert summary["strategy"] == strategy
    tiled = [s for s in summary["stages"] if s["spatial"]]
    assert tiled, summary["stages"]
    devices_with_tiles = {t["device"] for s in tiled for g in s["spatial"]["segments"] for t in g["tiles"]}
    assert len(devices_with_tiles) >= 2
    assert summary["bytes_transferred"] > 0


def test_auto_chooses_spatial_when_it_is_predicted_fastest(tmp_path):
    summary, _ = compile_run(models.ensure("tinyconv"), HERE / "clusters/four.yaml", tmp_path / "o",
                             "--objective", "latency", "--search-threshold", "0.2")
    best = min(c["latency_ms"] for c in summary["candidates"] if c["feasible"])
    assert summary["predicted_latency_ms"] == pytest.approx(best)


def test_deepthings_options(tmp_path):
    model, two = models.ensure("tinyconv"), HERE / "clusters/two.yaml"
    summary, _ = compile_run(model, two, tmp_path / "o", "--strategy", "deepthings", "--deepthings-grid", "1x2",
                             "--deepthings-layers", "3")
    seg = summary["stages"][0]["spatial"]
    assert seg["axis"] == "width" and len(seg["segments"]) == 1
    for bad, msg in [("3", "NxM"), ("2x2", "grid"), ("9x1", "grid")]:
        p = edgec("compile", model, "--devices", two, "-o", tmp_path / "bad", "--strategy", "deepthings",
                  "--deepthings-grid", bad)
        assert p.returncode == 2 and msg in p.stderr.strip().splitlines()[-1] and "Traceback" not in p.stderr
        assert not (tmp_path / "bad").exists()
    p = edgec("compile", model, "--devices", two, "-o", tmp_path / "bad", "--search-threshold", "1.5")
    assert p.returncode == 2 and "search-threshold" in p.stderr


def test_transformer_has_no_spatial_plan(tmp_path):
    p = edgec("compile", models.ensure("tinytransformer"), "--devices", HERE / "clusters/two.yaml", "-o",
              tmp_path / "o", "--strategy", "spatial")
    assert p.returncode == 2 and "spatial" in p.stderr.strip().splitlines()[-1]
