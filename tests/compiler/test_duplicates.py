"""Duplicate nodes (ingest/duplicates.py): an Identity and a node computing what an earlier one does are merged into
it, with the same outputs; graph outputs keep their producers; random operators, other domains and models with
subgraphs are left alone; nothing to do leaves the model as it was."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from edgec.compiler.ingest.duplicates import merge_duplicates


def _model(nodes, outputs=("y",), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "ab"],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 3]) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model: onnx.ModelProto) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: rng.normal(size=(2, 3)).astype(np.float32) for n in "ab"})


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_same_operator_attributes_and_inputs_merge_into_the_first():
    model = _model([helper.make_node("Add", ["a", "b"], ["s1"]),
                    helper.make_node("Add", ["b", "a"], ["s2"]),  # commutative: the same sum
                    helper.make_node("Identity", ["s2"], ["s3"]),
                    helper.make_node("Sub", ["a", "b"], ["d1"]),
                    helper.make_node("Sub", ["b", "a"], ["d2"]),  # not commutative: another value
                    helper.make_node("Softmax", ["s1"], ["p1"], axis=0),
                    helper.make_node("Softmax", ["s3"], ["p2"], axis=1),  # another attribute
                    helper.make_node("Sum", ["s1", "s3", "d1", "d2", "p1", "p2"], ["y"])])
    merged = copy.deepcopy(model)
    assert merge_duplicates(merged) == 2
    assert _ops(merged) == ["Add", "Sub", "Sub", "Softmax", "Softmax", "Sum"]
    assert list(merged.graph.node[-1].input) == ["s1", "s1", "d1", "d2", "p1", "p2"]
    onnx.checker.check_model(merged, full_check=True)
    np.testing.assert_array_equal(_run(model)[0], _run(merged)[0])


def test_graph_outputs_keep_their_producers():
    model = _model([helper.make_node("Mul", ["a", "b"], ["y"]), helper.make_node("Mul", ["a", "b"], ["z"]),
                    helper.make_node("Identity", ["y"], ["w"])], outputs=("y", "z", "w"))
    merged = copy.deepcopy(model)
    assert merge_duplicates(merged) == 0 and merged == model


def test_random_operators_other_domains_and_subgraphs_are_left_alone():
    random = _model([helper.make_node("RandomNormalLike", ["a"], [f"r{i}"]) for i in range(2)]
                    + [helper.make_node("Add", ["r0", "r1"], ["y"])])
    other = _model([helper.make_node("Relu", ["a"], [f"r{i}"], domain="com.example") for i in range(2)]
                   + [helper.make_node("Add", ["r0", "r1"], ["y"])])
    branch = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "branch", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    subgraph = _model([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Add", ["a", "b"], ["s2"]),
                       helper.make_node("ReduceSum", ["s2"], ["sum"], keepdims=0),
                       helper.make_node("Cast", ["sum"], ["cond"], to=TensorProto.BOOL),
                       helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)])
    for model in (random, other, subgraph):
        merged = copy.deepcopy(model)
        assert merge_duplicates(merged) == 0 and merged == model


def test_nothing_to_do():
    model = _model([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "a"], ["y"])])
    merged = copy.deepcopy(model)
    assert merge_duplicates(merged) == 0 and merged == model
