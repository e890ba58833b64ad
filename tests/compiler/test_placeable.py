"""plan/placeable.py: a model no plan can fit (an input or output, or one layer with the activations live
while it runs, larger than every device) is refused in one line naming the model file, before any search."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.cli import cli
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.ingest import load_model
from edgec.compiler.plan.placeable import unplaceable

ROOT = Path(__file__).resolve().parents[2]
TWO = ROOT / "tests/e2e/clusters/two.yaml"


def _convs(side: int, widths: tuple[int, ...]) -> onnx.ModelProto:
    """A chain of 3x3 convolutions over a 1 x widths[0] x side x side input (small kernels only)."""
    nodes, inits, prev = [], [], "x"
    for i, (cin, cout) in enumerate(zip(widths, widths[1:])):
        inits.append(numpy_helper.from_array(np.ones((cout, cin, 3, 3), np.float32), f"w{i}"))
        out = "y" if i == len(widths) - 2 else f"a{i}"
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [out], name=f"conv{i}", pads=[1, 1, 1, 1]))
        prev = out
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, widths[0], side, side])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, widths[-1], side, side])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _compile(tmp_path, model: onnx.ModelProto, monkeypatch):
    def no_planning(*a, **k):
        raise AssertionError("planned")

    monkeypatch.setattr("edgec.compiler.plan.choose.run_group", no_planning)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    res = CliRunner().invoke(cli, ["compile", str(path), "--devices", str(TWO), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.stdout == ""
    assert not (tmp_path / "out").exists()
    lines = [ln for ln in res.stderr.splitlines() if not ln.startswith(("edgec: cluster:", "edgec: ingest:"))]
    assert len(lines) == 1, res.stderr
    return path, lines[0]


def test_the_huge_convolution_is_refused_naming_the_model(tmp_path, monkeypatch):
    """The issue's 1x3x100000x100000 convolution: its input alone is 120 GB."""
    path, line = _compile(tmp_path, _convs(100_000, (3, 4)), monkeypatch)
    assert line.startswith(f"edgec: {path}: model input 'x' takes 114,441 MB, more than any device can hold"), line
    assert line.endswith(f"(devices: {TWO})")


def test_a_layer_whose_activations_exceed_every_device_is_refused(tmp_path, monkeypatch):
    """Input and output of 1.2 GB fit, but the 64-channel tensor between the two convolutions is 25.6 GB:
    no stage holding either convolution fits, tiles or not."""
    path, line = _compile(tmp_path, _convs(10_000, (3, 64, 3)), monkeypatch)
    assert line.startswith(f"edgec: {path}: layer 'conv0' alone needs 25,558 MB (weights 0 MB + activations live "
                           "while it runs 25,558 MB), more than any device can hold (the most: "), line


def test_a_model_that_fits_is_not_refused(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_convs(32, (3, 8, 3)), path)
    ing = load_model(path)
    assert unplaceable(ing.graph, build_cost_table(ing.graph, load_cluster(TWO), ing.sha256, model=ing.model)) is None


def test_the_bound_is_the_largest_device_not_the_first(tmp_path):
    """A layer too large for pi4 but not for pi5 is not refused; a little larger than pi5, it is."""
    cluster = load_cluster(TWO)
    small, large = sorted(d.usable_bytes for d in cluster.devices)
    for target, refused in (((small + large) // 2, False), (large + (1 << 24), True)):
        side = int((target / (67 * 4)) ** 0.5)  # conv0 holds 3 + 64 channels of side x side floats
        path = tmp_path / f"m{side}.onnx"
        onnx.save(_convs(side, (3, 64, 3)), path)
        ing = load_model(path)
        need = ing.graph.layers[0].param_bytes + ing.graph.footprint_bytes[0]
        assert (need > small) and (need > large) == refused
        reason = unplaceable(ing.graph, build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model))
        assert (reason is not None) == refused, reason
