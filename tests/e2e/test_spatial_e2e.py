"""Spatial stages on the model zoo: the convolutional prefix split into equal row tiles over 2 and 4 devices,
the head on one device, compiled from a hand-made plan and run by `edgec run --random-inputs --verify`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from edgec import models
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.emit import build_fragments, assemble_manifest, write_output
from edgec.compiler.ingest import load_model
from edgec.compiler.plan_types import Plan, Segment, SpatialGroup, Stage, Tile
from edgec.compiler.cost import evaluate, simulate_manifest
from edgec.compiler.spatial import segment_io, spatial_cuts
from edgec.runtime.manifest.load import load_manifest

HERE = Path(__file__).resolve().parent
FAST = ["tinyconv", "squeezenet"]
SLOW = ["alexnet", "vgg16", "vgg19", "mobilenetv2", "inception_v1", "resnet50", "densenet121"]
# (devices, axis, fused): 2 devices one fused segment along W; 4 devices one segment per block along H
SPLITS = [(2, 3, True), (4, 2, False)]


def with_logits(src: Path, dst: Path) -> Path:
    """The model with each Softmax output's input also a graph output: verify then compares unsquashed
    values (1000 probabilities near 1e-3 each would hide a wrong row under the tolerance)."""
    model = onnx.load(str(src))
    outs = {o.name for o in model.graph.output}
    soft = [n.input[0] for n in model.graph.node if n.op_type == "Softmax" and n.output[0] in outs]
    if not soft:
        return src
    shaped = onnx.shape_inference.infer_shapes(model)
    infos = {v.name: v for v in shaped.graph.value_info}
    model.graph.output.extend(infos[t] for t in soft)
    onnx.save(model, str(dst))
    return dst


def equal_tiles(rows: int, devices: list[str]) -> tuple[Tile, ...]:
    k = min(rows, len(devices))
    edges = [round(i * rows / k) for i in range(k + 1)]
    return tuple(Tile(d, a, b) for d, a, b in zip(devices, edges, edges[1:]))


def prefix_plan(graph, devices: list[str], axis: int, fused: bool) -> Plan:
    cuts = spatial_cuts(graph, axis)
    assert len(cuts) > 2, "no convolutional prefix to tile"
    if fused:  # end the one segment where every device still gets a row (a final 7x7 pool leaves one)
        rows = {c: graph.tensors[segment_io(graph, cuts[0], c)[1]].shape[axis] for c in cuts[1:]}
        cuts = (cuts[0], max(c for c in cuts[1:] if rows[c] >= len(devices)))
    segs = tuple(Segment(a, b, equal_tiles(graph.tensors[segment_io(graph, a, b)[1]].shape[axis], devices))
                 for a, b in zip(cuts, cuts[1:]))
    stages = [Stage(devices[0], 0, cuts[-1], SpatialGroup(axis, segs))]
    if cuts[-1] < len(graph.layers):
        stages.append(Stage(devices[0], cuts[-1], len(graph.layers)))
    return Plan("manual", "latency", tuple(stages)).ensures(graph)


def compile_spatial(model: Path, n_devices: int, axis: int, fused: bool, out: Path) -> dict:
    ing = load_model(model)
    cl = load_cluster(HERE / "clusters" / ("two.yaml" if n_devices == 2 else "four.yaml"))
    cost = build_cost_table(ing.graph, cl, ing.sha256)
    plan = prefix_plan(ing.graph, [d.name for d in cl.devices][:n_devices], axis, fused)
    pred = evaluate(plan, ing.graph, cost)
    frags = build_fragments(ing, plan, pred)
    manifest = assemble_manifest(ing, plan, pred, frags, cl.to_dict(), out, {"strategy": "manual"})
    write_output(out, manifest, frags)
    assert simulate_manifest(load_manifest(out / "manifest.json"))["latency_ms"] == pytest.approx(pred.latency_ms, rel=1e-4)
    return manifest


def run_verify(out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "edgec.compiler", "run", str(out / "manifest.json"), "--random-inputs",
                           "--seed", "3", "--verify", "--json", "--threads", "1"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["verify"]["passed"], report["verify"]
    return report


def check(name: str, split, tmp_path: Path) -> None:
    model = with_logits(models.ensure(name), tmp_path / f"{name}.onnx")
    manifest = compile_spatial(model, *split, tmp_path / "out")
    busy = {f["device"] for f in manifest["fragments"]}
    assert len(busy) == split[0]
    report = run_verify(tmp_path / "out")
    print(f"{name} {split}: max|diff| {report['verify']['max_abs_diff']:.3g}")


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: f"{s[0]}dev-axis{s[1]}-{'fused' if s[2] else 'blocks'}")
@pytest.mark.parametrize("name", FAST)
def test_small_models(name, split, tmp_path):
    check(name, split, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("split", SPLITS, ids=lambda s: f"{s[0]}dev-axis{s[1]}-{'fused' if s[2] else 'blocks'}")
@pytest.mark.parametrize("name", SLOW)
def test_zoo_models(name, split, tmp_path):
    check(name, split, tmp_path)
