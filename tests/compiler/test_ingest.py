"""Ingest and layer graph: normalisation, shapes, layers, blocks, bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.errors import UserError
from edgec.compiler.ingest import load_model, parse_shape_option
from tests.conftest import conv_chain_model


def test_chain_layers_and_blocks(chain_path):
    g = load_model(chain_path).graph
    assert [l.op_types for l in g.layers][:2] == [("Conv", "Relu"), ("Conv", "Relu")]
    assert [l.cost_class for l in g.layers] == ["conv"] * 4 + ["data", "gemm"]
    assert [l.spatial_type for l in g.layers] == [1] * 4 + [3, 3]
    assert g.block_cuts == (1, 2, 3, 4, 5)  # a chain: every cut carries one tensor
    first = g.layers[0]
    assert first.flops == 2 * 8 * 16 * 16 * 3 * 9 + 8 * 16 * 16  # conv MACs x2 + relu
    assert first.param_bytes == (8 * 3 * 9 + 8) * 4
    assert first.output_bytes == 8 * 16 * 16 * 4
    assert first.window.kernel == (3, 3) and first.window.pads == (1, 1, 1, 1)


def test_residual_is_one_block(residual_path):
    g = load_model(residual_path).graph
    assert [l.op_types for l in g.layers] == [("Conv",), ("Conv", "Relu"), ("Add",), ("Conv",)]
    # across cut 2 both `a` (for the Add) and `br` are live: not a block boundary
    assert g.live_across(2) == ("a", "br")
    assert g.block_cuts == (1, 3)
    assert g.blocks == ((0, 1), (1, 3), (3, 4))


def test_constants_identities_and_initializer_inputs_are_normalised(tmp_path):
    """Weights from Constant/ConstantOfShape nodes become initializers; Identity chains disappear;
    initializers listed as graph inputs (old exporters) are not treated as user inputs."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3, 1, 1)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([4], np.int64))),
        helper.make_node("ConstantOfShape", ["shape"], ["bias"], value=numpy_helper.from_array(np.array([0.5], np.float32))),
        helper.make_node("Identity", ["w"], ["w_id"]),
        helper.make_node("Conv", ["x", "w_id", "bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5]), helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])], initializer=[w])
    p = tmp_path / "m.onnx"
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    m.ir_version = 8
    onnx.save(m, p)
    ing = load_model(p)
    assert ing.graph.inputs == ("x",)
    assert [n.op_type for n in ing.model.graph.node] == ["Conv"]
    assert ing.graph.layers[0].param_bytes == (12 + 4) * 4


def test_dynamic_dimension_must_be_pinned(tmp_path):
    m = conv_chain_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    p = tmp_path / "dyn.onnx"
    onnx.save(m, p)
    with pytest.raises(UserError, match=r"dyn.onnx: input 'x' has dynamic dimension\(s\) N"):
        load_model(p)
    g = load_model(p, {"x": (1, 3, 16, 16)}).graph
    assert g.tensors["y"].shape == (1, 10)
    with pytest.raises(UserError, match="not an input"):
        load_model(p, {"nope": (1,)})
    with pytest.raises(UserError, match="rank 2"):
        load_model(p, {"x": (1, 3)})


@pytest.mark.parametrize("content,msg", [(None, "no such ONNX file"), (b"not a protobuf at all", "not")])
def test_bad_files(tmp_path, content, msg):
    p = tmp_path / "bad.onnx"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(UserError, match=msg) as e:
        load_model(p)
    assert "bad.onnx" in str(e.value) and "\n" not in str(e.value)


def test_parse_shape_option():
    assert parse_shape_option(["x=1,3,224,224", "a=b=2"]) == {"x": (1, 3, 224, 224), "a=b": (2,)}
    for bad in ["x", "x=", "x=1,a", "=1", "x=0"]:
        with pytest.raises(UserError):
            parse_shape_option([bad])
