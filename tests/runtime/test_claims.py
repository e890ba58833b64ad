"""Which nodes the CPU provider runs beside an accelerator (runtime/profile/claims.py): read from a real profiler
trace of onnxruntime-openvino (tests/runtime/data, captured once: no OpenVINO needed here), and from a session of
the stock build, where the CPU provider runs every node."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edgec.runtime.errors import InputError
from edgec.runtime.profile.claims import cpu_nodes, cpu_nodes_of
from edgec.runtime.profile.nodes import basic_graph, kernel_events, measure_layers_on, node_keys, node_map
from edgec.runtime.providers import CPU, Provider

DATA = Path(__file__).parent / "data"
MODEL = DATA / "openvino_fallback.onnx"
TRACE = DATA / "openvino_fallback.trace.json"


def _map(model: onnx.ModelProto):
    with tempfile.TemporaryDirectory() as tmp:
        return node_map(model, node_keys(model), basic_graph(model.SerializeToString(), tmp))


def test_the_openvino_trace_names_the_nodes_the_cpu_ran():
    model = onnx.load(str(MODEL))
    events = json.loads(TRACE.read_text())
    assert {e.provider for e in kernel_events(events)} == {CPU, "OpenVINOExecutionProvider"}
    cpu = cpu_nodes_of(events, _map(model))
    # Mish's parts (unnamed, "Softplus_11" in the trace) are Mish's; the eliminated Identity ran nowhere
    assert cpu == {"conv1", "relu1", "conv2", "mish", "flatten", "hardmax"}
    assert not cpu & {"fc", "relu3", "fc2"}  # OpenVINO-EP-subgraph_1


def test_a_stock_cpu_session_runs_every_node_on_the_cpu():
    model = onnx.load(str(MODEL))
    assert cpu_nodes(model, [Provider(CPU)]) == set(node_keys(model)) - {"ident"}  # basic removes the Identity


def test_unnamed_nodes_are_keyed_as_edgec_keys_them():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["y"])],
                          "g", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert cpu_nodes(model, [Provider(CPU)]) == {"Relu_0", "Sigmoid_1"}


def test_a_provider_this_onnxruntime_lacks_is_refused_in_one_line():
    with pytest.raises(InputError, match=r"^m.onnx: this onnxruntime does not have CUDAExecutionProvider \(it has"):
        cpu_nodes(onnx.load(str(MODEL)), [Provider("CUDAExecutionProvider")], where="m.onnx")


def test_a_subgraphs_time_is_shared_among_the_nodes_the_cpu_did_not_run(monkeypatch, tmp_path):
    """measure_layers_on with an accelerator: the trace's accelerator events go to the claimed nodes in proportion
    to their CPU times; the CPU's nodes keep theirs. Replayed from the recorded trace (one run, no warm-up)."""
    import edgec.runtime.profile.nodes as nodes

    events = json.loads(TRACE.read_text())

    class Session:
        def __init__(self, *a, **k):
            pass

        def get_inputs(self):
            return []

        def run(self, *a):
            pass

        def end_profiling(self):
            f = tmp_path / "trace.json"
            f.write_text(json.dumps(events))
            return str(f)

    basic = _basic_of(MODEL)
    monkeypatch.setattr(nodes.ort, "InferenceSession", Session)
    monkeypatch.setattr(nodes, "basic_graph", lambda data, tmp: basic)
    cpu_table = {"fc": 3.0, "relu3": 1.0, "fc2": 0.0}
    monkeypatch.setattr(nodes, "_WARMUP", 0)
    _, table, cpu = measure_layers_on(MODEL, runs=1, providers=[Provider("OpenVINOExecutionProvider"), Provider(CPU)],
                                   cpu_table=cpu_table)
    sub = next(e for e in kernel_events(events) if e.provider != CPU).dur_ms
    assert cpu == {"conv1", "relu1", "conv2", "mish", "flatten", "hardmax"}
    assert table["fc"] == pytest.approx(sub * 0.75, rel=1e-3) and table["relu3"] == pytest.approx(sub * 0.25, rel=1e-3)
    assert table["fc2"] == 0.0 and table["ident"] == 0.0
    hardmax = next(e for e in kernel_events(events) if e.name == "hardmax").dur_ms
    assert table["hardmax"] == pytest.approx(hardmax, rel=1e-3)


def _basic_of(path: Path) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as tmp:
        return basic_graph(str(path), tmp)
