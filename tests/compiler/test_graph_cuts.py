"""LayerGraph cut points: block cuts (one live tensor, for spatial regions) and pipeline cuts (at most one
live tensor that is not small), on hand-built graphs and the repository's models."""

from __future__ import annotations

import os
from pathlib import Path

from edgec.compiler.graph import SMALL_FRACTION, Layer, LayerGraph, TensorInfo
from edgec.compiler.ingest import load_model

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])


def graph_of(edges: list[tuple[tuple[str, ...], tuple[str, ...]]], nbytes: dict[str, int]) -> LayerGraph:
    """Layers from (inputs, outputs) pairs; every tensor a float32 vector of nbytes[name] bytes."""
    layers = tuple(
        Layer(index=i, name=f"l{i}", nodes=(i,), node_names=(f"l{i}",), op_types=("Add",), cost_class="elementwise",
              spatial_type=2, inputs=ins, outputs=outs, flops=1, param_bytes=0,
              input_bytes=sum(nbytes[t] for t in ins), output_bytes=sum(nbytes[t] for t in outs))
        for i, (ins, outs) in enumerate(edges))
    tensors = {t: TensorInfo(t, (n // 4,), "float32", n) for t, n in nbytes.items()}
    return LayerGraph(layers, tensors, ("x",), edges[-1][1])


def test_a_small_tensor_beside_the_main_one_makes_a_pipeline_cut():
    # l0 makes the mask m and the state a; l1 and l2 use both; only the mask rides across cuts 2
    g = graph_of([(("x",), ("a", "m")), (("a", "m"), ("b",)), (("b", "m"), ("c",)), (("c",), ("y",))],
                 {"x": 1024, "a": 1024, "m": 64, "b": 1024, "c": 1024, "y": 1024})
    assert g.live_across(2) == ("m", "b")
    assert g.block_cuts == (3,)
    assert g.pipeline_cuts == (1, 2, 3)
    assert g.pipeline_blocks == ((0, 1), (1, 2), (2, 3), (3, 4))


def test_small_means_a_sixteenth_of_the_largest_live_tensor():
    sizes = {"x": 1024, "a": 1024, "b": 1024, "y": 1024}
    edges = [(("x",), ("a", "s")), (("a",), ("b",)), (("b", "s"), ("y",))]
    at_bound = graph_of(edges, {**sizes, "s": 1024 // SMALL_FRACTION})
    above = graph_of(edges, {**sizes, "s": 1024 // SMALL_FRACTION + 4})
    assert at_bound.is_small("s", 2) and at_bound.pipeline_cuts == (1, 2)
    assert not above.is_small("s", 2) and above.pipeline_cuts == ()


def test_two_large_tensors_make_no_cut_even_beside_a_small_one():
    g = graph_of([(("x",), ("a", "b", "m")), (("a", "m"), ("c",)), (("b", "c", "m"), ("y",))],
                 {"x": 1024, "a": 1024, "b": 1024, "m": 16, "c": 1024, "y": 1024})
    assert g.live_across(1) == ("a", "b", "m") and g.live_across(2) == ("b", "m", "c")
    assert g.pipeline_cuts == () and g.block_cuts == ()


def test_residual_block_gets_no_pipeline_cut(residual_path):
    g = load_model(residual_path).graph
    assert g.live_across(2) == ("a", "br")  # the skip is as large as the branch
    assert g.pipeline_cuts == g.block_cuts == (1, 3)
    assert g.pipeline_blocks == g.blocks


def test_transformer_encoder_and_attention_ffn_boundaries_are_pipeline_cuts():
    g = load_model(MODELS / "transformer.onnx").graph
    assert g.block_cuts == (1, 2, 141, 142, 147)
    new = set(g.pipeline_cuts) - set(g.block_cuts)
    # inside encoder 1: attention/FFN (21, 22) and the encoder boundary (27, 28); the same every 24 layers
    for base in (0, 24, 48, 72, 96):
        assert {21 + base, 22 + base} <= new
    for base in (0, 24, 48, 72):
        assert {27 + base, 28 + base} <= new
    for c in (21, 22, 27, 28, 45, 46):
        live = g.live_across(c)
        assert len(live) == 2 and "reshape_0" in live and g.tensors["reshape_0"].nbytes == 512
        assert max(g.tensors[t].nbytes for t in live) == 393_216


def test_cnn_models_keep_their_cuts():
    for name in ("resnet50", "inception_v1", "mobilenetv2", "tinyconv"):
        g = load_model(MODELS / f"{name}.onnx").graph
        assert g.pipeline_cuts == g.block_cuts, name
