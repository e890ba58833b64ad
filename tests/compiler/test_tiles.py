"""Spatial emission: tile fragments reproduce the whole model's rows, and hand-made spatial plans run verified."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.emit import build_fragments, assemble_manifest, write_output
from edgec.compiler.ingest import load_model
from edgec.compiler.plan_types import Plan, Segment, SpatialGroup, Stage, Tile
from edgec.compiler.cost import evaluate, simulate_manifest
from edgec.compiler.spatial import segment_io, spatial_cuts
from edgec.compiler.spatial.tiles import stage_layout, tile_name
from edgec.runtime.front.api import run_manifest
from edgec.runtime.coordinator.inputs import random_inputs
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.coordinator.verify import verify_outputs

ort.set_default_logger_severity(3)
F32 = TensorProto.FLOAT


class Net:
    """A small NCHW net under construction with seeded random (non-constant) weights."""

    def __init__(self, seed: int, c: int, h: int, w: int):
        self.rng, self.nodes, self.inits = np.random.default_rng(seed), [], []
        self.shape = {"x": (1, c, h, w)}

    def _add(self, op, ins, shape, **attrs) -> str:
        out = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, ins, [out], name=f"n{len(self.nodes)}", **attrs))
        self.shape[out] = shape
        return out

    def _param(self, shape, scale=0.3) -> str:
        name = f"p{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(self.rng.normal(0, scale, shape).astype(np.float32), name))
        return name

    def _out(self, src, k, s, d, p, ceil=False) -> tuple[int, int]:
        dims = []
        for j in range(2):
            n = self.shape[src][2 + j] + p[j] + p[j + 2] - ((k - 1) * d[j] + 1)
            o = (-(-n // s[j]) if ceil else n // s[j]) + 1
            dims.append(o - 1 if ceil and (o - 1) * s[j] >= self.shape[src][2 + j] + p[j] else o)
        return tuple(dims)

    def conv(self, src, cout, k=3, s=1, d=1, p=1, group=1) -> str:
        s, d = (s, s) if isinstance(s, int) else s, (d, d) if isinstance(d, int) else d
        p = (p,) * 4 if isinstance(p, int) else p
        cin = self.shape[src][1]
        w, b = self._param((cout, cin // group, k, k), 1.0 / np.sqrt(cin * k)), self._param((cout,), 0.1)
        return self._add("Conv", [src, w, b], (1, cout, *self._out(src, k, s, d, p)), kernel_shape=[k, k],
                         strides=list(s), dilations=list(d), pads=list(p), group=group)

    def pool(self, src, op, k, s, p=0, ceil=False, include_pad=0) -> str:
        p = (p,) * 4 if isinstance(p, int) else p
        extra = {"count_include_pad": include_pad} if op == "AveragePool" else {}
        return self._add(op, [src], (1, self.shape[src][1], *self._out(src, k, (s, s), (1, 1), p, ceil)),
                         kernel_shape=[k, k], strides=[s, s], pads=list(p), ceil_mode=int(ceil), **extra)

    def act(self, src, op="Relu") -> str:
        return self._add(op, [src], self.shape[src])

    def bn(self, src) -> str:
        c = self.shape[src][1]
        ps = [self._param((c,), 0.1) for _ in range(3)]
        var = f"p{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(self.rng.uniform(0.5, 1.5, c).astype(np.float32), var))
        return self._add("BatchNormalization", [src, *ps, var], self.shape[src])

    def merge(self, op, srcs) -> str:
        c = sum(self.shape[t][1] for t in srcs) if op == "Concat" else self.shape[srcs[0]][1]
        extra = {"axis": 1} if op == "Concat" else {}
        return self._add(op, list(srcs), (1, c, *self.shape[srcs[0]][2:]), **extra)

    def mul_plane(self, src) -> str:
        """Times a constant that spans the whole plane (the tile must slice the constant too)."""
        return self._add("Mul", [src, self._param((1, 1, *self.shape[src][2:]), 1.0)], self.shape[src])

    def save(self, src: str, path: Path, classes: int = 5, opset: int = 17) -> Path:
        flat = self._add("Flatten", [src], (1, int(np.prod(self.shape[src][1:]))))
        w = self._param((self.shape[flat][1], classes), 0.1)
        y = self._add("Gemm", [flat, w, self._param((classes,), 0.1)], (1, classes))
        g = helper.make_graph(self.nodes, "net", [helper.make_tensor_value_info("x", F32, self.shape["x"])],
                              [helper.make_tensor_value_info(y, F32, [1, classes])], initializer=self.inits)
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9), path)
        return path


def chain_net(path: Path, seed: int = 0) -> Path:
    """Strided, dilated, grouped, depthwise convs; ceil_mode pools with and without counted padding."""
    n = Net(seed, 4, 29, 23)
    t = n.act(n.bn(n.conv("x", 8, k=3, p=1)))
    t = n.act(n.conv(t, 8, k=3, s=2, p=1), "Sigmoid")
    t = n.pool(t, "MaxPool", 3, 2, 0, ceil=True)
    t = n.conv(t, 8, k=3, d=(2, 1), p=(2, 1, 2, 1), group=2)
    t = n.act(n.conv(t, 8, k=3, p=1, group=8))
    t = n.pool(t, "AveragePool", 3, 1, 1, ceil=True, include_pad=1)
    t = n.conv(t, 6, k=5, s=(1, 2), p=(2, 1, 1, 2))
    t = n.pool(t, "AveragePool", 2, 2, 0, ceil=True)
    return n.save(t, path)


def blocks_net(path: Path, seed: int = 1) -> Path:
    """Residual, inception-like, DenseNet-like and Sum blocks, and a plane-wide constant operand."""
    n = Net(seed, 3, 21, 19)
    x = n.act(n.conv("x", 6, k=3, p=1))
    r = n.conv(n.act(n.conv(x, 6, k=3, p=1)), 6, k=3, p=1)
    x = n.act(n.merge("Add", [r, x]))
    b1, b2 = n.conv(x, 3, k=1, p=0), n.conv(n.conv(x, 3, k=1, p=0), 4, k=3, p=1)
    b3 = n.conv(x, 3, k=5, d=2, p=4)
    b4 = n.conv(n.pool(x, "MaxPool", 3, 1, 1), 2, k=1, p=0)
    x = n.merge("Concat", [b1, b2, b3, b4])
    x = n.merge("Concat", [x, n.act(n.conv(x, 4, k=3, p=1))])
    x = n.merge("Sum", [n.conv(x, 5, k=3, s=2, p=1), n.conv(x, 5, k=1, s=2, p=0), n.pool(n.conv(x, 5, k=1, p=0), "AveragePool", 3, 2, 1)])
    return n.save(n.mul_plane(n.act(x)), path)


def small_net(path: Path, h: int, w: int, stride: int = 1) -> Path:
    n = Net(2, 2, h, w)
    return n.save(n.act(n.conv(n.act(n.conv("x", 3, k=3, s=stride, p=1)), 3, k=3, p=1)), path)


def residual_net(path: Path, opset: int) -> Path:
    """A residual block whose branch reads more rows than the skip: the tile slices the skip."""
    n = Net(3, 2, 13, 11)
    x = n.act(n.conv("x", 4, k=3, p=1))
    y = n.conv(n.act(n.conv(x, 4, k=3, p=1)), 4, k=5, p=2)
    return n.save(n.act(n.merge("Add", [x, y])), path, opset=opset)


def cluster(tmp: Path, n: int, medium: str = "switched") -> Path:
    doc = {"devices": [{"name": f"d{i}", "profile": ("rpi4", "rpi5", "laptop")[i % 3]} for i in range(n)],
           "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": medium,
                       "links": [{"a": "d0", "b": "d1", "bandwidth_mbps": 1000, "latency_ms": 0.2}] if n > 1 else []}}
    path = tmp / f"cluster{n}{medium}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def tiles(rows: int, devices, rng=None) -> tuple[Tile, ...]:
    """Equal tiles, or (rng) uneven random ones; at most one per row."""
    k = min(len(devices), rows)
    cuts = sorted(rng.choice(np.arange(1, rows), k - 1, replace=False)) if rng is not None else \
        [round(i * rows / k) for i in range(1, k)]
    edges = [0, *map(int, cuts), rows]
    return tuple(Tile(d, a, b) for d, a, b in zip(devices, edges, edges[1:]))


def spatial_stage(graph, devices, axis, lo=0, hi=None, fused=False, rng=None, device=None, per_segment=None) -> Stage:
    """Tiles over the tileable layers from lo (to hi), one segment per block or one fused segment."""
    cuts = spatial_cuts(graph, axis, lo)
    cuts = [c for c in cuts if hi is None or c <= hi]
    if fused:
        cuts = [cuts[0], cuts[-1]]
    segs = []
    for j, (a, b) in enumerate(zip(cuts, cuts[1:])):
        devs = per_segment(j) if per_segment else devices
        segs.append(Segment(a, b, tiles(graph.tensors[segment_io(graph, a, b)[1]].shape[axis], devs, rng)))
    return Stage(device or devices[0], cuts[0], cuts[-1], SpatialGroup(axis, tuple(segs)))


def grid_tiles(rows: int, cols: int, n: int, m: int, devices, rng=None) -> tuple[Tile, ...]:
    """An n x m grid in row-major order: equal, or (rng) uneven random bands, each with its own columns."""
    out = []
    for i, band in enumerate(tiles(rows, ["-"] * n, rng)):
        out += [Tile(devices[i * m + j], band.start, band.stop, (c.start, c.stop))
                for j, c in enumerate(tiles(cols, ["-"] * m, rng))]
    return tuple(out)


def grid_stage(graph, devices, n, m, fused=False, rng=None) -> Stage:
    """An n x m grid over the layers tileable along both axes, one segment per block or one fused."""
    both = set(spatial_cuts(graph, 3))
    cuts = [c for c in spatial_cuts(graph, 2) if c in both]
    if fused:
        cuts = [cuts[0], cuts[-1]]
    segs = []
    for a, b in zip(cuts, cuts[1:]):
        shape = graph.tensors[segment_io(graph, a, b)[1]].shape
        segs.append(Segment(a, b, grid_tiles(shape[2], shape[3], n, m, devices, rng)))
    return Stage(devices[0], cuts[0], cuts[-1], SpatialGroup(2, tuple(segs)))


def plan_of(graph, *stages: Stage) -> Plan:
    rest = [] if stages[-1].hi == len(graph.layers) else [Stage(stages[-1].device, stages[-1].hi, len(graph.layers))]
    return Plan("manual", "latency", (*stages, *rest)).ensures(graph)


def emit(model: Path, cluster_path: Path, make_plan, out: Path):
    ing = load_model(model)
    cl = load_cluster(cluster_path)
    cost = build_cost_table(ing.graph, cl, ing.sha256)
    plan = make_plan(ing.graph)
    pred = evaluate(plan, ing.graph, cost)
    frags = build_fragments(ing, plan, pred)
    manifest = assemble_manifest(ing, plan, pred, frags, cl.to_dict(), out, {"strategy": "manual"})
    write_output(out, manifest, frags)
    return ing, plan, pred, frags, manifest


def run_verified(out: Path) -> float:
    """Replay on local workers (the runtime validates the manifest first); max |diff| against the whole model."""
    m = load_manifest(out / "manifest.json")
    inputs = random_inputs(m.inputs, seed=3)
    result = run_manifest(m, inputs, threads=1, warmup=0, timeout=60)
    checked = verify_outputs(m, inputs, result.outputs, 1e-4)
    assert checked.passed, checked.per_output
    print(f"{out}: max|diff| {checked.max_abs_diff:.3g}")
    return checked.max_abs_diff


def whole_tensors(ing) -> dict[str, np.ndarray]:
    m = onnx.ModelProto()
    m.CopyFrom(ing.model)
    names = [t for t in ing.graph.tensors if t not in ing.graph.inputs]
    del m.graph.output[:]
    m.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in names)
    x = np.random.default_rng(5).normal(size=ing.graph.tensors["x"].shape).astype(np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return {"x": x} | dict(zip(names, sess.run(names, {"x": x})))


def check_tiles_offline(ing, plan, frags) -> None:
    """Every tile fragment, fed its input rows of the whole model's tensor, yields exactly its output rows."""
    full = whole_tensors(ing)
    by_id = {f.id: f for f in frags}
    for k, stage in enumerate(plan.stages):
        if stage.spatial is None:
            continue
        for _, specs in stage_layout(ing.graph, stage, k):
            for spec, _ in specs:
                frag = by_id[spec.fid]
                sess = ort.InferenceSession(frag.data, providers=["CPUExecutionProvider"])
                feed, want = full[spec.input], full[spec.output]
                for axis, (a, b), (c, d) in zip(spec.axes, spec.in_box, spec.out_box):
                    feed, want = np.take(feed, range(a, b), axis=axis), np.take(want, range(c, d), axis=axis)
                (got,) = sess.run([spec.out_name], {spec.in_name: feed})
                assert got.shape == want.shape, (spec, got.shape, want.shape)
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=str(spec))


# ------------------------------------------------------------------------------------------------ offline


def test_names():
    assert tile_name("conv1/out", "pi5-a", 3, 9) == "conv1/out@pi5-a[3:9]"
    assert tile_name("conv1/out", "pi5-a", 3, 9, (0, 4)) == "conv1/out@pi5-a[3:9,0:4]"


@pytest.mark.parametrize("axis", [2, 3])
@pytest.mark.parametrize("net", [chain_net, blocks_net])
def test_tile_fragments_reproduce_rows(net, axis, tmp_path):
    model = net(tmp_path / "m.onnx")
    devs = [f"d{i}" for i in range(8)]
    for n_dev, fused, seed in [(2, False, None), (3, True, 0), (5, False, 1), (8, True, 2), (8, False, 3)]:
        rng = None if seed is None else np.random.default_rng(seed)
        ing, plan, _, frags, _ = emit(model, cluster(tmp_path, 8), lambda g: plan_of(
            g, spatial_stage(g, devs[:n_dev], axis, fused=fused, rng=rng)), tmp_path / f"o{n_dev}{fused}")
        check_tiles_offline(ing, plan, frags)


@pytest.mark.parametrize("opset", [9, 17])  # Slice-1 takes attributes, Slice-10+ constant inputs
def test_residual_slices_the_skip(opset, tmp_path):
    model = residual_net(tmp_path / "m.onnx", opset)
    ing, plan, _, frags, _ = emit(model, cluster(tmp_path, 3), lambda g: plan_of(
        g, spatial_stage(g, ["d0", "d1", "d2"], 2, fused=True, rng=np.random.default_rng(0))), tmp_path / "o")
    assert all(any(n.op_type == "Slice" for n in onnx.load_from_string(f.data).graph.node) for f in frags if "s0" in f.id)
    check_tiles_offline(ing, plan, frags)


def test_pads_and_initializers(tmp_path):
    model = small_net(tmp_path / "m.onnx", 7, 7)
    ing, plan, _, frags, _ = emit(model, cluster(tmp_path, 3), lambda g: plan_of(
        g, spatial_stage(g, ["d0", "d1", "d2"], 2, fused=True)), tmp_path / "o")
    by_dev = {f.device: onnx.load_from_string(f.data) for f in frags if f.id.startswith("f0s")}
    pads = {d: [list(helper.get_attribute_value(a)) for n in m.graph.node if n.op_type == "Conv"
                for a in n.attribute if a.name == "pads"] for d, m in by_dev.items()}
    # rows 0-2 | 2-5 | 5-7 of 7: the image border keeps pad 1, interior edges get real halo rows instead
    assert pads == {"d0": [[1, 1, 0, 1], [1, 1, 0, 1]], "d1": [[0, 1, 0, 1]] * 2, "d2": [[0, 1, 1, 1]] * 2}
    for m in by_dev.values():
        used = {i for n in m.graph.node for i in n.input}
        assert {i.name for i in m.graph.initializer} <= used
        onnx.checker.check_model(m, full_check=True)
    check_tiles_offline(ing, plan, frags)


def test_halo_exchange_moves_exactly_the_missing_rows(tmp_path):
    model = chain_net(tmp_path / "m.onnx")
    devs = ["d0", "d1", "d2"]
    ing, plan, _, _, manifest = emit(model, cluster(tmp_path, 3), lambda g: plan_of(
        g, spatial_stage(g, devs, 2, rng=np.random.default_rng(7))), tmp_path / "o")
    layout = stage_layout(ing.graph, plan.stages[0], 0)
    received = {}
    for tr in manifest["transfers"]:
        t = tr["tensor"].split("@")[0]
        received[(t, tr["dst"])] = received.get((t, tr["dst"]), 0) + tr["shape"][2]
    for (_, prev), (maps, specs) in zip(layout, layout[1:]):
        own = {s.device: s.out_rows for s, _ in prev}
        for spec, _ in specs:
            a, b = spec.in_rows
            o0, o1 = own[spec.device]
            assert received.get((maps.input, spec.device), 0) == (b - a) - max(0, min(b, o1) - max(a, o0))
    # the scatter sends each other tile exactly its input rows; the gather sends each tile's own rows
    first = layout[0][1]
    for spec, _ in first[1:]:
        assert received[(spec.input, spec.device)] == spec.in_rows[1] - spec.in_rows[0]
    y = layout[-1][0].output
    assert received[(y, "d0")] == sum(s.out_rows[1] - s.out_rows[0] for s, _ in layout[-1][1] if s.device != "d0")
    for tr in manifest["transfers"]:
        assert tr["bytes"] == int(np.prod(tr["shape"])) * 4


@pytest.mark.parametrize("medium", ["switched", "shared"])
def test_simulated_replay_agrees_with_prediction(medium, tmp_path):
    model = blocks_net(tmp_path / "m.onnx")
    _, _, pred, _, _ = emit(model, cluster(tmp_path, 4, medium), lambda g: plan_of(
        g, spatial_stage(g, ["d0", "d1", "d2", "d3"], 2, rng=np.random.default_rng(1))), tmp_path / "o")
    sim = simulate_manifest(load_manifest(tmp_path / "o/manifest.json"))
    assert sim["latency_ms"] == pytest.approx(pred.latency_ms, rel=1e-4)
    assert sim["bytes_transferred"] == pred.bytes_transferred
    for d, busy in pred.busy_ms.items():
        assert sim["devices"][d]["busy_ms"] == pytest.approx(busy, rel=1e-3, abs=1e-3)


@pytest.mark.parametrize("net", [chain_net, blocks_net])
def test_grid_tile_fragments_reproduce_boxes(net, tmp_path):
    """2-D tiles: rows and columns with their halos, border padding on both axes only at the image
    border, plane-wide constants cut on both axes; uneven grids, fused or a segment per block."""
    model = net(tmp_path / "m.onnx")
    devs = [f"d{i}" for i in range(6)]
    for n, m, fused, seed in [(2, 2, True, None), (3, 2, False, 0), (2, 3, True, 1)]:
        rng = None if seed is None else np.random.default_rng(seed)
        ing, plan, _, frags, _ = emit(model, cluster(tmp_path, 6), lambda g: plan_of(
            g, grid_stage(g, devs, n, m, fused=fused, rng=rng)), tmp_path / f"o{n}{m}{fused}")
        assert plan.stages[0].spatial.grid
        check_tiles_offline(ing, plan, frags)


def test_grid_pads_on_both_axes(tmp_path):
    model = small_net(tmp_path / "m.onnx", 7, 7)
    ing, plan, _, frags, manifest = emit(model, cluster(tmp_path, 4), lambda g: plan_of(
        g, grid_stage(g, ["d0", "d1", "d2", "d3"], 2, 2, fused=True)), tmp_path / "o")
    by_dev = {f.device: onnx.load_from_string(f.data) for f in frags if f.id.startswith("f0s")}
    pads = {d: [list(helper.get_attribute_value(a)) for n in m.graph.node if n.op_type == "Conv"
                for a in n.attribute if a.name == "pads"] for d, m in by_dev.items()}
    # rows and columns 0-4 | 4-7 of 7 (pads: top, left, bottom, right): the border keeps pad 1
    assert pads == {"d0": [[1, 1, 0, 0]] * 2, "d1": [[1, 0, 0, 1]] * 2, "d2": [[0, 1, 1, 0]] * 2, "d3": [[0, 0, 1, 1]] * 2}
    assert [f.outputs[0].split("@")[1] for f in frags if f.id.startswith("f0s")] == \
        ["d0[0:4,0:4]", "d1[0:4,4:7]", "d2[4:7,0:4]", "d3[4:7,4:7]"]
    # the scatter sends each tile its box (with halo) as one region on both axes
    boxes = {tr["dst"]: tr["region"] for tr in manifest["transfers"] if tr["tensor"] == "x"}
    assert boxes["d3"] == [{"axis": 2, "start": 2, "stop": 7}, {"axis": 3, "start": 2, "stop": 7}]
    check_tiles_offline(ing, plan, frags)


@pytest.mark.parametrize("medium", ["switched", "shared"])
def test_grid_replay_agrees_with_prediction(medium, tmp_path):
    model = chain_net(tmp_path / "m.onnx")
    _, _, pred, _, _ = emit(model, cluster(tmp_path, 6, medium), lambda g: plan_of(
        g, grid_stage(g, [f"d{i}" for i in range(6)], 3, 2, rng=np.random.default_rng(2))), tmp_path / "o")
    sim = simulate_manifest(load_manifest(tmp_path / "o/manifest.json"))
    assert sim["latency_ms"] == pytest.approx(pred.latency_ms, rel=1e-4)
    assert sim["bytes_transferred"] == pred.bytes_transferred
    for d, busy in pred.busy_ms.items():
        assert sim["devices"][d]["busy_ms"] == pytest.approx(busy, rel=1e-3, abs=1e-3)


# ------------------------------------------------------------------------------------------------ runtime


def test_run_chain_three_uneven_tiles_per_block(tmp_path):
    model = chain_net(tmp_path / "m.onnx")
    emit(model, cluster(tmp_path, 3), lambda g: plan_of(
        g, spatial_stage(g, ["d0", "d1", "d2"], 2, rng=np.random.default_rng(0))), tmp_path / "o")
    run_verified(tmp_path / "o")


def test_run_chain_width_fused_five_devices(tmp_path):
    model = chain_net(tmp_path / "m.onnx")
    emit(model, cluster(tmp_path, 5), lambda g: plan_of(
        g, spatial_stage(g, [f"d{i}" for i in range(5)], 3, fused=True, rng=np.random.default_rng(4))), tmp_path / "o")
    run_verified(tmp_path / "o")


def test_run_blocks_two_segments_four_devices(tmp_path):
    model = blocks_net(tmp_path / "m.onnx")

    def make(g):
        cuts = spatial_cuts(g, 2)
        mid = cuts[len(cuts) // 2]
        first = spatial_stage(g, ["d0", "d1", "d2", "d3"], 2, hi=mid, fused=True)
        second = spatial_stage(g, ["d3", "d2", "d1", "d0"], 2, lo=mid, fused=True, rng=np.random.default_rng(2))
        group = SpatialGroup(2, first.spatial.segments + second.spatial.segments)
        return plan_of(g, Stage("d0", first.lo, second.hi, group))

    emit(model, cluster(tmp_path, 4), make, tmp_path / "o")
    run_verified(tmp_path / "o")


def test_run_seven_rows_over_three_and_eight_single_rows(tmp_path):
    model = small_net(tmp_path / "m7.onnx", 7, 7, stride=2)  # 7 rows -> 4: tiles 0-1, 1-3, 3-4
    emit(model, cluster(tmp_path, 3), lambda g: plan_of(g, Stage("d0", 0, 2, SpatialGroup(2, (
        Segment(0, 2, (Tile("d0", 0, 1), Tile("d1", 1, 3), Tile("d2", 3, 4))),)))), tmp_path / "o7")
    run_verified(tmp_path / "o7")
    model = small_net(tmp_path / "m8.onnx", 9, 8)
    emit(model, cluster(tmp_path, 8), lambda g: plan_of(
        g, spatial_stage(g, [f"d{i}" for i in range(8)], 3, rng=np.random.default_rng(0))), tmp_path / "o8")
    run_verified(tmp_path / "o8")


def test_run_between_pipeline_stages_on_a_shared_medium(tmp_path):
    """A pipeline stage feeds a spatial stage whose gathering device computes no tile and whose segments
    use different devices; the head runs on yet another device."""
    model = blocks_net(tmp_path / "m.onnx")

    def make(g):
        lo = spatial_cuts(g, 2)[1]
        sp = spatial_stage(g, None, 2, lo=lo, device="d1", rng=np.random.default_rng(3),
                           per_segment=lambda j: [["d2", "d3"], ["d3", "d0", "d2"]][j % 2])
        return Plan("manual", "latency", (Stage("d0", 0, lo), sp, Stage("d3", sp.hi, len(g.layers)))).ensures(g)

    _, plan, _, _, manifest = emit(model, cluster(tmp_path, 4, "shared"), make, tmp_path / "o")
    assert all(s["to"] != d for d, steps in manifest["steps"].items() for s in steps if s["op"] == "send")
    run_verified(tmp_path / "o")


def test_run_grids_with_halo_exchange_between_segments(tmp_path):
    """Uneven 3 x 2 grids, one segment per block: neighbours exchange halo rows, columns and corners."""
    model = chain_net(tmp_path / "m.onnx")
    emit(model, cluster(tmp_path, 6), lambda g: plan_of(
        g, grid_stage(g, [f"d{i}" for i in range(6)], 3, 2, rng=np.random.default_rng(5))), tmp_path / "o")
    run_verified(tmp_path / "o")


def test_run_blocks_fused_grid(tmp_path):
    model = blocks_net(tmp_path / "m.onnx")
    emit(model, cluster(tmp_path, 4), lambda g: plan_of(
        g, grid_stage(g, ["d0", "d1", "d2", "d3"], 2, 2, fused=True, rng=np.random.default_rng(1))), tmp_path / "o")
    run_verified(tmp_path / "o")
