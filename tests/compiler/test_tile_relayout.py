"""What a tile fragment pays for being a fragment (cost/tiles.py Relayout): where the device's runtime converts
layouts (the profile's layout_conversions), converting its input and output where it holds a convolution
and each activation it crops (out and back in), each conversion a read and a write at memory_gbps; a crop
of its own input, or any crop where nothing converts, is a copy of the rows kept."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import onnx
import pytest
from onnx import shape_inference

from edgec.compiler import api
from edgec.compiler.cluster import ClusterModel, DeviceSpec, load_cluster, load_profile
from edgec.compiler.cost import build_cost_table, evaluate, simulate_manifest
from edgec.compiler.cost.stage_timeline import predict_stage
from edgec.compiler.cost.tile_steps import StepModel
from edgec.compiler.cost.tiles import Relayout, SegmentCost
from edgec.compiler.emit import assemble_manifest, build_fragments, write_output
from edgec.compiler.ingest import load_model
from edgec.compiler.plan_types import Plan, Segment, SpatialGroup, Stage, Tile
from edgec.compiler.spatial.regions import segment_maps
from edgec.runtime.manifest.load import load_manifest
from tests.conftest import residual_model

BASE = load_profile("rpi5")
BYTE = 2 / (BASE.memory_gbps * 1e6)  # ms to convert (or copy) one byte: a read and a write at memory_gbps


def cluster(converts: bool, n: int = 2) -> ClusterModel:
    prof = dataclasses.replace(BASE, layout_conversions=converts)
    devs = tuple(DeviceSpec(f"d{i}", prof, prof.memory_mb, None) for i in range(n))
    return ClusterModel(devs, 100.0, 0.2, "switched", {}, "test")


def residual(tmp_path):
    path = tmp_path / "res.onnx"
    onnx.save(shape_inference.infer_shapes(residual_model()), path)
    return load_model(path)


def whole_stage(graph, tiles) -> Plan:
    """Every layer of the residual model as one spatial segment with the given tiles."""
    n = len(graph.layers)
    stage = Stage("d0", 0, n, SpatialGroup(2, (Segment(0, n, tiles),)))
    return Plan("manual", "latency", (stage,)).ensures(graph)


def emit(ing, cl: ClusterModel, plan: Plan, out: Path):
    cost = build_cost_table(ing.graph, cl, ing.sha256)
    pred = evaluate(plan, ing.graph, cost)
    frags = build_fragments(ing, plan, pred)
    write_output(out, assemble_manifest(ing, plan, pred, frags, cl.to_dict(), out, {"strategy": "manual"}), frags)
    return cost, pred


def test_a_tile_pays_its_conversions_and_its_crop(tmp_path):
    """Residual model (8 rows: c0 3x3, c1 3x3, Add(a, relu(b)), c2 1x1) in tiles [0, 4) and [4, 8). Tile 0
    holds a's rows [0, 5) (c1 reads one more), the Add reads [0, 4): one crop of a 640-byte held tensor
    (4 channels x 8 columns x 4 bytes a row). It reads x's rows [0, 6) (64 bytes a row) and writes 4 rows of
    y (128 bytes a row)."""
    ing = residual(tmp_path)
    graph = ing.graph
    plan = whole_stage(graph, (Tile("d0", 0, 4), Tile("d1", 4, 8)))
    cost, pred = emit(ing, cluster(True), plan, tmp_path / "out")
    _, plain = emit(ing, cluster(False), plan, tmp_path / "plain")
    ends = BYTE * (6 * 64 + 4 * 128)  # x's 6 rows converted in, y's 4 rows out
    crop = 2 * BYTE * 5 * 128  # a's 5 rows out and back in, against a copy of the Add's 4 rows without
    for n in range(2):
        assert pred.tile_ms[0, 0, n] - plain.tile_ms[0, 0, n] == pytest.approx(ends + crop - BYTE * 4 * 128, rel=1e-9), n
    # the fragments carry it, and simulate (which replays them) agrees with the prediction
    manifest = load_manifest(tmp_path / "out" / "manifest.json")
    assert manifest.fragments["f0s0t1"].predicted_ms == pytest.approx(pred.tile_ms[0, 0, 1], abs=1e-4)
    assert simulate_manifest(manifest)["latency_ms"] == pytest.approx(pred.latency_ms, rel=1e-4)
    assert pred.latency_ms > plain.latency_ms


def test_where_nothing_converts_a_crop_is_a_copy_and_the_ends_are_free(tmp_path):
    ing = residual(tmp_path)
    graph = ing.graph
    cost = build_cost_table(graph, cluster(False), ing.sha256)
    rl = Relayout.build(graph, cost, (segment_maps(graph, 0, len(graph.layers), 2),))
    assert rl.ms(0, (0,), (4,)) == pytest.approx(BYTE * 4 * 128, rel=1e-12)
    assert rl.ms(0, (0,), (8,)) == 0.0  # the whole plane: nothing to crop, and nothing converts


def test_a_tile_of_the_whole_plane_pays_no_crop(tmp_path):
    ing = residual(tmp_path)
    graph = ing.graph
    cost = build_cost_table(graph, cluster(True), ing.sha256)
    rl = Relayout.build(graph, cost, (segment_maps(graph, 0, len(graph.layers), 2),))
    assert rl.crops_in((0,), (8,)) == []
    assert rl.ms(0, (0,), (8,)) == pytest.approx(BYTE * (8 * 64 + 8 * 128), rel=1e-12)
    assert [t for t, _ in rl.crops_in((2,), (6,))] == ["a"]


def test_the_step_model_prices_tiles_as_predict_stage(tmp_path):
    """The spatial search's per-tile compute (SegmentCost's table, through StepModel) is predict_stage's,
    conversions and crops included, for every split of the residual model's rows."""
    ing = residual(tmp_path)
    graph = ing.graph
    cost = build_cost_table(graph, cluster(True), ing.sha256)
    n = len(graph.layers)
    sc = SegmentCost.build(graph, cost, 0, n, 2)
    model = StepModel(cost, [0, 1])
    cx = model.context(sc, [(0, 0, 8)])
    for split in range(1, 8):
        info = predict_stage(whole_stage(graph, (Tile("d0", 0, split), Tile("d1", split, 8))).stages[0], graph, cost)
        for k, (a, b) in enumerate(((0, split), (split, 8))):
            _, comp, _, _ = model.term(cx, k, a, b, (0.0,), 0.0)
            assert comp == pytest.approx(info["tile_ms"][0, k], rel=1e-12), (split, k)
            assert comp == pytest.approx(sc.comp(k, a, b), rel=1e-12)


def test_grid_tiles_pay_their_crops(tmp_path):
    """A 2 x 2 grid: each box crops a (its rows and columns beyond the Add's), priced per box, and the
    crops it pays are the emitter's Slice nodes."""
    ing = residual(tmp_path)
    graph = ing.graph
    n = len(graph.layers)
    tiles = tuple(Tile(f"d{2 * i + k}", *r, c) for i, r in enumerate(((0, 4), (4, 8))) for k, c in enumerate(((0, 4), (4, 8))))
    plan = Plan("manual", "latency", (Stage("d0", 0, n, SpatialGroup(2, (Segment(0, n, tiles),))),)).ensures(graph)
    _, pred = emit(ing, cluster(True, 4), plan, tmp_path / "out")
    _, plain = emit(ing, cluster(False, 4), plan, tmp_path / "plain")
    cost = build_cost_table(graph, cluster(True, 4), ing.sha256)
    rl = Relayout.build(graph, cost, (segment_maps(graph, 0, n, 2), segment_maps(graph, 0, n, 3)))
    for k, t in enumerate(tiles):
        box = ((t.start, t.cols[0]), (t.stop, t.cols[1]))
        assert [x for x, _ in rl.crops_in(*box)] == _slices(tmp_path / "out" / f"{t.device}.f0s0t{k}.onnx") == ["a"]
        held = 5 * 5 * 4 * 4  # a's 5 x 5 box of 4 channels
        kept = 4 * 4 * 4 * 4
        want = BYTE * (6 * 6 * 2 * 4 + 4 * 4 * 4 * 4) + 2 * BYTE * held - BYTE * kept
        assert pred.tile_ms[0, 0, k] - plain.tile_ms[0, 0, k] == pytest.approx(want, rel=1e-9), k


def _slices(path: Path) -> list[str]:
    """The tensors the emitter slices inside a tile fragment (its Slice nodes are named tensor@slice[...])."""
    return sorted(node.name.split("@slice")[0] for node in onnx.load(path).graph.node if "@slice" in node.name)


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2"])
def test_the_crops_are_the_emitters_slices_on_real_models(tmp_path, name):
    """Every tile of a two-device spatial plan of a real architecture pays exactly the crops the emitter
    writes into its fragment (ResNet-50: residual shortcuts; MobileNetV2: inverted residuals)."""
    model = Path(os.environ["EDGEC_MODELS_DIR"]) / f"{name}.onnx"
    devices = tmp_path / "two.yaml"
    devices.write_text("devices:\n- {name: a, profile: rpi5}\n- {name: b, profile: rpi5}\n"
                       "network: {bandwidth_mbps: 1000, latency_ms: 0.1}\n")
    out = tmp_path / "out"
    summary = api.compile(model, devices, out, strategy="spatial", objective="latency")
    stage = next(s for s in summary["stages"] if s.get("spatial"))
    ing = load_model(model)
    cost = build_cost_table(ing.graph, load_cluster(devices), ing.sha256)
    slices = 0
    for j, seg in enumerate(stage["spatial"]["segments"]):
        rl = Relayout.build(ing.graph, cost, (segment_maps(ing.graph, *seg["layers"], 2),))
        for k, tile in enumerate(seg["tiles"]):
            emitted = _slices(out / f"{tile['device']}.f0s{j}t{k}.onnx")
            assert sorted(t for t, _ in rl.crops_in((tile["rows"][0],), (tile["rows"][1],))) == emitted, (j, k)
            slices += len(emitted)
    assert slices > 0 and summary["strategy"] == "spatial"
