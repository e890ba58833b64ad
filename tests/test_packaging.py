"""Packaging: one import package `edgec`, profiles shipped as package data, and a device-only
distribution (runtime/dist) that carries the runtime and nothing of the compiler."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import edgec
from edgec import models
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


def test_the_device_distribution_lists_every_runtime_package():
    """runtime/dist lists its packages too: a runtime room missing there would be left out of a device's wheel."""
    listed = set(_pyproject(ROOT / "runtime" / "dist" / "pyproject.toml")["tool"]["setuptools"]["packages"])
    found = {".".join(("edgec.runtime", *init.parent.relative_to(ROOT / "runtime").parts))
             for init in (ROOT / "runtime").rglob("__init__.py") if "dist" not in init.relative_to(ROOT).parts}
    assert {"edgec.runtime.wire", "edgec.runtime.coordinator"} <= found
    assert found | {"edgec"} == listed


def test_repository_folders_beside_the_package_do_not_install():
    """docs/, examples/, benchmarks/ and deploy/ stay in the checkout: no package maps to them, and an installed
    edgec has none of them (nor a top-level package of that name)."""
    project = _pyproject(ROOT / "pyproject.toml")["tool"]["setuptools"]
    outside = ("docs", "examples", "benchmarks", "deploy")
    assert not [d for d in project["package-dir"].values() if d.split("/")[0] in outside]
    assert not [p for p in project["packages"] if p.split(".")[-1] in outside]
    installed = Path(edgec.__file__).resolve().parent
    assert not [f for f in outside if (installed / f).exists()]
    files = metadata.distribution("edgec").files or []
    assert not [f for f in files if str(f).split("/")[0] in outside], "a repository folder was installed"


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


def _device_wheel(tmp_path: Path) -> Path:
    """The edgec-runtime wheel, built from a copy of runtime/ (setuptools leaves its build folder beside
    the project it builds: not in the checkout)."""
    src = tmp_path / "src" / "runtime"
    shutil.copytree(ROOT / "runtime", src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "wheel"),
                           str(src / "dist")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "wheel").glob("edgec_runtime-*.whl")
    return wheel


@pytest.mark.slow
def test_device_distribution_runs_a_build_without_the_compiler(tmp_path):
    """A device installs edgec-runtime alone (a fresh venv, no compiler dependencies) and its `edgec run`
    runs and verifies a build that the full distribution compiled."""
    wheel = _device_wheel(tmp_path)
    names = [n for n in zipfile.ZipFile(wheel).namelist() if not n.split("/")[0].endswith(".dist-info")]
    assert "edgec/__init__.py" in names and "edgec/runtime/device/worker.py" in names
    sources = {f"edgec/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / "runtime").rglob("*.py")
               if "dist" not in p.relative_to(ROOT).parts}
    assert sources <= set(names), sorted(sources - set(names))  # every room of the runtime
    assert all(n == "edgec/__init__.py" or n.startswith("edgec/runtime/") for n in names), names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py, cli = venv / "bin" / "python", venv / "bin" / "edgec"
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr
    installed = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                               check=True).stdout.lower()
    # the planner's dependencies stay off the device (rich, pure Python, draws `edgec run`'s progress bar there)
    for heavy in ("onnx==", "pyyaml", "ortools", "networkx", "onnx-graphsurgeon", "pydantic"):
        assert f"\n{heavy}" not in f"\n{installed}", f"{heavy} installed on the device"
    assert subprocess.run([str(py), "-c", "import edgec.compiler"], capture_output=True).returncode != 0

    build = tmp_path / "build"
    edgec.compile(models.ensure("tinychain"), ROOT / "tests" / "e2e" / "clusters" / "two.yaml", build,
                  strategy="pipeline")
    proc = subprocess.run([str(cli), "run", str(build), "--random-inputs", "--verify", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verify"]["passed"] is True
    meta = _pyproject(ROOT / "runtime" / "dist" / "pyproject.toml")["project"]["dependencies"]
    assert not [d for d in meta if d.split(">")[0] in ("onnx", "PyYAML", "ortools", "networkx", "onnx-graphsurgeon")]

    _device_profiles(tmp_path, wheel, py, cli)


def _device_profiles(tmp_path: Path, wheel: Path, py: Path, cli: Path) -> None:
    """The device's `edgec profile`: without onnx (which builds its benchmark models) one line naming the extra
    and exit 2; with the `profile` extra it measures, still without the planner's dependencies, and writes a
    profile that the compiler loads."""
    out = tmp_path / "device-profile.yaml"
    argv = [str(cli), "profile", "--quick", "--threads", "1", "-o", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "edgec-runtime[profile]" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()

    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", f"{wheel}[profile]"], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    installed = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                               check=True).stdout.lower()
    assert "\nonnx==" in f"\n{installed}"
    for heavy in ("pyyaml", "ortools", "networkx", "onnx-graphsurgeon", "pydantic"):
        assert f"\n{heavy}" not in f"\n{installed}", f"{heavy} installed on the device with the profile extra"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(out)
    prof = cluster.load_profile(str(out))  # validated by the compiler's schema, here
    assert set(prof.threads) == {1} and prof.figures(1).gflops["conv"] > 0
