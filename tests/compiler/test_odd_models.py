"""Odd models a hostile user tried: graph outputs no operator produces (a model input, a weight, a Constant)
or listed twice compile, and the build returns them as onnxruntime does on the whole model; inputs too large
for any device, or of size 0, are refused in one line before planning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.cli import cli
from edgec.compiler.ingest import load_model
from tests.conftest import conv_chain_model

ROOT = Path(__file__).resolve().parents[2]
TWO = ROOT / "tests/e2e/clusters/two.yaml"


def odd_outputs_model() -> onnx.ModelProto:
    """The conv chain returning, besides y: its input x (read by conv0), an input b no operator reads, the
    weight w1 (also read by conv1), a Constant k, and y a second time."""
    m = conv_chain_model(n=2)
    m.graph.input.append(helper.make_tensor_value_info("b", TensorProto.INT64, [2, 5]))
    m.graph.node.append(helper.make_node("Constant", [], ["k"], name="konst",
                                         value=numpy_helper.from_array(np.arange(4, dtype=np.float32), "kv")))
    m.graph.output.extend([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16]),
                           helper.make_tensor_value_info("b", TensorProto.INT64, [2, 5]),
                           helper.make_tensor_value_info("w1", TensorProto.FLOAT, [8, 8, 3, 3]),
                           helper.make_tensor_value_info("k", TensorProto.FLOAT, [4]),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])])
    onnx.checker.check_model(m, full_check=True)
    return m


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="edgec")


def test_constant_outputs_become_identities_of_renamed_weights(tmp_path):
    path = tmp_path / "odd.onnx"
    onnx.save(odd_outputs_model(), path)
    ing = load_model(path)
    g = ing.model.graph
    assert ing.graph.outputs == ("y", "x", "b", "w1", "k")  # y once
    made = {n.output[0]: n for n in g.node if n.op_type == "Identity"}
    assert sorted(made) == ["k", "w1"] and list(g.node)[-2:] == [made["w1"], made["k"]]  # appended
    assert made["w1"].input[0] == "w1.const" and made["k"].input[0] == "k.const"
    inits = {i.name for i in g.initializer}
    assert {"w1.const", "k.const"} <= inits and not {"w1", "k"} & inits
    conv1 = next(n for n in g.node if n.name == "conv1")
    assert conv1.input[1] == "w1.const"  # the weight's reader follows it: no dependency on the Identity
    assert ing.graph.layers[ing.graph.producer["w1"]].inputs == ()  # a layer of its own, reading only the weight


@pytest.mark.parametrize("strategy", ["even", "spatial"])
def test_odd_outputs_compile_and_verify(tmp_path, strategy):
    path = tmp_path / "odd.onnx"
    onnx.save(odd_outputs_model(), path)
    out = tmp_path / "out"
    res = invoke("compile", path, "--devices", TWO, "-o", out, "--strategy", strategy)
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert [o["name"] for o in manifest["outputs"]] == ["y", "x", "b", "w1", "k"]
    assert len({f["device"] for f in manifest["fragments"]}) == 2  # the plan spreads: transfers are involved
    npz = tmp_path / "outputs.npz"
    res = invoke("run", out, "--random-inputs", "--seed", "4", "--verify", "--json", "--output", npz)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["verify"]["passed"]
    got = np.load(npz)
    assert sorted(got.files) == ["b", "k", "w1", "x", "y"]
    np.testing.assert_array_equal(got["k"], np.arange(4, dtype=np.float32))
    w1 = next(i for i in odd_outputs_model().graph.initializer if i.name == "w1")
    np.testing.assert_array_equal(got["w1"], numpy_helper.to_array(w1))


def _relu_model(shape) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="r0"), helper.make_node("Relu", ["r"], ["y"], name="r1")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def one_line(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.stdout == ""
    return res.stderr.splitlines()[-1]


def test_an_input_no_device_can_hold_is_refused_before_planning(tmp_path, monkeypatch):
    """A 1x3x100000x100000 input (120 GB): every spatial search ran for hours over its 100,000 rows before
    finding that nothing fits. Refused before any planner runs."""
    from edgec.compiler.plan import registry

    def no_planning(*a, **k):
        raise AssertionError("planned")

    monkeypatch.setattr(registry, "run_group", no_planning)
    monkeypatch.setattr("edgec.compiler.plan.choose.run_group", no_planning)
    path = tmp_path / "huge.onnx"
    onnx.save(_relu_model([1, 3, 100_000, 100_000]), path)
    line = one_line(invoke("compile", path, "--devices", TWO, "-o", tmp_path / "out"))
    assert line.startswith(f"edgec: {path}: model input 'x' takes 114,441 MB, more than any device can hold "
                           "(the most: pi5-a,"), line
    assert line.endswith(f"(devices: {TWO})"), line
    assert not (tmp_path / "out").exists()


def test_an_input_of_size_zero_is_refused_as_such(tmp_path):
    path = tmp_path / "zero.onnx"
    onnx.save(_relu_model([1, 0, 4]), path)
    line = one_line(invoke("compile", path, "--devices", TWO, "-o", tmp_path / "out"))
    assert line == (f"edgec: {path}: input 'x' has a dimension of size 0 (shape [1, 0, 4]): it holds no data to "
                    "split among devices")
