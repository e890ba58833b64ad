"""Shared fixtures: tiny ONNX models built in the test, with non-constant seeded weights."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
# The tests use the models that README's `python -m edgec.models build` wrote into the checkout, from
# any working directory (subprocesses included).
os.environ.setdefault("EDGEC_MODELS_DIR", str(ROOT / "models" / "build"))
if str(ROOT) not in sys.path:  # tests import shared helpers as tests.<module>
    sys.path.insert(0, str(ROOT))


def conv_chain_model(n: int = 4, channels: int = 8, size: int = 16, seed: int = 0, opset: int = 13) -> onnx.ModelProto:
    """Conv+Relu x n, then Flatten + Gemm: a plain chain with random weights."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev, cin = "x", 3
    for i in range(n):
        w = rng.normal(0, np.sqrt(2 / (cin * 9)), (channels, cin, 3, 3)).astype(np.float32)
        b = rng.normal(0, 0.05, channels).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        prev, cin = f"r{i}", channels
    nodes.append(helper.make_node("Flatten", [prev], ["flat"], name="flatten"))
    fw = rng.normal(0, 0.05, (channels * size * size, 10)).astype(np.float32)
    inits.append(numpy_helper.from_array(fw, "fw"))
    nodes.append(helper.make_node("Gemm", ["flat", "fw"], ["y"], name="fc"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def residual_model(seed: int = 1) -> onnx.ModelProto:
    """conv -> [conv -> relu, identity] -> Add -> conv: one branch and merge (a 3-block chain)."""
    rng = np.random.default_rng(seed)

    def w(name, shape):
        return numpy_helper.from_array(rng.normal(0, 0.2, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="c0"),
        helper.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1, 1, 1], name="c1"),
        helper.make_node("Relu", ["b"], ["br"], name="r1"),
        helper.make_node("Add", ["a", "br"], ["s"], name="add"),
        helper.make_node("Conv", ["s", "w2"], ["y"], pads=[0, 0, 0, 0], name="c2"),
    ]
    graph = helper.make_graph(nodes, "res", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              initializer=[w("w0", (4, 2, 3, 3)), w("w1", (4, 4, 3, 3)), w("w2", (4, 4, 1, 1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture
def chain_path(tmp_path) -> Path:
    p = tmp_path / "chain.onnx"
    onnx.save(conv_chain_model(), p)
    return p


@pytest.fixture
def residual_path(tmp_path) -> Path:
    p = tmp_path / "res.onnx"
    onnx.save(residual_model(), p)
    return p


@pytest.fixture(scope="session", autouse=True)
def _fragment_cache(tmp_path_factory):
    """Local workers keep fragments in a per-user cache by default: the tests use a folder of their own."""
    saved = os.environ.get("EDGEC_CACHE_DIR")
    os.environ["EDGEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("fragment-cache"))
    yield
    if saved is None:
        os.environ.pop("EDGEC_CACHE_DIR", None)
    else:
        os.environ["EDGEC_CACHE_DIR"] = saved
