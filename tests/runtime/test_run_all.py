"""edgec run-all: an allocation's builds run at once on their own (local) devices, verified, each measured
against its SLA; allocation.json read strictly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgec.compiler.cli import cli
from edgec.runtime.errors import InputError
from edgec.runtime.front.runall import load_allocation, run_all
from tests.runtime.procs import local_workers

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])


@pytest.fixture(scope="module")
def allocation(tmp_path_factory) -> Path:
    """tinychain and tinyconv on a device each (built once: the tests below copy what they change)."""
    from edgec.compiler.allocate import allocate

    tmp = tmp_path_factory.mktemp("alloc")
    (tmp / "cluster.yaml").write_text("devices:\n  - {name: a, profile: rpi5}\n  - {name: b, profile: rpi5}\n"
                                      "network: {bandwidth_mbps: 100, latency_ms: 1}\n")
    (tmp / "services.yaml").write_text(
        f"services:\n  - {{name: chain, model: {MODELS / 'tinychain.onnx'}, sla_ms: 1000}}\n"
        f"  - {{name: conv, model: {MODELS / 'tinyconv.onnx'}, sla_ms: 1000}}\n")
    allocate(tmp / "services.yaml", tmp / "cluster.yaml", tmp / "out")
    return tmp / "out"


def _edit(src: Path, dst: Path, change) -> Path:
    import shutil

    shutil.copytree(src, dst)
    data = json.loads((dst / "allocation.json").read_text())
    change(data)
    (dst / "allocation.json").write_text(json.dumps(data))
    return dst


def test_services_run_at_once_verified_against_their_sla(allocation, tmp_path):
    # conv's SLA made unmeetable: its miss is reported, chain's generous one met.
    out = _edit(allocation, tmp_path / "out", lambda d: d["services"]["conv"].update(sla_ms=1e-6))
    got = run_all(out, repeat=2, verify=True, warmup=3)
    assert got["verify_passed"] is True and got["all_sla_met"] is False and got["warmup"] == 3
    chain, conv = got["services"]["chain"], got["services"]["conv"]
    assert chain["sla_met"] is True and conv["sla_met"] is False
    assert len(chain["latencies_ms"]) == len(conv["latencies_ms"]) == 2
    assert chain["verify"]["passed"] and conv["verify"]["passed"]
    # the warm-up requests ran (untimed) and their outputs were checked too
    assert chain["verify"]["requests_checked"] == conv["verify"]["requests_checked"] == 3 + 2
    assert set(chain["devices"]).isdisjoint(conv["devices"])


def test_cli_json(allocation):
    res = CliRunner().invoke(cli, ["run-all", str(allocation), "--json", "--warmup", "0", "--verify"],
                             prog_name="edgec")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert set(got["services"]) == {"chain", "conv"} and got["all_sla_met"] in (True, False)
    assert got["warmup"] == 0 and got["services"]["chain"]["verify"]["requests_checked"] == 1


@pytest.mark.parametrize("value", ["-1", "1001", "x"])
def test_cli_bad_warmup_is_one_line(allocation, value):
    res = CliRunner().invoke(cli, ["run-all", str(allocation), "--warmup", value], prog_name="edgec")
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1 and "--warmup" in res.stderr, res.output


@pytest.mark.parametrize("value", [-1, 1001, True, 1.5])
def test_api_bad_warmup_is_refused(allocation, value):
    with pytest.raises(InputError, match="warmup"):
        run_all(allocation, warmup=value)


@pytest.mark.parametrize("change, expected", [
    (lambda d: d.update(extra=1), "unknown key 'extra' in allocation"),
    (lambda d: d["services"]["conv"].pop("sla_ms"), "missing key 'sla_ms' in services['conv']"),
    (lambda d: d["services"]["conv"].update(sla_ms=-1), "services['conv'].sla_ms must be a positive number"),
    (lambda d: d["services"]["conv"].update(devices=d["services"]["chain"]["devices"]), "is given to both"),
    (lambda d: d["services"]["conv"].update(manifest="../x/manifest.json"), "must stay inside"),
    (lambda d: d.update(format="other"), "format must be 'edgec-allocation/1'"),
])
def test_allocation_errors_are_one_line(allocation, tmp_path, change, expected):
    out = _edit(allocation, tmp_path / "out", change)
    with pytest.raises(InputError, match=expected.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        load_allocation(out)
    res = CliRunner().invoke(cli, ["run-all", str(out)], prog_name="edgec")
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1 and expected in res.stderr, res.output


def test_a_build_on_devices_not_given_is_refused(allocation, tmp_path):
    out = _edit(allocation, tmp_path / "out", lambda d: d["services"]["conv"].update(devices=["z"]))
    with pytest.raises(InputError, match="does not give to 'conv'"):
        run_all(out)


def test_services_share_a_device_with_a_worker_each(tmp_path):
    from edgec.compiler.allocate import allocate

    (tmp_path / "cluster.yaml").write_text("devices:\n  - {name: a, profile: rpi5}\n"
                                           "network: {bandwidth_mbps: 100, latency_ms: 1}\n")
    (tmp_path / "services.yaml").write_text(
        f"services:\n  - {{name: chain, model: {MODELS / 'tinychain.onnx'}, sla_ms: 1000}}\n"
        f"  - {{name: conv, model: {MODELS / 'tinyconv.onnx'}, sla_ms: 1000}}\n")
    allocate(tmp_path / "services.yaml", tmp_path / "cluster.yaml", tmp_path / "out", share=True)
    got = run_all(tmp_path / "out", repeat=2, verify=True)
    assert got["verify_passed"] is True
    assert got["services"]["chain"]["devices"] == got["services"]["conv"]["devices"] == ["a"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigterm_closes_every_service_and_leaves_no_worker(allocation):
    import signal
    import subprocess
    import sys
    import threading
    import time

    proc = subprocess.Popen([sys.executable, "-m", "edgec.compiler", "run-all", str(allocation), "--repeat", "100000000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # never a full pipe
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not all(any(ln.startswith(f"edgec: {n}: request ") for ln in list(lines)) for n in ("chain", "conv")):
            assert proc.poll() is None and time.monotonic() < deadline, lines[-5:]
            time.sleep(0.05)
        workers = local_workers(proc.pid)
        assert len(workers) == 2  # a local worker per device
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        # gone when run-all ends: each service closed its own workers, none left to a parent-death signal
        assert not [w for w in workers if _alive(w)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    # each service unwound its own run (no thread still printing) before the process reported the signal
    assert lines[-1].strip() == "edgec: interrupted by SIGTERM", lines[-5:]
    stopped = [ln.strip() for ln in lines if ln.endswith("stopped (its workers closed)\n")]
    assert sorted(stopped) == ["edgec: chain: stopped (its workers closed)", "edgec: conv: stopped (its workers closed)"]
