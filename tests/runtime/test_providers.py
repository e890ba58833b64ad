"""Execution providers per device: the manifest's `providers`, the executor's sessions, the worker's list at
the handshake, and the one-line refusal of a plan whose device needs a provider its onnxruntime lacks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from edgec.runtime.coordinator.pool import WorkerPool
from edgec.runtime.device.executor import Executor
from edgec.runtime.errors import InputError
from edgec.runtime.manifest.load import load_manifest, manifest_json
from edgec.runtime.manifest.parse import build_manifest
from edgec.runtime.providers import CPU, CPU_ONLY, DEFAULT_TOLERANCE, TOLERANCE, Provider, tolerance_of
from edgec.runtime.wire.protocol import PROTOCOL_VERSION
from edgec.runtime.manifest.load import file_sha256

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
ABSENT = "CUDAExecutionProvider"  # the stock onnxruntime wheel (CPU) has no CUDA
assert ABSENT not in ort.get_available_providers()


def _edgec(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgec.runtime", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_a_manifest_without_providers_loads_as_cpu_only(chain):
    m = load_manifest(chain.path)
    assert all(d.providers == CPU_ONLY for d in m.devices)
    assert b'"providers"' not in manifest_json(m)  # and is written back without the key


def test_providers_round_trip_through_the_json_sent_to_workers(chain):
    doc = chain.copy_manifest()
    doc["devices"][0]["providers"] = [{"name": "OpenVINOExecutionProvider", "options": {"device_type": "CPU"}},
                                      {"name": CPU}]
    chain.manifest = doc
    m = load_manifest(chain.write())
    want = (Provider("OpenVINOExecutionProvider", (("device_type", "CPU"),)), Provider(CPU))
    assert m.devices[0].providers == want and m.devices[1].providers == CPU_ONLY
    again, _ = build_manifest(json.loads(manifest_json(m)), chain.path)
    assert again.devices[0].providers == want


@pytest.mark.parametrize("bad, message", [
    ([], "devices[0].providers: expected a non-empty list"),
    ("CPUExecutionProvider", "devices[0].providers: expected a non-empty list"),
    ([{"name": CPU}, {"name": CPU}], "devices[0].providers: 'CPUExecutionProvider' is listed twice"),
    ([{"name": CPU, "opts": {}}], "devices[0].providers[0]: unknown key 'opts'"),
    ([{"name": CPU, "options": {"a": 1}}], "devices[0].providers[0].options: expected an object of strings"),
    ([{"options": {}}], "devices[0].providers[0]: missing key 'name'"),
])
def test_bad_providers_in_a_manifest_are_one_line(chain, bad, message):
    doc = chain.copy_manifest()
    doc["devices"][0]["providers"] = bad
    with pytest.raises(InputError, match=r"manifest\.json: " + re.escape(message)):
        build_manifest(doc, chain.path)


def test_the_executor_creates_sessions_with_the_devices_providers(chain):
    doc = chain.copy_manifest()
    doc["devices"][0]["providers"] = [{"name": CPU}]
    chain.manifest = doc
    ex = Executor(load_manifest(chain.write()), "pi5-a", threads=1)
    ex.load()
    assert ex.sessions["f0"].get_providers() == [CPU]


def test_the_executor_refuses_a_provider_this_onnxruntime_lacks(chain):
    """The worker's own check: onnxruntime alone would warn and run the fragment on the CPU."""
    doc = chain.copy_manifest()
    doc["devices"][0]["providers"] = [{"name": ABSENT}, {"name": CPU}]
    chain.manifest = doc
    ex = Executor(load_manifest(chain.write()), "pi5-a", threads=1)
    with pytest.raises(InputError, match=f"^device pi5-a: the plan needs {ABSENT}, which this onnxruntime does not "
                                         "have"):
        ex.load()
    assert not ex.sessions


def _welcome(providers) -> dict:
    return {"t": "welcome", "protocol": PROTOCOL_VERSION, "edgec": "test", "pid": 1, "threads": 1, "cores": 1,
            "key": None, "providers": providers}


def test_the_coordinator_refuses_a_worker_without_the_provider_at_its_welcome(chain):
    doc = chain.copy_manifest()
    doc["devices"][1]["providers"] = [{"name": "OpenVINOExecutionProvider"}]
    chain.manifest = doc
    pool = WorkerPool(load_manifest(chain.write()), timeout=5)
    w = pool.workers["pi4-a"]
    with pytest.raises(InputError, match=r"^device pi4-a \(.*\): the plan needs OpenVINOExecutionProvider, which "
                                         r"this onnxruntime does not have \(it has CPUExecutionProvider\)"):
        pool._on_welcome(w, _welcome([CPU]), None)
    assert w.phase == "connecting"
    pool._on_welcome(w, _welcome(["OpenVINOExecutionProvider", CPU]), None)
    assert w.phase == "welcomed"
    w2 = pool.workers["pi5-a"]
    with pytest.raises(InputError, match="the worker's welcome is malformed .*'providers' missing"):
        pool._on_welcome(w2, {k: v for k, v in _welcome([CPU]).items() if k != "providers"}, None)


def test_a_local_worker_without_the_provider_is_refused_in_one_line(chain):
    """`edgec run` with a local worker: exit 2, one line naming the device and the provider, no output written."""
    doc = chain.copy_manifest()
    doc["devices"][1]["providers"] = [{"name": ABSENT}, {"name": CPU}]
    chain.manifest = doc
    chain.write()
    out = chain.folder / "out.npz"
    proc = _edgec(chain.path, "--random-inputs", "--verify", "--output", out, "--timeout", "60")
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("edgec: ") and "verifying" not in ln]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("edgec: device pi4-a (local worker at tcp://127.0.0.1:")
    assert f"the plan needs {ABSENT}, which this onnxruntime does not have" in lines[0]
    assert not out.exists()


def test_tolerance_per_provider_is_the_largest_of_the_devices():
    assert tolerance_of(CPU_ONLY) == TOLERANCE[CPU] == 1e-4
    assert tolerance_of((Provider("OpenVINOExecutionProvider"), Provider(CPU))) == TOLERANCE["OpenVINOExecutionProvider"]
    assert tolerance_of((Provider("SomeNewExecutionProvider"),)) == 1e-2


def test_the_docs_state_the_tolerance_table_of_the_code():
    """docs/how-to/providers.md states the table; the code holds it (runtime/providers.py): they must agree."""
    text = (REPO / "docs" / "how-to" / "providers.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| (\w+ ?\w*) \| ([0-9e.-]+) \|$", text, re.M))
    assert float(rows.pop("any other")) == DEFAULT_TOLERANCE
    assert {k: float(v) for k, v in rows.items()} == TOLERANCE


@pytest.mark.parametrize("args, message", [
    (["--providers", ABSENT], f"edgec: --providers: this onnxruntime does not have {ABSENT} (it has "),
    (["--providers", "CUDA"], "Invalid value for '--providers': 'CUDA': expected distinct onnxruntime provider names"),
    (["--providers", f"{CPU},{CPU}"], "Invalid value for '--providers'"),
])
def test_profile_providers_refuses_bad_input_in_one_line_before_measuring(tmp_path, args, message):
    out = tmp_path / "p.yaml"
    proc = subprocess.run([sys.executable, "-m", "edgec.compiler", "profile", "--quick", *args, "-o", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not out.exists()


def test_profile_providers_with_a_model_records_the_cpu_nodes_and_the_cpu_figures(monkeypatch):
    """`edgec profile --providers ... --model`: the stock build's AzureExecutionProvider (a real provider that
    takes no node) leaves every node to the CPU, which the profile records (`cpu_nodes:`) beside the CPU
    provider's own figures (`cpu:`); the compiler's schema loads it. Timings scripted: nothing is timed."""
    from tests.compiler.profile_scripted import script_runtime_costs, script_timings
    from tests.compiler.test_profile_stability import ScriptedProbe

    from edgec.compiler.cluster import validate_profile_dict
    from edgec.runtime.profile import measure
    from edgec.runtime.profile.nodes import node_keys

    azure = "AzureExecutionProvider"
    assert azure in ort.get_available_providers()
    script_timings(monkeypatch)
    script_runtime_costs(monkeypatch)
    model = MODELS / "tinychain.onnx"
    prof = measure.measure_host(model_path=str(model), providers=[azure, CPU], quick=True, threads=1,
                                probe=ScriptedProbe(0.0))
    digest = file_sha256(model)
    keys = node_keys(onnx.load(str(model)))
    assert prof["providers"] == [azure, CPU]
    assert prof["cpu_nodes"] == {digest: sorted(keys)}
    assert set(prof["cpu"]) >= {"op_overhead_us", "gflops", "memory_gbps", "layers", "threads"}
    assert set(prof["cpu"]["layers"][digest]) == set(keys) and set(prof["layers"][digest]) == set(keys)
    loaded = validate_profile_dict(prof, "p.yaml")
    assert loaded.cpu_nodes == {digest: frozenset(keys)}
    assert loaded.cpu.figures(1).gflops == prof["cpu"]["threads"][1]["gflops"]
