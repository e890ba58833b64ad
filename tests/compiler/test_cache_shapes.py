"""Shape reads of a decoder's caches (ingest/cache_shapes.py): taken from the token ids and the attention mask,
with the same values, so that each cache's state span is its own layer's and stages can meet between layers;
left alone where no mask tells the past; nothing to do where no Shape reads a cache."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgec.compiler.ingest.cache_shapes import detach_cache_shapes
from edgec.compiler.ingest.phases import GenerateOptions, load_phases
from edgec.compiler.ingest.state import dim_roles, find_state

LAYERS, HEADS, DIM, VOCAB = 2, 2, 4, 16
HIDDEN = HEADS * DIM


def _decoder(shape_reads: bool = True, mask: bool = True, whole_shape: bool = False) -> onnx.ModelProto:
    """Two decoder-like layers as torch's dynamo exporter lays them out: every cache's shape read at the top
    of the graph (its past, and layer 1's batch too), each read used by its own layer; with `whole_shape`, the
    past is read as older exporters do, the whole shape then its element 2. Layer i appends the new
    tokens to cache i and adds the cache's mean over the total length (past + seq, from the Shape read) to
    the hidden state."""
    rng = np.random.default_rng(0)

    def weight(name, shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, rng.normal(0, 0.5, shape).astype(np.float32).ravel())

    inits = [weight("emb", [VOCAB, HIDDEN]), weight("head", [HIDDEN, VOCAB]),
             helper.make_tensor("split", TensorProto.INT64, [4], [0, 0, HEADS, DIM]),
             helper.make_tensor("row", TensorProto.INT64, [2], [-1, HIDDEN]),
             helper.make_tensor("axis2", TensorProto.INT64, [1], [2])]
    nodes = [helper.make_node("Shape", ["input_ids"], ["seq"], start=1, end=2)]
    if shape_reads:  # at the top, as torch emits them
        for i in range(LAYERS):
            if whole_shape:
                nodes += [helper.make_node("Shape", [f"past_key_values.{i}.key"], [f"shape{i}"]),
                          helper.make_node("Gather", [f"shape{i}", "axis2"], [f"past{i}"], axis=0)]
            else:
                nodes.append(helper.make_node("Shape", [f"past_key_values.{i}.key"], [f"past{i}"], start=2, end=3))
        nodes.append(helper.make_node("Shape", ["past_key_values.1.key"], ["batch1"], start=0, end=1))
    for i in range(LAYERS):  # each layer's total length, also at the top
        total = f"total{i}" if shape_reads else "seq"
        if shape_reads:
            nodes.append(helper.make_node("Add", [f"past{i}", "seq"], [total]))
        nodes.append(helper.make_node("Cast", [total], [f"totalf{i}"], to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Gather", ["emb", "input_ids"], ["x0"]))
    for i in range(LAYERS):
        inits.append(weight(f"w{i}", [HIDDEN, HIDDEN]))
        key, x = f"past_key_values.{i}.key", f"x{i}"
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"kv{i}"]),
                  helper.make_node("Reshape", [f"kv{i}", "split"], [f"kv4_{i}"]),
                  helper.make_node("Transpose", [f"kv4_{i}"], [f"new{i}"], perm=[0, 2, 1, 3]),
                  helper.make_node("Concat", [key, f"new{i}"], [f"present.{i}.key"], axis=2),
                  helper.make_node("ReduceSum", [f"present.{i}.key", "axis2"], [f"sum{i}"], keepdims=0)]
        row = "row"
        if shape_reads and i == 1:  # the batch from the cache's shape, as a view's size
            row = "row1"
            nodes.append(helper.make_node("Concat", ["batch1", "last"], [row], axis=0))
            inits.append(helper.make_tensor("last", TensorProto.INT64, [1], [HIDDEN]))
        nodes += [helper.make_node("Reshape", [f"sum{i}", row], [f"flat{i}"]),
                  helper.make_node("Div", [f"flat{i}", f"totalf{i}"], [f"mean{i}"]),
                  helper.make_node("Unsqueeze", [f"mean{i}", "one"], [f"mean3_{i}"]),
                  helper.make_node("Add", [x, f"mean3_{i}"], [f"x{i + 1}"])]
    inits.append(helper.make_tensor("one", TensorProto.INT64, [1], [1]))
    nodes.append(helper.make_node("MatMul", [f"x{LAYERS}", "head"], ["logits"]))
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"])]
    if mask:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_sequence_length"]))
        nodes.append(helper.make_node("Cast", ["attention_mask"], ["mask_unused"], to=TensorProto.FLOAT))
    inputs += [helper.make_tensor_value_info(f"past_key_values.{i}.key", TensorProto.FLOAT,
                                             ["batch", HEADS, f"past_{i}", DIM]) for i in range(LAYERS)]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence_length", VOCAB])]
    outputs += [helper.make_tensor_value_info(f"present.{i}.key", TensorProto.FLOAT, ["batch", HEADS, "total", DIM])
                for i in range(LAYERS)]
    if mask:
        outputs.append(helper.make_tensor_value_info("mask_unused", TensorProto.FLOAT, ["batch", "total_sequence_length"]))
    graph = helper.make_graph(nodes, "lm", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _detached(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    out = copy.deepcopy(model)
    pairs = find_state(out, {}, "lm.onnx")
    return out, detach_cache_shapes(out, pairs, dim_roles(out, pairs, "lm.onnx"))


def _run(model: onnx.ModelProto, batch: int, seq: int, past: int) -> list[np.ndarray]:
    rng = np.random.default_rng(past * 10 + seq)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq)), "attention_mask": np.ones((batch, past + seq), np.int64),
             **{f"past_key_values.{i}.key": rng.normal(size=(batch, HEADS, past, DIM)).astype(np.float32)
                for i in range(LAYERS)}}
    return sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})


@pytest.mark.parametrize("whole_shape", [False, True])
@pytest.mark.parametrize("batch, seq, past", [(1, 5, 0), (1, 1, 7), (3, 2, 4)])
def test_the_reads_come_from_token_and_mask_with_the_same_values(batch, seq, past, whole_shape):
    model = _decoder(whole_shape=whole_shape)
    detached, n = _detached(model)
    assert n == LAYERS + 1
    readers = [node for node in detached.graph.node if node.op_type == "Shape"]
    assert {node.input[0] for node in readers} == {"input_ids", "attention_mask"}
    onnx.checker.check_model(detached, full_check=True)
    for a, b in zip(_run(model, batch, seq, past), _run(detached, batch, seq, past)):
        np.testing.assert_array_equal(a, b)


def test_each_cache_stays_with_its_layer_and_stages_can_meet_between_layers(tmp_path, monkeypatch):
    path = tmp_path / "lm.onnx"
    onnx.save(_decoder(), path)
    graph = load_phases(path, GenerateOptions(max_context=16, prompt_len=4)).decode.graph
    (lo0, hi0), (lo1, hi1) = graph.unsplit
    assert hi0 < lo1  # before: both spans began at the top of the graph, where the Shapes were
    assert any(hi0 < c <= lo1 for c in graph.pipeline_cuts)
    assert "total1" not in graph.tensors  # past + seq, now the same sum as layer 0's: merged (duplicates.py)
    # The same model without the pass: the spans overlap, no stage boundary between the layers.
    monkeypatch.setattr("edgec.compiler.ingest.phases.detach_cache_shapes", lambda *a: 0)
    graph = load_phases(path, GenerateOptions(max_context=16, prompt_len=4)).decode.graph
    (lo0, hi0), (lo1, hi1) = graph.unsplit
    assert lo1 <= hi0 and not any(hi0 < c <= lo1 for c in graph.pipeline_cuts)


def test_without_a_mask_the_past_is_not_known_and_the_reads_stay():
    model = _decoder(mask=False)
    detached, n = _detached(model)
    # The batch read (layer 1's) is replaced; the past reads stay: nothing else tells the past.
    assert n == 1
    assert sorted(node.input[0] for node in detached.graph.node if node.op_type == "Shape") == [
        "input_ids", "input_ids", "past_key_values.0.key", "past_key_values.1.key"]
    for a, b in zip(_run(model, 2, 3, 4), _run(detached, 2, 3, 4)):
        np.testing.assert_array_equal(a, b)


def test_nothing_to_do_without_shape_reads():
    model = _decoder(shape_reads=False)
    detached, n = _detached(model)
    assert n == 0 and detached == model
