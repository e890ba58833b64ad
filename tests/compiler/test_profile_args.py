"""`edgec profile` checks every argument before it measures anything: one line, exit 2, nothing created.
The measuring entry point is replaced by one that fails the test if called (no benchmark runs here)."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest
import yaml
from click.testing import CliRunner

import edgec.runtime.profile.measure as profile_pkg
from edgec.compiler.cli import cli
from edgec.compiler.cluster import profiles_dir
from edgec.compiler.errors import UserError
from edgec.compiler.profile import write_profile
from tests.conftest import conv_chain_model


@pytest.fixture
def measured(monkeypatch):
    """measure_host replaced: records its calls and returns a shipped profile (a real one, so the write
    that follows is the real write)."""
    calls = []

    def fake(**kwargs):
        calls.append(kwargs)
        return yaml.safe_load((profiles_dir() / "rpi5.yaml").read_text())

    monkeypatch.setattr(profile_pkg, "measure_host", lambda *a, **k: fake(**k))
    return calls


def profile(*args):
    return CliRunner().invoke(cli, ["profile", *map(str, args)], prog_name="edgec")


def refused(res, measured) -> str:
    assert res.exit_code == 2, res.output
    assert measured == [], "measured before refusing"
    assert "Traceback" not in res.output and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgec: "), res.stderr
    return lines[0]


def test_valid_arguments_reach_the_measurement_and_the_profile_is_written(tmp_path, measured):
    model = tmp_path / "m.onnx"
    onnx.save(conv_chain_model(n=2), model)
    res = profile("-o", tmp_path / "p.yaml", "--model", model, "--power-idle", "2", "--power-busy", "5")
    assert res.exit_code == 0, res.output
    assert len(measured) == 1 and measured[0]["model_path"] == str(model)
    assert yaml.safe_load((tmp_path / "p.yaml").read_text())["name"] == "rpi5"


def test_an_output_folder_that_does_not_exist_is_refused_not_created(tmp_path, measured):
    target = tmp_path / "nonexistent" / "dir" / "p.yaml"
    line = refused(profile("-o", target), measured)
    assert line == f"edgec: {target}: folder '{target.parent}' does not exist (create it first)"
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any folder")
def test_an_output_folder_that_cannot_be_written_is_refused(tmp_path, measured):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        assert "permission denied" in refused(profile("-o", folder / "p.yaml"), measured)
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("content,needle", [
    (b"garbage, not protobuf", "not an ONNX model"),
    (None, "no such ONNX file"),
    (b"", "not an ONNX model with a graph (no nodes)"),
])
def test_a_model_that_is_not_one_is_refused_before_measuring(tmp_path, measured, content, needle):
    model = tmp_path / "m.onnx"
    if content is not None:
        model.write_bytes(content)
    line = refused(profile("-o", tmp_path / "p.yaml", "--model", model), measured)
    assert line.startswith(f"edgec: {model}: ") and needle in line, line
    assert not (tmp_path / "p.yaml").exists()


def test_a_model_onnxruntime_refuses_is_refused_before_measuring(tmp_path, measured):
    m = conv_chain_model(n=2)
    m.graph.node[0].input[0] = "r1"  # a cycle
    model = tmp_path / "m.onnx"
    onnx.save(m, model)
    line = refused(profile("-o", tmp_path / "p.yaml", "--model", model), measured)
    assert "onnxruntime cannot load the model" in line and "acyclic" in line


def test_repeated_node_names_are_measured_under_unique_keys_so_they_pass(tmp_path, measured):
    m = conv_chain_model(n=2)
    m.graph.node[1].name = m.graph.node[0].name
    model = tmp_path / "m.onnx"
    onnx.save(m, model)
    assert profile("-o", tmp_path / "p.yaml", "--model", model).exit_code == 0
    assert len(measured) == 1


@pytest.mark.parametrize("args,needle", [
    (["--power-idle", "5", "--power-busy", "2"], "--power-busy 2 is below --power-idle 5"),
    (["--power-idle", "0"], "'--power-idle'"),
    (["--threads", "0"], "'--threads'"),
    (["--threads", "1,x"], "'--threads'"),
])
def test_bad_options_are_refused_before_measuring(tmp_path, measured, args, needle):
    assert needle in refused(profile("-o", tmp_path / "p.yaml", *args), measured)


def test_write_profile_does_not_create_folders(tmp_path):
    doc = yaml.safe_load((profiles_dir() / "rpi5.yaml").read_text())
    with pytest.raises(UserError, match="does not exist"):
        write_profile(doc, tmp_path / "a" / "b" / "p.yaml")
    assert not (tmp_path / "a").exists()


def test_refine_checks_its_output_folder_too(tmp_path):
    res = profile("--refine", tmp_path / "report.json", "-o", tmp_path / "no" / "p.yaml")
    assert res.exit_code == 2 and "does not exist" in res.stderr, res.output
    assert not Path(tmp_path / "no").exists()


# --- warnings: one short line each, the whole text with --verbose ---------------------------------------------

LONG = ("spread stayed above 10% for 30 timings; those figures may be off: "
        + ", ".join(f"gflops.conv at {k} thr (14%)" for k in range(30)) + " (measurement.warnings says more)")


def test_a_long_warning_is_one_short_line_and_its_whole_text_a_detail(caplog):
    import logging

    from edgec.runtime.profile.measure import SHORT, warn

    with caplog.at_level(logging.INFO, logger="edgec.runtime.profile"):
        warn(LONG)
        warn("the machine is busy")
    (head, short), (detail,) = ([r.getMessage() for r in caplog.records if r.levelno == logging.WARNING],
                                [r.getMessage() for r in caplog.records if r.levelno == logging.INFO])
    assert head == "spread stayed above 10% for 30 timings; those figures may be off (more with --verbose)"
    assert len(head) <= SHORT and short == "the machine is busy" and detail == LONG


FAKE_PROFILE = """
import sys, yaml
import edgec.runtime.profile.measure as p
from edgec.compiler.cluster import profiles_dir
from edgec.runtime.profile.measure import warn
def fake(**kwargs):
    warn({long!r})
    return yaml.safe_load((profiles_dir() / "rpi5.yaml").read_text())
p.measure_host = lambda *a, **k: fake(**k)
from edgec.compiler.cli import main
sys.argv = ["edgec", "profile", "-o", {out!r}, *{extra!r}]
main()
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_the_command_prints_the_short_line_and_with_verbose_the_detail(tmp_path, verbose):
    import subprocess
    import sys

    code = FAKE_PROFILE.format(long=LONG, out=str(tmp_path / "p.yaml"), extra=["--verbose"] if verbose else [])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "spread stayed" in ln]
    head = "edgec: warning: spread stayed above 10% for 30 timings; those figures may be off (more with --verbose)"
    assert lines == ([head, f"edgec:   {LONG}"] if verbose else [head])
