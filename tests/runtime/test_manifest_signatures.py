"""A manifest's tensors checked against its fragments' own ONNX signatures when `edgec run` loads the build:
an edited input, output or transfer shape or dtype is one line and exit 2 before any worker starts (it was
an internal error, a wait for the whole --timeout, or nothing at all); the signature reader agrees with onnx."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

import edgec
from edgec.runtime.front.cli import run
from edgec.runtime.errors import InputError
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.manifest.signatures import read_signature

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = REPO / "tests" / "e2e" / "clusters"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    """tinychain on pi5-a -> pi5-b: one model input, one output, one transfer."""
    out = tmp_path_factory.mktemp("pipeline") / "build"
    edgec.compile(MODELS / "tinychain.onnx", CLUSTERS / "four.yaml", out, strategy="pipeline", objective="throughput")
    return out


@pytest.fixture(scope="module")
def spatial_build(tmp_path_factory) -> Path:
    """tinyconv split by rows over two devices: regions, slices and concats."""
    out = tmp_path_factory.mktemp("spatial") / "build"
    edgec.compile(MODELS / "tinyconv.onnx", CLUSTERS / "two.yaml", out, strategy="spatial")
    return out


def edited(build: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "build"
    shutil.copytree(build, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    edit(doc)
    (copy / "manifest.json").write_text(json.dumps(doc))
    return copy


def refused(build: Path, *extra: str) -> str:
    res = CliRunner().invoke(run, [str(build), "--random-inputs", *extra], prog_name="edgec")
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"edgec: {build / 'manifest.json'}: "), res.stderr
    return lines[0]


def test_compiled_builds_pass(pipeline, spatial_build):
    for build in (pipeline, spatial_build):
        m = load_manifest(build / "manifest.json")
        assert m.transfers


def test_hand_built_manifests_pass(chain, spatial):
    load_manifest(chain.path)
    load_manifest(spatial.path)


@pytest.mark.parametrize("verify", [False, True])
def test_an_edited_input_shape(pipeline, tmp_path, verify):
    build = edited(pipeline, tmp_path, lambda d: d["inputs"][0].update(shape=[1, 3, 33, 32]))
    line = refused(build, *(["--verify"] if verify else []))
    assert "tensor 'input'" in line and "[1, 3, 33, 32] float32" in line and "[1, 3, 32, 32] float32" in line


def test_an_edited_input_dtype(pipeline, tmp_path):
    line = refused(edited(pipeline, tmp_path, lambda d: d["inputs"][0].update(dtype="float64")))
    assert "tensor 'input'" in line and "float64" in line


@pytest.mark.parametrize("change, shown", [({"shape": [1, 11]}, "[1, 11] float32"), ({"dtype": "int64"}, "[1, 10] int64")])
def test_an_edited_output(pipeline, tmp_path, change, shown):
    line = refused(edited(pipeline, tmp_path, lambda d: d["outputs"][0].update(change)), "--timeout", "60")
    assert "output 'logits'" in line and shown in line and "sends [1, 10] float32" in line


@pytest.mark.parametrize("change, shown", [({"shape": [1, 32, 8, 9]}, "[1, 32, 8, 9] float32"),
                                           ({"dtype": "float16"}, "[1, 32, 8, 8] float16")])
def test_an_edited_transfer(pipeline, tmp_path, change, shown):
    line = refused(edited(pipeline, tmp_path, lambda d: d["transfers"][0].update(change)))
    assert "transfers[0]" in line and shown in line and "sends [1, 32, 8, 8] float32" in line


def test_a_transfer_of_no_send_and_wrong_bytes(pipeline, tmp_path):
    line = refused(edited(pipeline, tmp_path / "a", lambda d: d["transfers"][0].update(dst="pi4-a")))
    assert "transfers[0]" in line and "no step sends" in line
    line = refused(edited(pipeline, tmp_path / "b", lambda d: d["transfers"][0].update(bytes=8191)))
    assert "transfers[0]" in line and "bytes 8191" in line and "8192" in line


def test_an_edited_spatial_region(spatial_build, tmp_path):
    def shrink(doc):
        send = next(s for steps in doc["steps"].values() for s in steps if s["op"] == "send" and s.get("region"))
        ranges = send["region"] if isinstance(send["region"], list) else [send["region"]]
        ranges[0]["stop"] -= 1
    line = refused(edited(spatial_build, tmp_path, shrink))
    assert "tensor '" in line or "transfers[" in line


def test_slices_concats_and_regions_are_followed(spatial, tmp_path):
    """The hand-built spatial case: a slice one row short reaches fragment fb as the wrong shape; a region past
    the end of its axis is refused; a concat on the wrong axis makes a tensor the head does not take."""
    doc = spatial.copy_manifest()
    doc["steps"]["a"][1]["stop"] = 3
    spatial.manifest = doc
    spatial.write()
    with pytest.raises(InputError, match=r"tensor 'x_top': device b holds \[1, 3, 3, 6\] float32, but fragment fb"):
        load_manifest(spatial.path)
    doc["steps"]["a"][1]["stop"] = 4
    doc["steps"]["a"][3]["region"] = doc["transfers"][0]["region"] = {"axis": 2, "start": 4, "stop": 9}
    spatial.write()
    with pytest.raises(InputError, match=r"send of 'x' from a to c: \[4, 9\) on axis 2 runs past its size 8"):
        load_manifest(spatial.path)
    doc["steps"]["a"][3]["region"] = doc["transfers"][0]["region"] = {"axis": 2, "start": 4, "stop": 8}
    doc["steps"]["a"][7]["axis"] = 1
    spatial.write()
    with pytest.raises(InputError, match=r"tensor 'y': device a holds \[1, 10, 4, 6\] float32, but fragment head"):
        load_manifest(spatial.path)


@pytest.mark.parametrize("name", ["tinychain", "tinyconv", "dynamic", "squeezenet"])
def test_the_signature_reader_agrees_with_onnx(name):
    path = MODELS / f"{name}.onnx"
    model = onnx.load(path, load_external_data=False)
    sig = read_signature(path)
    for values, read in ((model.graph.input, sig.inputs), (model.graph.output, sig.outputs)):
        assert list(read) == [v.name for v in values]
        for v in values:
            t = v.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
            assert read[v.name].shape == dims
            assert read[v.name].dtype == helper.tensor_dtype_to_np_dtype(t.elem_type).name


def test_a_file_that_is_not_onnx(tmp_path):
    bad = tmp_path / "x.onnx"
    for data in (b"", b"\x0a\xff\xff\xff\xff\x0f", b"not a model at all"):
        bad.write_bytes(data)
        with pytest.raises(InputError, match="not an ONNX model"):
            read_signature(bad)


def test_fragment_names_must_be_its_graphs(pipeline, tmp_path):
    line = refused(edited(pipeline, tmp_path, lambda d: d["fragments"][0]["outputs"].append("ghost")))
    assert "fragment f0" in line and "output 'ghost' is not an output of its graph" in line
