"""The compiler CLI on bad input: one line and exit 2, the user's files never lost, nothing half-written;
usage errors, a closed stdout and SIGTERM handled; --help shows every default."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from edgec import models
from edgec.compiler.cli import cli
from edgec.compiler.emit import EmittedFragment, EncodedModel, write_output
from edgec.compiler.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
TWO = ROOT / "tests/e2e/clusters/two.yaml"
FOUR = ROOT / "tests/e2e/clusters/four.yaml"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="edgec")


def one_line(res) -> str:
    """The error line of a failed command (exit 2): the last on stderr, after any progress lines."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert "Traceback" not in res.stderr and res.stdout == "", res.output
    last = res.stderr.splitlines()[-1]
    assert last.startswith("edgec: "), res.stderr
    return last


def usage_line(res) -> str:
    """A usage error: exactly one line on stderr."""
    assert len(res.stderr.splitlines()) == 1, res.stderr
    return one_line(res)


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def compile_tiny(out, *extra):
    return invoke("compile", models.ensure("tinychain"), "--devices", TWO, "-o", out, *extra)


def test_output_dot_is_the_current_folder(tmp_path, monkeypatch):
    here = tmp_path / "build"
    here.mkdir()
    monkeypatch.chdir(here)
    res = compile_tiny(".")
    assert res.exit_code == 0, res.output
    assert (here / "manifest.json").is_file()
    monkeypatch.chdir(here)  # the build was swapped in: "." is a new folder (as for a shell in it)
    res = compile_tiny(".", "--strategy", "even")  # an earlier build there: replaced
    assert res.exit_code == 0, res.output
    assert sorted(os.listdir(tmp_path)) == ["build"]  # no temporary or old folder beside it
    monkeypatch.chdir(here)
    (here / "notes.txt").write_text("mine")
    assert "'notes.txt'" in one_line(compile_tiny("."))
    assert (here / "notes.txt").read_text() == "mine"


def test_an_earlier_build_with_a_foreign_file_is_refused_and_untouched(tmp_path):
    out = tmp_path / "out"
    assert compile_tiny(out, "--strategy", "even").exit_code == 0
    (out / "results.csv").write_text("a,b\n")
    before = digest(out)
    line = one_line(compile_tiny(out, "--strategy", "single"))
    assert str(out) in line and "'results.csv'" in line and "refusing" in line
    assert digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_folder_in_an_earlier_build_is_foreign(tmp_path):
    out = tmp_path / "out"
    assert compile_tiny(out).exit_code == 0
    (out / "plots").mkdir()
    assert "'plots'" in one_line(compile_tiny(out))
    assert (out / "plots").is_dir()


def custom_op_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Foo", ["c"], ["f"], domain="com.example"),
             helper.make_node("Relu", ["f"], ["y"])]
    shape = [1, 4, 8, 8]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], initializer=[w],
                              value_info=[helper.make_tensor_value_info(t, TensorProto.FLOAT, shape) for t in "cf"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    return model


def test_a_fragment_onnxruntime_cannot_load_is_refused_before_writing(tmp_path):
    """ingest refuses custom domains up front; write_output checks every fragment it is given anyway."""
    data = custom_op_model().SerializeToString()
    frag = EmittedFragment("f0", "pi5-a", "pi5-a.f0.onnx", ("x",), ("y",),
                    EncodedModel((data,), hashlib.sha256(data).hexdigest()), 1.0)
    with pytest.raises(UserError) as info:
        write_output(tmp_path / "out", {"model": {"path": "../custom.onnx"}, "fragments": []}, [frag])
    message = str(info.value)
    assert message.startswith(str(tmp_path / "custom.onnx")) and "fragment f0" in message
    assert "com.example:Foo" in message and "\n" not in message
    assert os.listdir(tmp_path) == []  # nothing written, no temporary folder


def test_a_manifest_the_runtime_refuses_is_never_swapped_in(tmp_path):
    """The emitter's postcondition: the runtime's parser accepts what was written, before the swap."""
    from edgec.compiler.driver import compile_model
    from edgec.compiler.emit import build_fragments

    result = compile_model(models.ensure("tinychain"), TWO, tmp_path / "good", strategy="pipeline")
    broken = json.loads(json.dumps(result.manifest))
    broken["steps"][broken["fragments"][0]["device"]].insert(0, {"op": "run", "fragment": "nope"})
    frags = build_fragments(result.ingested, result.chosen.plan, result.chosen.prediction)
    with pytest.raises(RuntimeError, match="the runtime refuses"):
        write_output(tmp_path / "bad", broken, frags)
    assert sorted(os.listdir(tmp_path)) == ["good"]  # nothing of the refused build, no temporary folder


@pytest.mark.parametrize("args, needle", [
    (["compile", ROOT, "--devices", TWO, "-o", "x"], "is a directory"),
    (["compile", "m.onnx", "--devices", TWO, "-o", "x", "--strategy", "bogus"], "'bogus' is not one of"),
    (["compile", "m.onnx", "-o", "x"], "Missing option '--devices'"),
    (["compile", "m.onnx", "--colour", "red"], "No such option '--colour'"),
    (["profile", "-o", "p.yaml", "--threads", "100000"], "--threads"),
])
def test_usage_errors_are_one_line(args, needle):
    line = usage_line(invoke(*args))
    assert needle in line and line.endswith(f"(see 'edgec {args[0]} --help')"), line


def test_unknown_command_is_one_line():
    assert usage_line(invoke("bogus")) == "edgec: No such command 'bogus'. (see 'edgec --help')"


def help_text(command: str) -> str:
    return " ".join(invoke(command, "--help").output.split())  # as one line: help wraps at the terminal width


def test_help_shows_the_defaults():
    text = help_text("compile")
    for default in ("[default: auto]", "[default: latency]", "default: 0.1", "the cores available, at most 2",
                    "one band of rows per device", "every block cut tried"):
        assert default in text, default
    assert "141 stdout closed" in text
    text = help_text("profile")
    assert "one per physical core" in text and "default: (unknown)" in text
    text = help_text("run")
    for default in ("[default: 0; x>=0]", "default: 60.0", "cores / devices", "the manifest's model path"):
        assert default in text, default


def run_with_closed_stdout(*args) -> subprocess.CompletedProcess:
    """The command with stdout a pipe whose reader has already gone (as in `edgec ... | head -c0`)."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "edgec.compiler", *map(str, args)], stdout=w,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    return proc


def test_a_closed_stdout_exits_141_quietly(tmp_path):
    proc = run_with_closed_stdout("compile", models.ensure("tinychain"), "--devices", TWO, "-o", tmp_path / "o", "--json")
    assert proc.returncode == 141 and "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
    assert (tmp_path / "o/manifest.json").is_file()
    for args in (["inspect", tmp_path / "o/manifest.json"], ["run", tmp_path / "o", "--random-inputs"], ["--help"]):
        proc = run_with_closed_stdout(*args)
        assert proc.returncode == 141 and "Traceback" not in proc.stderr and "Exception" not in proc.stderr, (args, proc.stderr)


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _sigterm_compile(tmp_path, phase: str) -> tuple[int, str, float, list[int]]:
    """VGG-19's latency search forks a lane (2 cores); its 575 MB take a moment to write.  SIGTERM in `phase`:
    (exit code, stderr, seconds from the signal to the exit, the compile's child processes seen before it)."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "edgec.compiler", "compile", models.ensure("vgg19"), "--devices",
                             FOUR, "-o", out, "--objective", "latency"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    kids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            kids = children(proc.pid)
            if kids if phase == "planning" else list(tmp_path.glob(".out.tmp-*")):
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"the compile ended before {phase}: {proc.stderr.read()}"
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        _, err = proc.communicate(timeout=30)
        seconds = time.monotonic() - start
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, err, seconds, kids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_cleans_up_and_exits_143(tmp_path):
    """While planning: interrupted (a compile that finished would exit 0), one line, no traceback, nothing left."""
    code, err, _, kids = _sigterm_compile(tmp_path, "planning")
    assert code == 143, err
    assert err.splitlines()[-1] == "edgec: interrupted by SIGTERM"
    assert "Traceback" not in err
    assert os.listdir(tmp_path) == []  # no temporary folder, no half-written output
    assert not any(alive(k) for k in kids)


@pytest.mark.slow  # VGG-19 planned to the end, and a bound on the wall clock (a busy machine may miss it)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("phase", ["planning", "writing"])
def test_sigterm_cleans_up_and_exits_143_within_seconds(tmp_path, phase):
    code, err, seconds, kids = _sigterm_compile(tmp_path, phase)
    assert code == 143, err
    assert seconds < 5
    assert err.splitlines()[-1] == "edgec: interrupted by SIGTERM"
    assert "Traceback" not in err
    assert os.listdir(tmp_path) == []  # no temporary folder, no half-written output
    assert not any(alive(k) for k in kids)
