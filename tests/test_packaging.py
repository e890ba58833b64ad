"""Packaging: one import package `edgec`, profiles shipped as package data, and a device-only
distribution (runtime/dist) that carries the runtime and nothing of the compiler."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import edgec
from edgec.compiler import cluster

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"compiler": "edgec.compiler", "runtime": "edgec.runtime", "models": "edgec.models"}


def _pyproject(path: Path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def test_every_source_package_is_listed():
    """A subpackage missing from pyproject's explicit list would be left out of the wheel."""
    listed = set(_pyproject(ROOT / "pyproject.toml")["tool"]["setuptools"]["packages"])
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            if rel and rel[0] in ("_root", "dist"):
                continue
            found.add(".".join((name, *rel)))
    assert found | {"edgec", "edgec.profiles"} == listed


def test_one_top_level_package():
    dist = metadata.distribution("edgec")
    assert dist.read_text("top_level.txt").split() == ["edgec"]


def test_profiles_ship_with_the_package():
    names = cluster.available_profiles()
    assert {"rpi4", "rpi5", "jetson-orin-nano", "phone", "laptop", "edge-server"} <= set(names)
    shipped = Path(edgec.__file__).resolve().parent / "profiles"
    if shipped.is_dir():  # a normal install: the profiles beside the package, not in the checkout
        assert cluster.profiles_dir().resolve() == shipped


def test_declared_dependencies_are_imported():
    """A declared dependency that nothing imports is a defect."""
    deps = _pyproject(ROOT / "pyproject.toml")["project"]["dependencies"]
    modules = {"onnxruntime": "onnxruntime", "numpy": "numpy", "pyzmq": "zmq", "msgpack": "msgpack",
               "click": "click", "onnx": "onnx", "PyYAML": "yaml", "onnx-graphsurgeon": "onnx_graphsurgeon",
               "networkx": "networkx", "ortools": "ortools", "rich": "rich", "zstandard": "zstandard",
               "lz4": "lz4", "pydantic": "pydantic", "matplotlib": "matplotlib"}
    sources = "\n".join(p.read_text(encoding="utf-8") for f in FOLDERS for p in (ROOT / f).rglob("*.py"))
    for dep in deps:
        name = dep.split(">")[0].split("=")[0].split("[")[0].strip()
        module = modules[name]
        assert f"import {module}" in sources or f"from {module}" in sources, f"{name} is declared, never imported"


@pytest.mark.slow
def test_device_distribution_holds_only_the_runtime(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path),
                           str(ROOT / "runtime" / "dist")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("edgec_runtime-*.whl")
    names = [n for n in zipfile.ZipFile(wheel).namelist() if not n.split("/")[0].endswith(".dist-info")]
    assert "edgec/__init__.py" in names and "edgec/runtime/worker.py" in names
    assert all(n == "edgec/__init__.py" or n.startswith("edgec/runtime/") for n in names), names
    meta = _pyproject(ROOT / "runtime" / "dist" / "pyproject.toml")["project"]["dependencies"]
    assert not [d for d in meta if d.split(">")[0] in ("onnx", "PyYAML", "ortools", "networkx", "onnx-graphsurgeon")]
