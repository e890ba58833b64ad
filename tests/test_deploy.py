"""deploy/: the systemd unit passes `systemd-analyze verify` (where systemd-analyze exists) and the Dockerfile
parses, copies what exists in the checkout and runs `edgec worker` with options the device CLI accepts."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgec.runtime.front.cli import device_cli

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "deploy" / "edgec-worker.service"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
INSTALLED = "/opt/edgec/venv/bin/edgec"


def _worker_options_parse(args: list[str]) -> None:
    """The device CLI's `worker` accepts these options (parsed only: make_context stops before it runs)."""
    worker = device_cli.commands["worker"]
    ctx = worker.make_context("worker", list(args), resilient_parsing=False)
    assert ctx.params["listen"], args


def _exec_start() -> list[str]:
    (line,) = [ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart=")]
    return shlex.split(line.split("=", 1)[1])


def test_unit_runs_the_worker_with_options_it_accepts():
    argv = _exec_start()
    assert argv[0] == INSTALLED and argv[1] == "worker"
    _worker_options_parse(argv[2:])


def test_unit_passes_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here (apt-get install systemd provides it)")
    edgec = shutil.which("edgec")
    assert edgec, "the edgec command of this install"
    # verify checks that ExecStart's program exists: point it at this install's edgec instead of the venv
    # the unit expects on a device.
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(INSTALLED, edgec))
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    problems = [ln for ln in (proc.stdout + proc.stderr).splitlines() if UNIT.name in ln]
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr


def test_systemd_analyze_verify_catches_a_bad_unit(tmp_path):
    """The check above can fail: a bad value is reported on a line naming the unit."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(INSTALLED, shutil.which("edgec")).replace("Restart=on-failure",
                                                                                      "Restart=sometimes"))
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    assert any(UNIT.name in ln for ln in (proc.stdout + proc.stderr).splitlines())


def test_dockerfile_lints():
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(path=str(DOCKERFILE))
    instructions = [i for i in parser.structure if i["instruction"] != "COMMENT"]
    kinds = [i["instruction"] for i in instructions]
    assert kinds[0] == "FROM" and parser.baseimage.startswith("python:3.")
    assert {"USER", "ENTRYPOINT", "CMD", "STOPSIGNAL"} <= set(kinds)
    assert kinds.index("USER") < kinds.index("ENTRYPOINT")  # the worker does not run as root
    for copy in (i for i in instructions if i["instruction"] == "COPY"):
        *sources, _ = shlex.split(copy["value"])
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the checkout"
    for run in (i for i in instructions if i["instruction"] == "RUN"):
        for word in shlex.split(run["value"]):
            if word.startswith("/src/"):
                assert (ROOT / word[len("/src/"):]).exists(), f"RUN names {word}: not in the checkout"
    import json

    entry = json.loads(next(i["value"] for i in instructions if i["instruction"] == "ENTRYPOINT"))
    cmd = json.loads(next(i["value"] for i in instructions if i["instruction"] == "CMD"))
    assert entry == ["edgec", "worker"]
    _worker_options_parse(cmd)
    assert "--keys" in cmd  # it listens beyond loopback: the worker refuses that without keys


def test_device_distribution_provides_the_command_the_recipes_run():
    text = (ROOT / "runtime" / "dist" / "pyproject.toml").read_text()
    assert 'edgec = "edgec.runtime.front.cli:device_main"' in text
    result = CliRunner().invoke(device_cli, ["worker", "--help"])
    assert result.exit_code == 0
