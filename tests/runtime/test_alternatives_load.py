"""`load_alternative`: an alternative build (compile --keep / --shifts) loads only when it is the file the
main manifest recorded, inside its build folder, planning the same model on the main manifest's devices;
and the entries' optional `variant` parses as a string or null."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import edgec
from edgec.runtime.errors import InputError
from edgec.runtime.manifest.types import Alternative
from edgec.runtime.manifest.load import load_alternative, load_manifest, parse_manifest
from tests.compiler.test_pareto import PROFILES, _cluster

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
TINY = MODELS / "tinychain.onnx"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Path:
    return _cluster(tmp_path_factory.mktemp("three"), PROFILES)


@pytest.fixture(scope="module")
def build(cluster, tmp_path_factory) -> Path:
    """tinychain as a three-stage pipeline with one --keep plan and its boundary shifts."""
    out = tmp_path_factory.mktemp("alts") / "build"
    edgec.compile(TINY, cluster, out, strategy="pipeline", objective="throughput", keep=1, shifts=True)
    return out


@pytest.fixture
def copy(build, tmp_path) -> Path:
    """A copy of the build to break."""
    return Path(shutil.copytree(build, tmp_path / "build"))


def _main(folder: Path):
    return load_manifest(folder / "manifest.json", check_files=False)


def _entry(folder: Path, file: str) -> Alternative:
    """An alternative entry naming `file` (relative to the build folder) with that file's true sha256."""
    digest = hashlib.sha256((folder / file).read_bytes()).hexdigest()
    return Alternative(file, digest, "pipeline", {"latency_ms": 1.0, "throughput_ips": 1.0, "energy_mj": None})


def test_every_alternative_loads_against_its_main_manifest(build):
    main = _main(build)
    assert len(main.alternatives) >= 2 and main.alternatives[0].variant is None
    assert all(a.variant.startswith("shift stage ") for a in main.alternatives[1:])
    for alt in main.alternatives:
        m = load_alternative(main, alt, check_files=True)
        assert m.path == (build / alt.manifest).absolute() and m.model_sha256 == main.model_sha256
        assert {d.name for d in m.devices} <= {d.name for d in main.devices}


def test_an_alternative_outside_the_build_folder_is_refused(copy, tmp_path):
    elsewhere = Path(shutil.copytree(copy / "alt-2", tmp_path / "elsewhere"))
    shutil.rmtree(copy / "alt-2")
    (copy / "alt-2").symlink_to(elsewhere, target_is_directory=True)  # the same bytes, reached through a link
    main = _main(copy)
    with pytest.raises(InputError) as err:
        load_alternative(main, main.alternatives[1])
    assert str(err.value) == (f"{main.path}: alternative alt-2/manifest.json: 'alt-2/manifest.json' is outside the "
                              f"build folder {main.folder}")


def test_a_changed_or_missing_alternative_is_refused(copy):
    main = _main(copy)
    changed = copy / "alt-1" / "manifest.json"
    changed.write_text(changed.read_text() + " ")
    with pytest.raises(InputError, match=r"alternative alt-1/manifest.json: alt-1/manifest.json sha256 mismatch; "
                                         "the file was changed after compiling"):
        load_alternative(main, main.alternatives[0])
    changed.unlink()
    with pytest.raises(InputError, match=r"alternative alt-1/manifest.json: cannot read alt-1/manifest.json .*"
                                         "compile again with --keep or --shifts"):
        load_alternative(main, main.alternatives[0])


def test_an_alternative_of_another_model_is_refused(copy, cluster):
    edgec.compile(MODELS / "tinyconv.onnx", cluster, copy / "other", strategy="pipeline")
    with pytest.raises(InputError, match=r"alternative other/manifest.json: plans another model \(sha256 "):
        load_alternative(_main(copy), _entry(copy, "other/manifest.json"))


def test_an_alternative_on_a_device_of_another_cluster_is_refused(copy, cluster):
    solo = cluster.parent / "solo.yaml"
    solo.write_text(json.dumps({"devices": [{"name": "solo", "profile": "fast.yaml"}]}))
    edgec.compile(TINY, solo, copy / "solo")
    with pytest.raises(InputError, match="alternative solo/manifest.json: names device 'solo', not in this manifest"):
        load_alternative(_main(copy), _entry(copy, "solo/manifest.json"))


def test_fragment_files_are_checked_as_asked(copy):
    main = _main(copy)
    alt = main.alternatives[1]
    fragment = sorted((copy / "alt-2").glob("*.onnx"))[0]
    fragment.write_bytes(fragment.read_bytes() + b"\0")
    load_alternative(main, alt)  # by default only that the files are there
    with pytest.raises(InputError, match=rf"fragment f\d: {fragment.name} sha256 mismatch"):
        load_alternative(main, alt, check_files=True)
    fragment.unlink()
    with pytest.raises(InputError, match=rf"file {fragment.name} not found"):
        load_alternative(main, alt)


@pytest.mark.parametrize("variant, problem", [
    (5, "alternatives[1].variant: expected a non-empty string"),
    ("", "alternatives[1].variant: expected a non-empty string"),
    (["shift"], "alternatives[1].variant: expected a non-empty string"),
])
def test_a_variant_that_is_not_a_string_is_refused(build, variant, problem):
    data = json.loads((build / "manifest.json").read_text())
    data["alternatives"][1]["variant"] = variant
    with pytest.raises(InputError) as err:
        parse_manifest(data, build / "manifest.json")
    assert str(err.value) == f"{build / 'manifest.json'}: {problem}"
    data["alternatives"][1]["variant"] = None  # null: as a --keep plan's absent key
    assert parse_manifest(data, build / "manifest.json").alternatives[1] == \
        replace(_main(build).alternatives[1], variant=None)
