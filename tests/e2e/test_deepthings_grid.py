"""DeepThings with a true N x M grid, through the CLI: compile -> `edgec run --verify` passes, the JSON
summary and `edgec inspect MANIFEST` show each tile's rows and columns, bad grids are one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgec import models
from tests.e2e.test_spatial_e2e import with_logits

HERE = Path(__file__).resolve().parent
PROFILES = ("rpi5", "rpi4", "rpi4", "rpi5", "jetson-nano", "laptop")


def edgec(*args):
    return subprocess.run([sys.executable, "-m", "edgec.compiler", *map(str, args)], capture_output=True, text=True, timeout=600)


def six_devices(tmp: Path) -> Path:
    doc = {"devices": [{"name": f"d{i}", "profile": p} for i, p in enumerate(PROFILES)],
           "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched", "links": []}}
    path = tmp / "six.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def compile_verify(model: Path, cluster: Path, out: Path, grid: str, layers: int | None = None) -> dict:
    extra = ["--deepthings-layers", layers] if layers else []
    c = edgec("compile", model, "--devices", cluster, "-o", out, "--json", "--strategy", "deepthings",
              "--deepthings-grid", grid, *extra)
    assert c.returncode == 0, c.stderr[-2000:]
    r = edgec("run", out / "manifest.json", "--random-inputs", "--seed", "5", "--verify", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    verify = json.loads(r.stdout)["verify"]
    assert verify["passed"], verify
    print(f"{model.name} {grid}: max|diff| {verify['max_abs_diff']:.3g}")
    return json.loads(c.stdout)


def grid_tiles(summary: dict) -> list[dict]:
    sp = summary["stages"][0]["spatial"]
    assert sp is not None and len(sp["segments"]) == 1
    return sp["segments"][0]["tiles"]


@pytest.mark.parametrize("grid, layers", [("2x2", 9), pytest.param("3x2", 9, marks=pytest.mark.slow), ("2x3", None)])
def test_tinyconv_grid_verifies(grid, layers, tmp_path):
    """Residual, strided, pooled and inception-like blocks; 10 x 8 rows and columns do not divide by 3."""
    model = with_logits(models.ensure("tinyconv"), tmp_path / "tinyconv.onnx")
    summary = compile_verify(model, six_devices(tmp_path), tmp_path / "o", grid, layers)
    n, m = map(int, grid.split("x"))
    tiles = grid_tiles(summary)
    assert len(tiles) == n * m and len({t["device"] for t in tiles}) == n * m
    assert len({tuple(t["rows"]) for t in tiles}) == n and len({tuple(t["cols"]) for t in tiles}) == m
    if layers:
        assert summary["stages"][0]["layers"] == [0, layers]


def test_grid_inspect_shows_rows_and_columns(tmp_path):
    model, four = models.ensure("tinychain"), HERE / "clusters/four.yaml"
    summary = compile_verify(model, four, tmp_path / "o", "2x2")
    ins = edgec("inspect", tmp_path / "o/manifest.json", "--json")
    assert ins.returncode == 0, ins.stderr
    plan = json.loads(ins.stdout)
    assert [(t["rows"], t["cols"]) for t in plan["tiles"]] == [(t["rows"], t["cols"]) for t in grid_tiles(summary)]
    assert all(t["fragment"] and t["axis"] == "height x width" for t in plan["tiles"])
    scatter = [e for e in plan["exchanges"] if e["kind"] == "scatter"]
    assert len(scatter) == 3 and all(isinstance(e["region"], list) for e in scatter)
    assert {e["kind"] for e in plan["exchanges"]} == {"scatter", "gather"}  # fused: no halo exchange
    text = edgec("inspect", tmp_path / "o/manifest.json").stdout
    assert "cols" in text and " W " in text


@pytest.mark.slow  # the real model zoo: the tinyconv grids above run in README's test command
@pytest.mark.parametrize("name, grid, layers", [("squeezenet", "2x2", None), ("mobilenetv2", "3x2", 40)])
def test_zoo_grid_verifies(name, grid, layers, tmp_path):
    """Fire modules; inverted residuals with depthwise convs fused over 40 layers (14 rows in 3 bands)."""
    model = with_logits(models.ensure(name), tmp_path / f"{name}.onnx")
    summary = compile_verify(model, six_devices(tmp_path), tmp_path / "o", grid, layers)
    n, m = map(int, grid.split("x"))
    assert len(grid_tiles(summary)) == n * m


def test_bad_grids_are_one_line_errors(tmp_path):
    model, four = models.ensure("tinyconv"), HERE / "clusters/four.yaml"
    flat = _flat_model(tmp_path / "flat.onnx")
    for m, grid, msg in [(model, "3x2", "6 tiles, more than the 4 devices"), (model, "2x0", "NxM"),
                         (flat, "2x2", "at least 2 rows and 2 columns")]:  # a grid finer than every feature map
        p = edgec("compile", m, "--devices", four, "-o", tmp_path / "bad", "--strategy", "deepthings",
                  "--deepthings-grid", grid)
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 2 and msg in last and "Traceback" not in p.stderr, p.stderr
        assert not (tmp_path / "bad").exists()


def _flat_model(path: Path) -> Path:
    """Two 3x3 convs over a 1-row image: no feature map has the 2 rows a 2 x 2 grid needs."""
    from tests.compiler.test_tiles import small_net

    return small_net(path, 1, 8)
