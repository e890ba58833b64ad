"""A device that runs onnxruntime's OpenVINO execution provider, for real: a device-only environment (the
edgec-runtime wheel, runtime/dist) with OpenVINO's build of onnxruntime (`onnxruntime-openvino`, which cannot
share an environment with the stock wheel: both are the `onnxruntime` module) serves one device of a two-device
cluster on loopback, the other device a local worker of the stock build; `edgec run --verify` from this
environment checks the split against the CPU provider on the whole model; the device's profile is measured there
with `edgec profile --providers OpenVINOExecutionProvider`; a profile measured there with a model records which of
its nodes the CPU provider runs beside OpenVINO (`cpu_nodes:`) and the CPU provider's own figures (`cpu:`), and
the plan compiled with it verifies. Slow (a venv and a 440 MB package);
skipped when the package index cannot serve onnxruntime-openvino."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import edgec
from edgec.compiler.cluster import load_cluster, load_profile
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.manifest.load import file_sha256
from edgec.runtime.providers import TOLERANCE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
OPENVINO = "OpenVINOExecutionProvider"
# What the device's distribution needs beside onnxruntime (runtime/dist/pyproject.toml), installed with
# --no-deps so that pip does not add the stock onnxruntime next to OpenVINO's (onnx: its `profile` extra).
DEVICE_DEPS = ["onnx>=1.15", "numpy>=1.24", "pyzmq>=25", "msgpack>=1.0", "zstandard>=0.22", "lz4>=4.0", "click>=8.1", "rich>=13"]


def _pip(py: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(py), "-m", "pip", "install", "-q", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def openvino_device(tmp_path_factory) -> Path:
    """The `edgec` of a device-only venv whose onnxruntime is onnxruntime-openvino."""
    tmp = tmp_path_factory.mktemp("openvino")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    proc = _pip(py, "onnxruntime-openvino")
    if proc.returncode != 0:
        pytest.skip(f"onnxruntime-openvino is not installable here: {proc.stderr.strip().splitlines()[-1:]}")
    src = tmp / "src" / "runtime"
    shutil.copytree(ROOT / "runtime", src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    proc = _pip(py, "--no-deps", str(src / "dist"))
    assert proc.returncode == 0, proc.stderr
    proc = _pip(py, *DEVICE_DEPS)
    assert proc.returncode == 0, proc.stderr
    have = subprocess.run([str(py), "-c", "import onnxruntime as o; print(o.get_available_providers())"],
                          capture_output=True, text=True, check=True).stdout
    assert OPENVINO in have, have
    return venv / "bin" / "edgec"


@pytest.fixture
def worker(openvino_device, tmp_path):
    """An `edgec worker` of the OpenVINO venv on loopback; yields its address."""
    proc = subprocess.Popen([str(openvino_device), "worker", "--listen", "tcp://127.0.0.1:0", "--threads", "1",
                             "--cache", str(tmp_path / "cache")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"listening on (tcp://\S+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield m.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def openvino_profile(openvino_device, tmp_path_factory) -> Path:
    """`edgec profile --providers OpenVINOExecutionProvider` of the device's install (quick, 1 thread)."""
    out = tmp_path_factory.mktemp("ovprofile") / "ov.yaml"
    proc = subprocess.run([str(openvino_device), "profile", "--quick", "--threads", "1", "--providers", OPENVINO,
                           "-o", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_device_profiles_with_openvino_and_the_profile_says_so(openvino_profile):
    prof = load_profile(str(openvino_profile))
    assert prof.providers == (OPENVINO,)
    assert OPENVINO in prof.description and "CPU EP" not in prof.description
    assert prof.layout_conversions is False


def _cluster(tmp_path: Path, address: str, profile: Path) -> Path:
    f = tmp_path / "cluster.yaml"
    f.write_text(f"""devices:
  - name: ov
    profile: {profile}
    address: {address}
    providers: [{{{OPENVINO}: {{device_type: CPU}}}}]
  - name: cpu
    profile: {profile}
    address: local
network: {{bandwidth_mbps: 1000, latency_ms: 0.1}}
""")
    return f


def test_an_openvino_device_runs_its_fragments_and_the_split_verifies(worker, openvino_profile, tmp_path):
    build = tmp_path / "build"
    cluster = _cluster(tmp_path, worker, openvino_profile)
    assert load_cluster(cluster).device("ov").provider_note is None  # its profile was measured with OpenVINO
    edgec.compile(MODELS / "mobilenetv2.onnx", cluster, build, strategy="pipeline", objective="throughput")
    m = load_manifest(build / "manifest.json")
    assert m.device_fragments("ov") and m.device_fragments("cpu"), "the plan must use both devices"
    assert [p.name for p in m.device("ov").providers] == [OPENVINO]
    proc = subprocess.run([sys.executable, "-m", "edgec.runtime", str(build), "--random-inputs", "--verify",
                           "--json", "--timeout", "120"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    verify = json.loads(proc.stdout)["verify"]
    assert verify["passed"] is True and verify["tolerance"] == TOLERANCE[OPENVINO], verify



@pytest.fixture(scope="module")
def claims_profile(openvino_device, tmp_path_factory) -> Path:
    """`edgec profile --providers OpenVINOExecutionProvider,CPUExecutionProvider --quick --model mobilenetv2.onnx`
    of the device's install (1 thread)."""
    out = tmp_path_factory.mktemp("ovclaims") / "ov.yaml"
    proc = subprocess.run([str(openvino_device), "profile", "--quick", "--threads", "1", "--providers",
                           f"{OPENVINO},CPUExecutionProvider", "--model", str(MODELS / "mobilenetv2.onnx"),
                           "-o", str(out)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_device_records_which_nodes_the_cpu_runs_and_the_cpus_figures(claims_profile):
    prof = load_profile(str(claims_profile))
    sha = file_sha256(MODELS / "mobilenetv2.onnx")
    assert prof.providers == (OPENVINO, "CPUExecutionProvider")
    # OpenVINO takes MobileNetV2 whole (onnxruntime-openvino 1.24.1): the CPU provider runs none of its nodes
    assert prof.cpu_nodes == {sha: frozenset()}
    assert prof.cpu is not None and set(prof.cpu.figures(1).layers[sha]) == set(prof.layers[sha])
    assert sum(prof.layers[sha].values()) > 0 and sum(prof.cpu.top.layers[sha].values()) > 0


def test_the_claims_function_reads_openvinos_fallback_on_the_device(openvino_device):
    """The function the profile and the compiler use, run in the OpenVINO environment on the model whose trace
    tests/runtime/test_claims.py replays: the same nodes fall back to the CPU."""
    model = ROOT / "tests" / "runtime" / "data" / "openvino_fallback.onnx"
    code = ("import onnx, sys; from edgec.runtime.profile.claims import cpu_nodes; "
            "from edgec.runtime.providers import Provider; "
            f"print(sorted(cpu_nodes(onnx.load(sys.argv[1]), [Provider('{OPENVINO}', (('device_type', 'CPU'),)), "
            "Provider('CPUExecutionProvider')])))")
    proc = subprocess.run([str(openvino_device.parent / "python"), "-c", code, str(model)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted(["conv1", "relu1", "conv2", "mish", "flatten", "hardmax"]))


def test_a_plan_priced_with_the_claims_verifies_on_an_openvino_worker(worker, claims_profile, tmp_path, caplog):
    build = tmp_path / "build"
    cluster = _cluster(tmp_path, worker, claims_profile)
    with caplog.at_level("WARNING"):
        edgec.compile(MODELS / "mobilenetv2.onnx", cluster, build, strategy="pipeline", objective="throughput")
    assert not [r for r in caplog.records if "leaves to the CPU" in r.getMessage() or "no cpu:" in r.getMessage()]
    m = load_manifest(build / "manifest.json")
    assert m.device_fragments("ov") and m.device_fragments("cpu"), "the plan must use both devices"
    proc = subprocess.run([sys.executable, "-m", "edgec.runtime", str(build), "--random-inputs", "--verify",
                           "--json", "--timeout", "120"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    verify = json.loads(proc.stdout)["verify"]
    assert verify["passed"] is True and verify["tolerance"] == TOLERANCE[OPENVINO], verify
