"""What edgec swaps into place for the user gets the mode the user's umask gives, not tempfile's private 0600/0700
(a build folder only its owner can read cannot be copied to the devices by a deploy user)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from edgec.compiler.api import compile as compile_model
from edgec.compiler.cluster.profile import profiles_dir
from edgec.compiler.profile.output import write_profile
from edgec.runtime.files import default_mode, write_atomically

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = Path(__file__).parent / "e2e" / "clusters"


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_default_mode_follows_the_umask(umask):
    assert default_mode() == 0o666 & ~umask
    assert default_mode(folder=True) == 0o777 & ~umask


def test_runtime_files_are_not_private(tmp_path, umask):
    target = tmp_path / "out.json"
    write_atomically(target, "the report", lambda fh: fh.write(b"{}"))
    assert mode(target) == 0o666 & ~umask


def test_a_build_folder_is_not_private(tmp_path, umask):
    out = tmp_path / "build"
    compile_model(MODELS / "tinychain.onnx", CLUSTERS / "two.yaml", out, strategy="pipeline")
    assert mode(out) == 0o777 & ~umask
    assert mode(out / "manifest.json") == 0o666 & ~umask


def test_a_profile_is_not_private(tmp_path, umask):
    doc = yaml.safe_load((profiles_dir() / "rpi5.yaml").read_text())
    target = tmp_path / "p.yaml"
    write_profile(doc, target)
    assert mode(target) == 0o666 & ~umask


def test_an_allocation_folder_is_not_private(tmp_path, umask):
    from edgec.compiler.allocate import allocate
    from tests.compiler.test_allocate import _two, cluster_file

    out = tmp_path / "alloc"
    allocate(_two(tmp_path), cluster_file(tmp_path, [("a", "rpi5"), ("b", "rpi4")]), out)
    assert mode(out) == 0o777 & ~umask
    assert mode(out / "allocation.json") == 0o666 & ~umask
