"""Tests for the models package: tiny builds, resnet50's weight rewrite, the CLI and ensure()."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from edgec import models
from edgec.models import torch_support

REPO = Path(models.__file__).resolve().parent.parent
TINY = ["tinyconv", "tinychain", "tinytransformer", "dynamic"]
ZOO = list(models.zoo.ZOO)
# Decoder LMs take a KV cache, not example_inputs' feeds: tests/models/test_decoder.py covers them.
LARGE = [n for n in models.MODEL_NAMES if n not in TINY and n not in models.GENERATIVE]


def session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # the zoo graphs warn about their unused [1,1] initializer
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def probabilities(out: np.ndarray) -> np.ndarray:
    """The output itself if it is already a softmax, else its softmax."""
    flat = out.reshape(-1).astype(np.float64)
    if flat.min() >= 0 and abs(flat.sum() - 1) < 1e-3:
        return flat
    e = np.exp(flat - flat.max())
    return e / e.sum()


def assert_lively(path: Path) -> None:
    """Runs, is finite, depends on the input, and a classifier's softmax is neither flat nor one-hot."""
    sess = session(path)
    a, b = (sess.run(None, models.example_inputs(sess, seed=s))[0] for s in (1, 2))
    assert np.isfinite(a).all() and np.isfinite(b).all()
    assert np.abs(a - b).max() > 1e-3 * max(np.abs(a).max(), 1e-6)
    if "transformer" not in path.stem:
        p = probabilities(a)
        assert 2 / p.size < p.max() < 0.99


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgec.models", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


# ---- tiny models ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    for name in TINY:
        models.build(name, out)
    return out


@pytest.mark.parametrize("name", TINY)
def test_tiny_model_is_valid_small_and_lively(tiny_dir, name):
    path = tiny_dir / f"{name}.onnx"
    onnx.checker.check_model(onnx.load(path), full_check=True)
    assert path.stat().st_size < 500_000
    assert_lively(path)


@pytest.mark.parametrize("name", TINY)
def test_builds_are_byte_identical(tiny_dir, tmp_path, name):
    assert models.build(name, tmp_path).read_bytes() == (tiny_dir / f"{name}.onnx").read_bytes()


def test_tinyconv_has_every_op_it_promises(tiny_dir):
    graph = onnx.load(tiny_dir / "tinyconv.onnx").graph
    assert list(graph.input[0].type.tensor_type.shape.dim)[2].dim_value == 37
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in graph.node]
    convs = [a for n, a in zip(graph.node, attrs) if n.op_type == "Conv"]
    assert any(a["strides"] == [2, 2] for a in convs)
    assert any(a["dilations"] == [2, 2] for a in convs)
    assert any(a["group"] == 4 for a in convs)
    assert any(a["group"] == 16 for a in convs)  # depthwise on 16 channels
    ops = {n.op_type for n in graph.node}
    assert {"MaxPool", "AveragePool", "BatchNormalization", "Relu", "Clip", "Add", "Concat",
            "GlobalAveragePool", "Flatten", "Gemm", "Softmax"} <= ops


def test_dynamic_is_tinychain_with_a_free_batch(tiny_dir):
    dim = tiny_dir.joinpath("dynamic.onnx")
    assert onnx.load(dim).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    feeds = models.example_inputs(dim, seed=3, dim=3)
    batched = session(dim).run(None, feeds)[0]
    chain = session(tiny_dir / "tinychain.onnx")
    for i in range(3):
        row = chain.run(None, {"input": feeds["input"][i:i + 1]})[0]
        np.testing.assert_allclose(batched[i:i + 1], row, rtol=1e-5, atol=1e-5)


def test_tinytransformer_masks_padding(tiny_dir):
    path = tiny_dir / "tinytransformer.onnx"
    feeds = models.example_inputs(path, seed=4)
    mask = feeds["attention_mask"][0]
    assert mask.sum() == 12
    sess = session(path)
    base = sess.run(None, feeds)[0]
    assert base.shape == (1, 16, 64)
    changed = dict(feeds, input_ids=feeds["input_ids"].copy())
    changed["input_ids"][0, mask == 0] = (changed["input_ids"][0, mask == 0] + 1) % 100
    other = sess.run(None, changed)[0]
    np.testing.assert_allclose(other[0, mask == 1], base[0, mask == 1], rtol=1e-5, atol=1e-5)
    assert np.abs(other[0, mask == 0] - base[0, mask == 0]).max() > 1e-2


# ---- ocr_rec: a 200-layer recogniser for the planning benchmark (issue 12) ---------------------

def test_ocr_rec_is_a_lively_text_recogniser_of_about_200_layers(tmp_path):
    from edgec.compiler.ingest import load_model

    path = models.build("ocr_rec", tmp_path)
    model = onnx.load(path)
    onnx.checker.check_model(model)
    ops = {n.op_type for n in model.graph.node}
    assert {"BatchNormalization", "HardSwish", "HardSigmoid", "GlobalAveragePool", "LayerNormalization",
            "Softmax", "MatMul"} <= ops  # a depthwise backbone with SE, an attention neck, a CTC head
    out = session(path).run(None, models.example_inputs(path, seed=3))[0]
    assert out.shape == (1, 40, 97)  # 40 steps x 97 classes
    assert_lively(path)
    assert 200 <= len(load_model(path, None).graph.layers) <= 300  # the layers the planners see


# ---- resnet50: the zoo rewrite -------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet50(tmp_path_factory) -> Path:
    return models.build("resnet50", tmp_path_factory.mktemp("zoo"))


def test_resnet50_constants_replaced_by_random_weights(resnet50):
    model = onnx.load(resnet50)
    g = model.graph
    assert "ConstantOfShape" not in {n.op_type for n in g.node}
    names = [t.name for t in g.initializer] + [i.name for i in g.input]
    assert not [n for n in names if n.endswith("__SHAPE")]
    for t in g.initializer:
        w = numpy_helper.to_array(t)
        if w.size > 1 and w.dtype == np.float32:
            assert w.std() > 0, t.name
    var = [numpy_helper.to_array(t) for t in g.initializer if t.name.endswith("_riv_0")]
    assert var and all((v > 0).all() for v in var)


def test_resnet50_keeps_the_rest_of_the_graph(resnet50):
    model = onnx.load(resnet50)
    original = onnx.load(models.zoo.LIGHT_DIR / "light_resnet50.onnx")
    assert model.ir_version == original.ir_version == 3
    assert [o.version for o in model.opset_import] == [9]
    # old IR: every initializer stays listed as a graph input
    assert {t.name for t in model.graph.initializer} <= {i.name for i in model.graph.input}
    assert any(t.name.startswith("gpu_0/imagenet1k_blobs_queue") for t in model.graph.initializer)
    kept = [n for n in original.graph.node if n.op_type != "ConstantOfShape"]
    assert [n.SerializeToString() for n in model.graph.node] == [n.SerializeToString() for n in kept]
    onnx.checker.check_model(model)


def test_resnet50_softmax_is_not_degenerate(resnet50):
    assert_lively(resnet50)


# ---- ensure() and atomic writes ------------------------------------------------------------

def test_ensure_builds_once_and_rebuilds_stale_files(tmp_path):
    path = models.ensure("tinychain", tmp_path)
    assert path == tmp_path / "tinychain.onnx" and models.is_current("tinychain", path)
    mtime = path.stat().st_mtime_ns
    assert models.ensure("tinychain", tmp_path) == path and path.stat().st_mtime_ns == mtime
    path.write_bytes(b"not a model")
    models.ensure("tinychain", tmp_path)
    onnx.checker.check_model(onnx.load(path))


def test_ensure_is_safe_when_two_processes_race(tmp_path):
    code = "import models, sys; models.ensure('tinyconv', sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO) for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert sorted(os.listdir(tmp_path)) == ["tinyconv.onnx"]
    assert models.is_current("tinyconv", tmp_path / "tinyconv.onnx")


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    def boom(*_):
        raise OSError("disk full")

    monkeypatch.setattr(models.os, "replace", boom)
    with pytest.raises(OSError):
        models.build("tinychain", tmp_path)
    assert os.listdir(tmp_path) == []


def test_unknown_name_raises():
    with pytest.raises(KeyError, match="unknown model"):
        models.ensure("nosuchmodel")


def test_torch_models_listed_only_when_importable():
    torch_names = set(torch_support.MODELS)
    if models.TORCH_MISSING:
        assert not torch_names & set(models.MODEL_NAMES)
    else:
        assert torch_names <= set(models.MODEL_NAMES)


# ---- command line --------------------------------------------------------------------------

def test_cli_list_names_every_model():
    res = run_cli("list")
    assert res.returncode == 0
    assert [line.split()[0] for line in res.stdout.splitlines()] == list(models.MODEL_NAMES)
    assert ("torch" in res.stderr) == bool(models.TORCH_MISSING)


def test_cli_build_skips_current_files_unless_forced(tmp_path):
    res = run_cli("build", "-o", str(tmp_path), "--only", "tinychain,dynamic")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(tmp_path / "tinychain.onnx"), str(tmp_path / "dynamic.onnx")]
    lines = res.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("tinychain") and lines[0].endswith(" s")
    again = run_cli("build", "-o", str(tmp_path), "--only", "tinychain")
    assert "up to date" in again.stderr
    forced = run_cli("build", "-o", str(tmp_path), "--only", "tinychain", "--force")
    assert forced.returncode == 0 and "up to date" not in forced.stderr


def test_cli_unknown_name_exits_2_with_one_line(tmp_path):
    res = run_cli("build", "-o", str(tmp_path), "--only", "tinychain,bogus")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "bogus" in res.stderr
    assert os.listdir(tmp_path) == []


# ---- every large model (slow) --------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_large_model_is_valid_and_lively(name):
    path = models.ensure(name)
    onnx.checker.check_model(str(path))
    if name in ZOO:
        assert "ConstantOfShape" not in {n.op_type for n in onnx.load(path).graph.node}
    assert_lively(path)


@pytest.mark.slow
@pytest.mark.skipif(bool(models.TORCH_MISSING), reason=str(models.TORCH_MISSING))
@pytest.mark.parametrize("name", sorted(torch_support.MODELS))
def test_torch_export_is_deterministic_and_lively(tmp_path, name):
    path = models.build(name, tmp_path)
    assert models.build(name, tmp_path / "again").read_bytes() == path.read_bytes()
    onnx.checker.check_model(str(path))
    if name not in torch_support.GENERATIVE:  # test_decoder.py runs the decoders
        assert_lively(path)


@pytest.mark.slow
def test_calibrated_zoo_build_is_byte_identical(tmp_path):
    assert models.build("resnet50", tmp_path).read_bytes() == models.ensure("resnet50").read_bytes()
