"""ceil_mode pools whose last window would start in the end padding: ONNX shape inference keeps that
window, onnxruntime drops it. Ingest must use onnxruntime's shapes (or fragments declare wrong shapes),
and such pools then tile like any other window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.ingest import load_model

HERE = Path(__file__).resolve().parent


def ceil_pool_model(path: Path, size: int = 14, op: str = "MaxPool") -> Path:
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.normal(size=(6, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(5, 6, 3, 3)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             # 14 rows, kernel 2, stride 2, end pad 1, ceil: inference says 8 rows, onnxruntime 7
             helper.make_node(op, ["r1"], ["p"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1,
                              name="pool"),
             helper.make_node("Conv", ["p", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    g = helper.make_graph(nodes, "ceil", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, "h", "w"])], [w1, w2])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def test_ingest_uses_onnxruntime_shapes(tmp_path):
    graph = load_model(ceil_pool_model(tmp_path / "m.onnx")).graph
    assert graph.tensors["p"].shape == (1, 6, 7, 7)
    assert graph.tensors["y"].shape == (1, 5, 7, 7)


@pytest.mark.parametrize("strategy,op", [("even", "MaxPool"), ("spatial", "MaxPool"), ("edgeflow", "AveragePool")])
def test_ceil_pool_plans_verify(tmp_path, strategy, op):
    model = ceil_pool_model(tmp_path / "m.onnx", op=op)
    out = tmp_path / "o"
    c = subprocess.run([sys.executable, "-m", "edgec.compiler", "compile", model, "--devices", HERE / "clusters/two.yaml",
                        "-o", out, "--strategy", strategy, "--json"], capture_output=True, text=True, timeout=300)
    assert c.returncode == 0, c.stderr
    stages = json.loads(c.stdout)["stages"]
    if strategy != "even":  # the pool is inside a tiled segment
        pool = 1  # layers: conv1+relu1, pool, conv2+relu2
        assert any(st["spatial"] and st["layers"][0] <= pool < st["layers"][1] for st in stages), stages
    r = subprocess.run([sys.executable, "-m", "edgec.compiler", "run", out / "manifest.json", "--random-inputs", "--verify",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["verify"]["passed"]
