"""Hand-built ONNX models and manifests for the runtime tests (the compiler is never called)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

__all__ = ["Case"]

OPSET = 17
IR_VERSION = 9  # onnxruntime 1.31 reads IR <= 13; onnx 1.23 would write 14 by default

F32 = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def _vi(name, shape, elem=F32):
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _save(model: onnx.ModelProto, path: Path) -> str:
    data = model.SerializeToString()
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


class Case:
    """A folder holding fragment files, the source model and a manifest dict (written by `write`)."""

    def __init__(self, folder: Path, manifest: dict):
        self.folder = folder
        self.manifest = manifest

    @property
    def path(self) -> Path:
        return self.folder / "manifest.json"

    def write(self) -> Path:
        self.path.write_text(json.dumps(self.manifest, sort_keys=True, indent=1), encoding="utf-8")
        return self.path

    def copy_manifest(self) -> dict:
        return copy.deepcopy(self.manifest)

    def fragment(self, fid: str) -> dict:
        return next(f for f in self.manifest["fragments"] if f["id"] == fid)

    def replace_fragment(self, fid: str, model: onnx.ModelProto) -> None:
        frag = self.fragment(fid)
        frag["sha256"] = _save(model, self.folder / frag["file"])


def _base(model_sha: str, inputs, outputs, devices) -> dict:
    return {
        "format": "edgec.manifest", "version": 1,
        "model": {"path": "model.onnx", "sha256": model_sha},
        "inputs": inputs, "outputs": outputs,
        "devices": [{"name": d, "profile": "rpi5", "memory_mb": 8192, "address": None} for d in devices],
        "network": {"bandwidth_mbps": 1000.0, "latency_ms": 0.0, "medium": "switched", "links": []},
        "fragments": [], "transfers": [], "steps": {},
        "predicted": {"latency_ms": 1.0, "throughput_ips": 1000.0, "devices": {}},
        "plan": {"note": "hand-built for tests"},
    }


def build_chain(folder: Path) -> Case:
    """data -> Conv -> Relu -> t1 on pi5-a | t1 -> Flatten -> MatMul -> prob on pi4-a."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    w2 = rng.standard_normal((256, 10)).astype(np.float32) / 16
    conv = [helper.make_node("Conv", ["data", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["t1"])]
    head = [helper.make_node("Flatten", ["t1"], ["f"]), helper.make_node("MatMul", ["f", "w2"], ["prob"])]
    data, t1, prob = _vi("data", [1, 3, 8, 8]), _vi("t1", [1, 4, 8, 8]), _vi("prob", [1, 10])
    m = _base(_save(_model(conv + head, [data], [prob], [_init("w", w), _init("b", b), _init("w2", w2)]),
                    folder / "model.onnx"),
              [{"name": "data", "shape": [1, 3, 8, 8], "dtype": "float32"}],
              [{"name": "prob", "shape": [1, 10], "dtype": "float32", "device": "pi4-a"}], ["pi5-a", "pi4-a"])
    f0 = _save(_model(conv, [data], [t1], [_init("w", w), _init("b", b)]), folder / "pi5-a.f0.onnx")
    f1 = _save(_model(head, [t1], [prob], [_init("w2", w2)]), folder / "pi4-a.f1.onnx")
    m["fragments"] = [
        {"id": "f0", "device": "pi5-a", "file": "pi5-a.f0.onnx", "sha256": f0, "inputs": ["data"], "outputs": ["t1"], "predicted_ms": 1.0},
        {"id": "f1", "device": "pi4-a", "file": "pi4-a.f1.onnx", "sha256": f1, "inputs": ["t1"], "outputs": ["prob"], "predicted_ms": 1.0},
    ]
    m["transfers"] = [{"tensor": "t1", "src": "pi5-a", "dst": "pi4-a", "shape": [1, 4, 8, 8], "dtype": "float32",
                       "bytes": 1024, "region": None}]
    m["steps"] = {
        "pi5-a": [{"op": "recv", "tensor": "data", "from": "@host"}, {"op": "run", "fragment": "f0"},
                  {"op": "send", "tensor": "t1", "to": "pi4-a"}, {"op": "free", "tensors": ["data", "t1"]}],
        "pi4-a": [{"op": "recv", "tensor": "t1", "from": "pi5-a"}, {"op": "run", "fragment": "f1"},
                  {"op": "send", "tensor": "prob", "to": "@host"}],
    }
    case = Case(folder, m)
    case.write()
    return case


def _pointwise(src: str, dst: str, rows: int, w) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", [src, "w"], [dst + "_c"]), helper.make_node("Relu", [dst + "_c"], [dst])]
    return _model(nodes, [_vi(src, [1, 3, rows, 6])], [_vi(dst, [1, 5, rows, 6])], [_init("w", w)])


def build_spatial(folder: Path) -> Case:
    """a slices x's rows, sends halves (one by slice, one by region) to b and c, which run a 1x1 conv
    and send back; a concatenates and runs the head. Every step op is used."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 3, 1, 1)).astype(np.float32)
    g = rng.standard_normal((5, 4)).astype(np.float32)
    head = [helper.make_node("GlobalAveragePool", ["y"], ["p"]), helper.make_node("Flatten", ["p"], ["feat"]),
            helper.make_node("Gemm", ["feat", "g"], ["out"])]
    outs = [_vi("out", [1, 4]), _vi("feat", [1, 5])]
    whole = _model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])] + head,
                   [_vi("x", [1, 3, 8, 6])], outs, [_init("w", w), _init("g", g)])
    m = _base(_save(whole, folder / "model.onnx"), [{"name": "x", "shape": [1, 3, 8, 6], "dtype": "float32"}],
              [{"name": "out", "shape": [1, 4], "dtype": "float32", "device": "a"},
               {"name": "feat", "shape": [1, 5], "dtype": "float32", "device": "a"}], ["a", "b", "c"])
    fb = _save(_pointwise("x_top", "y_top", 4, w), folder / "b.fb.onnx")
    fc = _save(_pointwise("x_bot", "y_bot", 4, w), folder / "c.fc.onnx")
    fh = _save(_model(head, [_vi("y", [1, 5, 8, 6])], outs, [_init("g", g)]), folder / "a.head.onnx")
    m["fragments"] = [
        {"id": "fb", "device": "b", "file": "b.fb.onnx", "sha256": fb, "inputs": ["x_top"], "outputs": ["y_top"], "predicted_ms": 1.0},
        {"id": "fc", "device": "c", "file": "c.fc.onnx", "sha256": fc, "inputs": ["x_bot"], "outputs": ["y_bot"], "predicted_ms": 1.0},
        {"id": "head", "device": "a", "file": "a.head.onnx", "sha256": fh, "inputs": ["y"], "outputs": ["out", "feat"], "predicted_ms": 1.0},
    ]
    region = {"axis": 2, "start": 4, "stop": 8}
    m["transfers"] = [{"tensor": "x", "src": "a", "dst": "c", "shape": [1, 3, 4, 6], "dtype": "float32", "bytes": 288, "region": region}]
    m["steps"] = {
        "a": [{"op": "recv", "tensor": "x", "from": "@host"},
              {"op": "slice", "tensor": "x", "axis": 2, "start": 0, "stop": 4, "as": "x_top"},
              {"op": "send", "tensor": "x_top", "to": "b"},
              {"op": "send", "tensor": "x", "to": "c", "region": region, "as": "x_bot"},
              {"op": "free", "tensors": ["x", "x_top"]},
              {"op": "recv", "tensor": "y_bot", "from": "c"},
              {"op": "recv", "tensor": "y_top", "from": "b"},
              {"op": "concat", "parts": ["y_top", "y_bot"], "axis": 2, "as": "y"},
              {"op": "free", "tensors": ["y_top", "y_bot"]},
              {"op": "run", "fragment": "head"},
              {"op": "send", "tensor": "out", "to": "@host"},
              {"op": "send", "tensor": "feat", "to": "@host"}],
        "b": [{"op": "recv", "tensor": "x_top", "from": "a"}, {"op": "run", "fragment": "fb"},
              {"op": "send", "tensor": "y_top", "to": "a"}],
        "c": [{"op": "recv", "tensor": "x_bot", "from": "a"}, {"op": "run", "fragment": "fc"},
              {"op": "send", "tensor": "y_bot", "to": "a"}],
    }
    case = Case(folder, m)
    case.write()
    return case


def failing_head() -> onnx.ModelProto:
    """Loads fine (t1's dims are symbolic) but fails at run time: 256 elements cannot reshape to [7, -1]."""
    nodes = [helper.make_node("Reshape", ["t1", "shape"], ["prob"])]
    return _model(nodes, [_vi("t1", ["n", "c", "h", "w"])], [_vi("prob", None)],
                  [_init("shape", np.array([7, -1], dtype=np.int64))])


def symbolic_stem() -> onnx.ModelProto:
    """chain's f0 with symbolic dims in and out: a model input of any size matches its graph."""
    w = np.ones((4, 3, 3, 3), np.float32)
    nodes = [helper.make_node("Conv", ["data", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["t1"])]
    return _model(nodes, [_vi("data", ["n", 3, "h", "w"])], [_vi("t1", ["n", 4, "h", "w"])], [_init("w", w)])


@pytest.fixture
def chain(tmp_path) -> Case:
    return build_chain(tmp_path)


@pytest.fixture
def spatial(tmp_path) -> Case:
    return build_spatial(tmp_path)


@pytest.fixture
def make_failing_head():
    return failing_head


@pytest.fixture
def make_symbolic_stem():
    return symbolic_stem
