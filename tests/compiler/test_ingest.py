"""Ingest and layer graph: normalisation, shapes, layers, blocks, bad input."""

from __future__ import annotations

from pathlib import Path

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


# --- corrupt files: one-line UserErrors naming the file, never an internal error -----------------------------

def _load_error(tmp_path, data: bytes) -> str:
    p = tmp_path / "corrupt.onnx"
    p.write_bytes(data)
    with pytest.raises(UserError) as e:
        load_model(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and "\n" not in msg
    return msg


def _flip_text(model: onnx.ModelProto, old: bytes, new: bytes) -> bytes:
    data = model.SerializeToString()
    assert len(old) == len(new) and data.count(old) == 1
    return data.replace(old, new)


@pytest.mark.parametrize("old,new,where", [
    (b"relu1", b"rel\xff1", "model.graph.node[3].name"),  # a node name: was a UnicodeDecodeError in _name_nodes
    (b"flatten", b"fla\xe9ten", "model.graph.node[8].name"),
    (b"NOTSET", b"NOT\xa0ET", "model.graph.node[0].attribute[1].s"),  # a string attribute
])
def test_text_that_is_not_utf8(tmp_path, old, new, where):
    m = conv_chain_model()
    m.graph.node[0].attribute.append(helper.make_attribute("auto_pad", "NOTSET"))
    msg = _load_error(tmp_path, _flip_text(m, old, new))
    assert f"corrupt model: {where} is not valid UTF-8 text" in msg


def test_initializer_of_unknown_type(tmp_path):
    m = conv_chain_model()
    m.graph.initializer[0].data_type = 119  # was a KeyError in layers._init_bytes
    assert "initializer 'w0': unknown element type 119" in _load_error(tmp_path, m.SerializeToString())


def test_initializer_whose_dims_do_not_match_its_data(tmp_path):
    m = conv_chain_model()
    fw = next(i for i in m.graph.initializer if i.name == "fw")  # large: the checker sees only a stand-in
    fw.dims[1] = 11
    msg = _load_error(tmp_path, m.SerializeToString())
    assert "initializer 'fw': holds 81920 bytes, but its dims [2048, 11] of float32 need 90112" in msg


def test_constant_attribute_of_unknown_type(tmp_path):
    m = conv_chain_model()
    value = numpy_helper.from_array(np.ones(3, np.float32))
    value.data_type = 65
    m.graph.node.insert(0, helper.make_node("Constant", [], ["unused"], value=value, name="k"))
    assert "node 'k', attribute 'value': unknown element type 65" in _load_error(tmp_path, m.SerializeToString())


def test_value_info_of_unknown_type(tmp_path):
    m = conv_chain_model()
    m.graph.output[0].type.tensor_type.elem_type = 29  # was a KeyError in layers._tensor_infos
    assert "tensor 'y' has an unknown element type 29" in _load_error(tmp_path, m.SerializeToString())


def test_input_that_is_not_a_tensor(tmp_path):
    m = conv_chain_model()
    m.graph.input[0].type.CopyFrom(helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [1])))
    assert "graph input 'x' is not a tensor (map_type)" in _load_error(tmp_path, m.SerializeToString())


def test_opset_that_does_not_exist(tmp_path):
    m = conv_chain_model()
    m.opset_import[0].version = 2**40  # was a TypeError in onnx.defs
    assert f"imports opset {2**40} of domain ''" in _load_error(tmp_path, m.SerializeToString())


def test_inconsistent_shapes_fail_at_ingest(tmp_path):
    """Strict shape inference: a Gemm whose weight does not fit the activation used to compile (and fail
    only when a device loaded its fragment)."""
    m = conv_chain_model()
    fw = next(i for i in m.graph.initializer if i.name == "fw")
    fw.CopyFrom(numpy_helper.from_array(np.ones((2000, 10), np.float32), "fw"))
    assert "shape inference failed" in _load_error(tmp_path, m.SerializeToString())


def test_unique_node_names_even_when_a_suffix_collides(tmp_path):
    """An unnamed node is named <op>_<index>; where the file already uses that name, _<index> is appended
    (again while it still repeats one)."""
    m = conv_chain_model()
    for node, name in zip(m.graph.node[:4], ["Relu_3", "Relu_3_3", "c1", ""]):
        node.name = name
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    names = [n.name for n in load_model(p).model.graph.node]
    assert names[:4] == ["Relu_3", "Relu_3_3", "c1", "Relu_3_3_3"] and len(set(names)) == len(names)


def test_repeated_node_names_are_refused(tmp_path):
    """onnxruntime refuses a model whose node names repeat (so `run --verify` could not load it): so does
    the compile, naming the name."""
    m = conv_chain_model()
    m.graph.node[3].name = m.graph.node[0].name
    with pytest.raises(onnxruntime_error()):
        import onnxruntime as ort
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert _load_error(tmp_path, m.SerializeToString()) == (
        f"{tmp_path / 'corrupt.onnx'}: two nodes are named 'conv0'; onnxruntime refuses a model whose node names repeat: "
        "rename one")


def onnxruntime_error():
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return tuple(v for v in vars(ort_state).values() if isinstance(v, type) and issubclass(v, Exception))


def test_a_cycle_is_refused_naming_its_nodes(tmp_path):
    m = conv_chain_model(n=3)
    m.graph.node[2].input[0] = "r2"  # conv1 reads relu2's output: conv1 -> relu1 -> conv2 -> relu2 -> conv1
    msg = _load_error(tmp_path, m.SerializeToString())
    assert msg.endswith("the graph has a cycle through node(s) 'conv1', 'relu1', 'conv2', 'relu2'"), msg


def test_a_node_out_of_order_is_refused_naming_both_nodes(tmp_path):
    m = conv_chain_model(n=2)
    relu = m.graph.node.pop(1)
    m.graph.node.insert(2, relu)  # conv1 now reads r0 before relu0 produces it: no cycle, just the order
    msg = _load_error(tmp_path, m.SerializeToString())
    assert msg.endswith("node 'conv1' reads 'r0' before node 'relu0' produces it: the nodes are not in "
                        "topological order"), msg


# --- operators onnxruntime cannot run are rejected at compile time -------------------------------------------

def _with_node(node: onnx.NodeProto, *opsets, functions=()) -> onnx.ModelProto:
    m = conv_chain_model()
    relu = next(n for n in m.graph.node if n.name == "relu3")
    node.input[:] = [relu.output[0]]
    m.graph.node.insert(list(m.graph.node).index(relu) + 1, node)
    flatten = next(n for n in m.graph.node if n.name == "flatten")
    flatten.input[0] = node.output[0]
    m.opset_import.extend(opsets)
    m.functions.extend(functions)
    return m


@pytest.mark.parametrize("node,opsets,needle", [
    (helper.make_node("Swish", ["?"], ["s"], domain="custom.ops", name="sw"), [helper.make_opsetid("custom.ops", 1)],
     "node 'sw': operator 'Swish' of domain 'custom.ops' is not an operator onnxruntime can run"),
    (helper.make_node("NoSuchOp", ["?"], ["s"], domain="com.microsoft", name="ms"), [helper.make_opsetid("com.microsoft", 1)],
     "node 'ms': operator 'NoSuchOp' of domain 'com.microsoft' is not an onnxruntime contrib operator"),
    (helper.make_node("Gelu", ["?"], ["s"], name="ge"), [],
     "node 'ge': operator 'Gelu' of domain '' does not exist in opset 13"),  # Gelu came with opset 20
])
def test_operators_onnxruntime_cannot_run(tmp_path, node, opsets, needle):
    msg = _load_error(tmp_path, _with_node(node, *opsets).SerializeToString())
    assert needle in msg


def test_contrib_operators_and_local_functions_are_accepted(tmp_path):
    fn = helper.make_function("local.fns", "DoubleRelu", ["a"], ["b"],
                              [helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Add", ["r", "r"], ["b"])],
                              [helper.make_opsetid("", 13)])
    for node, opset, functions in [
        (helper.make_node("FastGelu", ["?"], ["s"], domain="com.microsoft", name="fg"), "com.microsoft", []),
        (helper.make_node("DoubleRelu", ["?"], ["s"], domain="local.fns", name="dr"), "local.fns", [fn]),
    ]:
        p = tmp_path / f"{opset}.onnx"
        onnx.save(_with_node(node, helper.make_opsetid(opset, 1), functions=functions), p)
        g = load_model(p).graph
        assert node.name in [n for layer in g.layers for n in layer.node_names]
        assert g.tensors["s"].shape == (1, 8, 16, 16)


# --- PaddlePaddle-style -1 dimensions are dynamic ------------------------------------------------------------

def paddle_like_model(seed: int = 5) -> onnx.ModelProto:
    """Conv-BN-ReLU, MaxPool, Conv-ReLU, GlobalAveragePool, Reshape [0, -1], MatMul + Add, with the batch
    dimension written as dim_value -1 on the input, the output and an intermediate value_info."""
    rng = np.random.default_rng(seed)

    def init(name, shape, scale=0.3):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    inits = [init("c1.w", (8, 3, 3, 3)), init("bn.scale", 8), init("bn.bias", 8), init("bn.mean", 8),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn.var"),
             init("c2.w", (16, 8, 3, 3)), init("c2.b", 16), init("fc.w", (16, 10)), init("fc.b", 10),
             numpy_helper.from_array(np.array([0, -1], np.int64), "flat.shape")]
    nodes = [
        helper.make_node("Conv", ["x", "c1.w"], ["c1"], pads=[1, 1, 1, 1], name="conv2d_0"),
        helper.make_node("BatchNormalization", ["c1", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["bn"], name="batch_norm_0"),
        helper.make_node("Relu", ["bn"], ["r1"], name="relu_0"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool2d_0"),
        helper.make_node("Conv", ["p1", "c2.w", "c2.b"], ["c2"], pads=[1, 1, 1, 1], name="conv2d_1"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu_1"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="pool2d_1"),
        helper.make_node("Reshape", ["gap", "flat.shape"], ["flat"], name="reshape_0"),
        helper.make_node("MatMul", ["flat", "fc.w"], ["mm"], name="matmul_0"),
        helper.make_node("Add", ["mm", "fc.b"], ["y"], name="add_0"),
    ]
    graph = helper.make_graph(nodes, "paddle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 10])], initializer=inits,
                              value_info=[helper.make_tensor_value_info("p1", TensorProto.FLOAT, [-1, 8, 8, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 6
    return model


@pytest.fixture
def paddle_path(tmp_path):
    p = tmp_path / "paddle.onnx"
    onnx.save(paddle_like_model(), p)
    return p


def test_minus_one_dimension_is_pinned_by_shape(paddle_path):
    g = load_model(paddle_path, {"x": (2, 3, 16, 16)}).graph
    assert g.tensors["x"].shape == (2, 3, 16, 16)
    assert g.tensors["p1"].shape == (2, 8, 8, 8) and g.tensors["y"].shape == (2, 10)
    with pytest.raises(UserError, match=r"--shape x: dimension 3 is fixed by the model, not 4"):
        load_model(paddle_path, {"x": (2, 4, 16, 16)})


def test_minus_one_dimension_unpinned_is_a_clear_error(paddle_path):
    with pytest.raises(UserError) as e:
        load_model(paddle_path)
    assert str(e.value) == (f"{paddle_path}: input 'x' has dynamic dimension(s) -1: "
                            "pin them with --shape x=D0,D1,...")


def test_minus_one_model_compiles_and_runs_like_onnxruntime(paddle_path, tmp_path):
    import onnxruntime as ort

    from edgec.compiler.driver import compile_model
    from edgec.runtime.front.api import run_manifest
    from edgec.runtime.manifest.load import load_manifest

    clusters = Path(__file__).resolve().parents[1] / "e2e" / "clusters"
    out = tmp_path / "build"
    result = compile_model(paddle_path, clusters / "two.yaml", out, strategy="pipeline", shapes={"x": (1, 3, 16, 16)})
    assert result.manifest["inputs"][0]["shape"] == [1, 3, 16, 16]
    x = np.random.default_rng(7).normal(size=(1, 3, 16, 16)).astype(np.float32)
    got = run_manifest(load_manifest(out / "manifest.json"), {"x": x}, warmup=0).outputs["y"]
    want = ort.InferenceSession(str(paddle_path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    assert got.shape == (1, 10)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# --- constant folding (onnx-graphsurgeon) -------------------------------------------------------------------

def _small_model(nodes, inits=(), x_shape=(1, 4), y_shape=(1, 4), opset=13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))], initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _ingest(tmp_path, m: onnx.ModelProto):
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    return load_model(p)


def test_folding_keeps_names_order_opset_and_ir_version(tmp_path):
    w = numpy_helper.from_array(np.random.default_rng(3).normal(size=(4, 4)).astype(np.float32), "w")
    m = _small_model([
        helper.make_node("Transpose", ["w"], ["wt"]),  # unnamed: Transpose_0, folded
        helper.make_node("MatMul", ["x", "wt"], ["h"]),  # unnamed: MatMul_1 (its index in the file)
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.full((1, 4), 2, np.float32))),
        helper.make_node("Mul", ["h", "k"], ["y"], name="scale"),
    ], [w], opset=11)
    ing = _ingest(tmp_path, m)
    assert [(n.name, n.op_type) for n in ing.model.graph.node] == [("MatMul_1", "MatMul"), ("scale", "Mul")]
    assert sorted(i.name for i in ing.model.graph.initializer) == ["k", "wt"]  # w, read only by the Transpose, is gone
    wt = next(i for i in ing.model.graph.initializer if i.name == "wt")
    np.testing.assert_array_equal(numpy_helper.to_array(wt), numpy_helper.to_array(w).T)
    assert [(o.domain, o.version) for o in ing.model.opset_import] == [("", 11)] and ing.model.ir_version == 8


def test_random_operators_are_never_folded(tmp_path):
    m = _small_model([
        helper.make_node("RandomNormal", [], ["noise"], shape=[1, 4], seed=1.0, name="noise"),
        helper.make_node("Add", ["x", "noise"], ["y"], name="add"),
    ])
    ing = _ingest(tmp_path, m)
    assert [n.op_type for n in ing.model.graph.node] == ["RandomNormal", "Add"]
    assert not ing.model.graph.initializer


def test_constants_too_large_to_fold_stay_operators(tmp_path):
    """A constant subgraph whose result is larger than max(64 MiB, the largest weight) is not evaluated
    (graphsurgeon would: onnxruntime once filled a corrupt 512 GB ConstantOfShape until the process died)."""
    big = numpy_helper.from_array(np.array([1 << 15, 1 << 10], np.int64))  # 128 MiB of float32
    m = _small_model([
        helper.make_node("Constant", [], ["shape"], value=big, name="shape"),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32)), name="ones"),
        helper.make_node("Add", ["x", "ones"], ["y"], name="add"),
    ], x_shape=(1, 1 << 10), y_shape=(1 << 15, 1 << 10))
    ing = _ingest(tmp_path, m)
    assert [n.op_type for n in ing.model.graph.node] == ["ConstantOfShape", "Add"]
    assert ing.graph.tensors["ones"].nbytes == 128 << 20


def test_how_graphsurgeon_folding_differs_from_the_reference_evaluator(tmp_path):
    """How the graphsurgeon ingest differs from the onnx.reference one it replaced (every model in
    models/build gives the same layer graph with both): nodes whose outputs nothing reads are dropped
    (they were kept), and DequantizeLinear of a constant weight is left to the runtime (graphsurgeon never
    folds Q/DQ; the old ingest tried to and failed: onnx.reference has no DequantizeLinear before opset 19)."""
    q = numpy_helper.from_array(np.arange(16, dtype=np.int8).reshape(4, 4), "q")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    m = _small_model([
        helper.make_node("DequantizeLinear", ["q", "scale"], ["w"], name="dq"),
        helper.make_node("Sigmoid", ["x"], ["unused"], name="dead"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
    ], [q, scale])
    ing = _ingest(tmp_path, m)
    assert [n.name for n in ing.model.graph.node] == ["dq", "mm"]
    assert sorted(i.name for i in ing.model.graph.initializer) == ["q", "scale"]


def test_constant_node_that_cannot_be_evaluated(tmp_path):
    m = _small_model([
        helper.make_node("Constant", [], ["table"], value=numpy_helper.from_array(np.ones(4, np.float32)), name="t"),
        helper.make_node("Constant", [], ["index"], value=numpy_helper.from_array(np.array(10, np.int64)), name="i"),
        helper.make_node("Gather", ["table", "index"], ["g"], name="gather"),  # index 10 of 4 values
        helper.make_node("Add", ["x", "g"], ["y"], name="add"),
    ])
    msg = _load_error(tmp_path, m.SerializeToString())
    assert "cannot evaluate the model's constant nodes" in msg and "gather" in msg
