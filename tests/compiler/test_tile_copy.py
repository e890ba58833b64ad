"""A tile whose input is assembled from several parts (its own rows and halo rows from neighbours) pays
the copy: 2 x the assembled bytes / the device's memory bandwidth, in predict_stage, in the tile
fragment's predicted_ms and in the spatial search's step model."""

from __future__ import annotations

import dataclasses
import math
import re

import onnx
import pytest
from onnx import shape_inference

from edgec.compiler.cluster import ClusterModel, DeviceSpec, load_profile
from edgec.compiler.cost import build_cost_table, evaluate, simulate_manifest
from edgec.compiler.cost.stage_timeline import assembly_cells, predict_stage
from edgec.compiler.cost.tile_steps import StepModel
from edgec.compiler.cost.tiles import SegmentCost
from edgec.compiler.emit import assemble_manifest, build_fragments, write_output
from edgec.compiler.ingest import load_model
from edgec.compiler.plan_types import Plan, Segment, SpatialGroup, Stage, Tile
from edgec.compiler.spatial import spatial_cuts
from edgec.compiler.spatial.tiles import stage_layout
from edgec.runtime.manifest.load import load_manifest
from tests.conftest import conv_chain_model

PROFILES = {n: load_profile(n) for n in ("rpi5", "rpi4")}
SIZE, CHANNELS = 16, 8


def cluster(kinds) -> ClusterModel:
    devs = tuple(DeviceSpec(f"{k}-{i}", PROFILES[k], PROFILES[k].memory_mb, None) for i, k in enumerate(kinds))
    return ClusterModel(devs, 100.0, 0.2, "switched", {}, "test")


def chain(tmp_path, n: int = 3):
    path = tmp_path / "chain.onnx"
    onnx.save(shape_inference.infer_shapes(conv_chain_model(n=n, channels=CHANNELS, size=SIZE)), path)
    return load_model(path)


def rows_stage(graph, devs, splits) -> Stage:
    """One segment per block cut of the conv chain along the height, segment j split at splits[j]
    between devs[0] (top rows) and devs[1]."""
    cuts = spatial_cuts(graph, 2)[: len(splits) + 1]
    segs = tuple(Segment(a, b, (Tile(devs[0], 0, s), Tile(devs[1], s, SIZE)))
                 for a, b, s in zip(cuts, cuts[1:], splits))
    return Stage(devs[0], cuts[0], cuts[-1], SpatialGroup(2, segs))


def plan_of(graph, stage: Stage) -> Plan:
    return Plan("manual", "latency", (stage, Stage(stage.device, stage.hi, len(graph.layers)))).ensures(graph)


def emit(ing, cl: ClusterModel, plan: Plan, out):
    cost = build_cost_table(ing.graph, cl, ing.sha256)
    pred = evaluate(plan, ing.graph, cost)
    frags = build_fragments(ing, plan, pred)
    manifest = assemble_manifest(ing, plan, pred, frags, cl.to_dict(), out, {"strategy": "manual"})
    write_output(out, manifest, frags)
    return cost, pred, manifest


def free_copies(cost):
    """The same cost table with copies in memory free: the plan as priced before they counted."""
    free = dataclasses.replace(cost)
    free.__dict__["memory_bytes_per_ms"] = (math.inf,) * len(cost.devices)
    return free


def test_a_tile_assembled_from_halo_rows_pays_its_copy(tmp_path):
    """Segment 0 reads the scattered input (one part): no copy. Segment 1 split at 8: each tile reads one
    halo row from its neighbour, so it concatenates 9 rows of 8 channels x 16 columns of float32.
    Segment 2 split at 3: rpi5's tile reads rows 0-3 of its own 8 (a slice, no copy), rpi4's reads
    rows 2-16 from both."""
    ing = chain(tmp_path)
    graph = ing.graph
    cl = cluster(("rpi5", "rpi4"))
    stage = rows_stage(graph, cl.device_names, (8, 8, 3))
    cost, pred, manifest = emit(ing, cl, plan_of(graph, stage), tmp_path / "out")
    row = CHANNELS * SIZE * 4  # bytes of one row of every segment's input but the first
    copied = {(0, 0): 0, (0, 1): 0, (1, 0): 9 * row, (1, 1): 9 * row, (2, 0): 0, (2, 1): 14 * row}
    for (j, n), nbytes in copied.items():
        seg, tile = stage.spatial.segments[j], stage.spatial.segments[j].tiles[n]
        d = cost.index(tile.device)
        compute = SegmentCost.build(graph, cost, seg.lo, seg.hi, 2).comp(d, tile.start, tile.stop)
        copy = 2 * nbytes / (PROFILES[tile.device.split("-")[0]].memory_gbps * 1e6)
        assert pred.tile_ms[0, j, n] == pytest.approx(compute + copy, rel=1e-12, abs=1e-12), (j, n)
        assert (pred.tile_ms[0, j, n] > compute) == (nbytes > 0)
    # the tile fragments carry it, and simulate (which replays them) still agrees with the prediction
    frag_ms = {f["id"]: f["predicted_ms"] for f in manifest["fragments"]}
    assert all(frag_ms[f"f0s{j}t{n}"] == round(pred.tile_ms[0, j, n], 4) for j, n in copied)
    sim = simulate_manifest(load_manifest(tmp_path / "out" / "manifest.json"))
    assert sim["latency_ms"] == pytest.approx(pred.latency_ms, rel=1e-4)
    assert pred.latency_ms > evaluate(plan_of(graph, stage), graph, free_copies(cost)).latency_ms


def _concat_bytes(graph, manifest, stage) -> dict[str, int]:
    """Per device, the bytes its concat steps write into tile inputs (not the gather), from the names of
    the tensors they store: t@dev[a:b] or t@dev[a:b,c:d]."""
    inputs = {maps.input for maps, _ in stage_layout(graph, stage, 0)[1:]}
    out: dict[str, int] = {}
    for dev, steps in manifest["steps"].items():
        for s in steps:
            if s["op"] != "concat":
                continue
            m = re.fullmatch(r"(.*)@.*\[(\d+):(\d+)(?:,(\d+):(\d+))?\]", s["as"])
            if m and m[1] in inputs:
                shape = graph.tensors[m[1]].shape
                cols = shape[3] if m[4] is None else int(m[5]) - int(m[4])
                out[dev] = out.get(dev, 0) + shape[1] * (int(m[3]) - int(m[2])) * cols * 4
    return out


def _tiles(devs, edges, grid: bool) -> tuple[Tile, ...]:
    """Bands of rows cut at `edges`, one per device; or (grid) a 2 x 2 grid cut at row edges[0] and
    column edges[1], in row-major order."""
    if not grid:
        return tuple(Tile(d, a, b) for d, a, b in zip(devs, (0, *edges), (*edges, SIZE)))
    rows, cols = ((0, edges[0]), (edges[0], SIZE)), ((0, edges[1]), (edges[1], SIZE))
    return tuple(Tile(devs[2 * i + k], *r, c) for i, r in enumerate(rows) for k, c in enumerate(cols))


@pytest.mark.parametrize("grid", [False, True])
def test_the_copy_is_what_the_emitters_concatenations_write(tmp_path, grid):
    """Per device, the tiles' time beyond the plan priced with free copies is 2 x the bytes its concat
    steps write / its memory bandwidth: 1-D tiles, and a 2 x 2 grid (each band of boxes along the
    width, then the bands along the height)."""
    ing = chain(tmp_path)
    graph = ing.graph
    cl = cluster(("rpi5", "rpi4", "rpi4", "rpi5"))
    devs = cl.device_names
    cuts = spatial_cuts(graph, 2)[:3]
    # segment 1's cuts: every tile's input with its halo crosses a cut of segment 0
    first, second = ((8, 8), (6, 8)) if grid else ((4, 8, 12), (5, 8, 11))
    segs = (Segment(cuts[0], cuts[1], _tiles(devs, first, grid)), Segment(cuts[1], cuts[2], _tiles(devs, second, grid)))
    stage = Stage(devs[0], cuts[0], cuts[2], SpatialGroup(2, segs))
    plan = plan_of(graph, stage)
    cost, pred, manifest = emit(ing, cl, plan, tmp_path / "out")
    before = evaluate(plan, graph, free_copies(cost))
    written = _concat_bytes(graph, manifest, stage)
    assert set(written) == set(devs)  # every tile of segment 1 reads halo rows
    for d in devs:
        extra = sum(ms - before.tile_ms[k, j, n] for (k, j, n), ms in pred.tile_ms.items() if segs[j].tiles[n].device == d)
        want = 2 * written[d] / (cl.devices[cost.index(d)].figures.memory_gbps * 1e6)
        assert extra == pytest.approx(want, rel=1e-9), d
    sim = simulate_manifest(load_manifest(tmp_path / "out" / "manifest.json"))
    assert sim["latency_ms"] == pytest.approx(pred.latency_ms, rel=1e-4)


def test_assembly_cells_follow_the_emitters_concatenations():
    row = ((0, 4),), ((4, 8),)
    assert assembly_cells(list(row), ((2, 6),)) == 4  # rows 2-6 from two holders
    assert assembly_cells(list(row), ((5, 8),)) == 0  # one holder: a slice or the piece itself
    quads = [((0, 4), (0, 4)), ((0, 4), (4, 8)), ((4, 8), (0, 4)), ((4, 8), (4, 8))]
    assert assembly_cells(quads, ((2, 6), (1, 3))) == 4 * 2  # two bands of one part: only the bands are joined
    assert assembly_cells(quads, ((1, 3), (2, 7))) == 2 * 5  # one band of two parts is the whole
    assert assembly_cells(quads, ((3, 6), (2, 7))) == 1 * 5 + 2 * 5 + 3 * 5  # two bands of two parts, then the whole


def test_the_step_model_prices_tiles_as_predict_stage(tmp_path):
    """The search's step model (per tile, after an arbitrary partition) gives the tile times of
    predict_stage, copies included; with two equal devices and mirrored tiles, whose segments end
    together, its steps and gather add up to predict_stage's latency."""
    graph = chain(tmp_path).graph
    for kinds, splits, want in ((("rpi5", "rpi4"), (8, 8, 3), {(1, 0), (1, 1), (2, 1)}),
                                (("rpi4", "rpi5"), (5, 11, 9), {(1, 0), (2, 1)}),
                                (("rpi5", "rpi5"), (8, 8, 8), {(1, 0), (1, 1), (2, 0), (2, 1)})):
        cost = build_cost_table(graph, cluster(kinds))
        stage = rows_stage(graph, list(cost.devices), splits)
        info = predict_stage(stage, graph, cost)
        model = StepModel(cost, [0, 1])
        holders = [(0, 0, SIZE)]  # the scatter: the input whole on the stage's device
        total = 0.0
        copying = set()
        for j, seg in enumerate(stage.spatial.segments):
            cx = model.context(SegmentCost.build(graph, cost, seg.lo, seg.hi, 2), holders)
            part = (0, splits[j], SIZE)
            for n in range(2):
                _, comp, _, _ = model.term(cx, n, part[n], part[n + 1], (0.0,) * len(holders), 0.0)
                assert comp == pytest.approx(info["tile_ms"][j, n], rel=1e-12), (kinds, j, n)
                if comp > cx.sc.comp(n, part[n], part[n + 1]):
                    copying.add((j, n))
            total += model.score(cx, part)
            holders = [(0, 0, splits[j]), (1, splits[j], SIZE)]
        total += model.gather(cx.sc, holders, 0)
        # a tile whose input rows all lie on one holder copies nothing (split at 3 after 8: rows 0-4 of 0-8)
        assert copying == want, kinds
        if kinds[0] == kinds[1]:
            assert total == pytest.approx(info["latency_ms"], rel=1e-9)
