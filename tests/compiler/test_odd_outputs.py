"""Graph outputs no operator produces (a model input, a weight, a Constant) or listed twice: they compile,
and the build returns them as onnxruntime does on the whole model."""

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
