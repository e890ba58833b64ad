"""README's commands work as written: its Python example and its tour run from a folder laid out like the
checkout, every other command it shows parses (the subcommand and options exist, extras are declared, the
files it names exist), its cluster.yaml validates, and its links point at files of the checkout."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from edgec import models
from edgec.compiler.cli import cli
from edgec.compiler.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def _indented() -> list[str]:
    """The indented (4 spaces) code blocks."""
    blocks, cur = [], []
    for line in README.splitlines() + [""]:
        if line.startswith("    ") or (cur and not line.strip()):
            cur.append(line[4:])
        elif cur:
            blocks.append("\n".join(cur).strip("\n"))
            cur = []
    return [b for b in blocks if b]


def _commands(inline: bool = False) -> list[list[str]]:
    """The shell commands README shows: the lines of its bash and indented blocks, split at `&&`; or
    (inline) the commands quoted in backticks in its prose that start with `edgec ` or `python -m`."""
    text = "\n".join(_fenced("bash") + [b for b in _indented() if not b.startswith(("devices:", "compiler/"))])
    lines = [ln for ln in text.replace("\\\n", " ").splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if inline:
        lines = re.findall(r"`((?:edgec|python -m) [^`]+)`", README)
    out = []
    for line in lines:
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words:
                out.append(words)
    return out


def _layout_like_checkout(tmp_path: Path, names: list[str]) -> None:
    (tmp_path / "models" / "build").mkdir(parents=True)
    for name in names:
        (tmp_path / "models" / "build" / f"{name}.onnx").symlink_to(models.ensure(name))
    for folder in ("tests", "examples"):
        (tmp_path / folder).symlink_to(ROOT / folder)


def _run_bash_block(tmp_path: Path, marker: str, models_used: list[str]) -> subprocess.CompletedProcess:
    """README's one bash block holding `marker`, run as written in a folder laid out like the checkout."""
    (block,) = [b for b in _fenced("bash") if marker in b]
    _layout_like_checkout(tmp_path, models_used)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _python_block(marker: str) -> str:
    (block,) = [b for b in _fenced("python") if marker in b]
    return block


def test_python_api_example_runs(tmp_path, monkeypatch, capsys):
    block = _python_block("edgec.compile(")
    _layout_like_checkout(tmp_path, ["tinychain"])
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("pipeline ") and "median latency" in out
    assert (tmp_path / "build" / "tinychain" / "manifest.json").is_file()
    assert os.listdir(tmp_path / "build") == ["tinychain"]


def _tinychain_build(tmp_path: Path) -> None:
    """build/tinychain as README's Python example compiles it."""
    _layout_like_checkout(tmp_path, ["tinychain"])
    subprocess.run([str(Path(sys.executable).parent / "edgec"), "compile", "models/build/tinychain.onnx", "--devices",
                    "tests/e2e/clusters/two.yaml", "-o", "build/tinychain", "--strategy", "pipeline"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=300)


def test_session_example_runs(tmp_path, monkeypatch, capsys):
    _tinychain_build(tmp_path)
    monkeypatch.chdir(tmp_path)
    exec(compile(_python_block("edgec.Cluster("), "README.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["(1, 10)", "[" + ", ".join(["(1, 10)"] * 8) + "]"]


def test_serve_command_and_client_run_as_written(tmp_path):
    """README's `edgec serve` line, started as shown (in the background), answers README's client block."""
    _tinychain_build(tmp_path)
    (line,) = [b for b in _indented() if b.startswith("edgec serve ")]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    server = subprocess.Popen(shlex.split(line), cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        for err in server.stderr:  # `edgec: ready: ...` once it serves
            if "ready: http" in err:
                break
        else:
            pytest.fail(f"edgec serve exited {server.wait()} before it was ready")
        client = subprocess.run([sys.executable, "-c", _python_block("tritonclient")], cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert client.returncode == 0, client.stderr[-2000:]
        assert client.stdout == "(1, 10)\n"
    finally:
        server.terminate()
        assert server.wait(timeout=60) == 0  # SIGTERM: answers what it accepted, stops the workers, exits 0


def test_tour_runs_as_written(tmp_path):
    proc = _run_bash_block(tmp_path, "edgec compile models/build/squeezenet.onnx", ["squeezenet"])
    assert (tmp_path / "schedule.png").stat().st_size > 0
    assert "verify PASSED" in proc.stdout or "PASSED" in proc.stdout + proc.stderr


def _check_edgec(words: list[str], whole: bool = True) -> None:
    """`edgec ...` parses (whole: a complete command line) or names a subcommand and options that exist."""
    args = [w for w in words[1:]]
    if args in (["--version"], ["-V"], ["COMMAND", "--help"]):
        return
    name, rest = args[0], args[1:]
    assert name in cli.commands, f"README shows `edgec {name}`, which does not exist"
    cmd = cli.commands[name]
    rest = [w for w in rest if w != "--help"]
    if not whole or any(re.fullmatch(r"[A-Z_]+|.*\.\.\..*|.*<.*>.*|\[.*|.*\]", w) for w in rest):
        # a placeholder (OUTDIR, <service>, [--share]): check the options it names exist
        known = {o for p in cmd.params for o in getattr(p, "opts", [])}
        for w in rest:
            for opt in re.findall(r"(--[a-z][a-z-]*)", w):
                assert opt in known, f"README shows `edgec {name} {opt}`, which is no option"
        return
    with cli.make_context("edgec", [name]) as parent:  # the group alone: parses, never runs
        cmd.make_context(name, list(rest), parent=parent)


@pytest.mark.parametrize("inline", [False, True], ids=["blocks", "inline"])
def test_every_command_shown_exists_with_its_options(inline):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    seen = set()
    for words in _commands(inline):
        head = words[0]
        seen.add(head)
        if head == "edgec":
            _check_edgec(words, whole=not inline)
        elif head == "pip":
            for w in words[2:]:
                m = re.fullmatch(r"\.\[(\w+)\]", w)
                if m:
                    assert m.group(1) in extras, f"README installs extra {m.group(1)!r}, not declared"
        elif words[:3] == ["python", "-m", "edgec.models"]:
            assert words[3] in ("build", "list"), words
            assert {w for w in words[4:] if w.startswith("-")} <= {"--only", "-o", "--force"}, words
        elif words[:3] == ["python", "-m", "pytest"]:
            assert words[3:] in (["-n", "auto"], ["-m", "slow"]), words
        elif head == "mkdocs":
            assert words[1:] in (["build", "--strict"], ["serve"]) and (ROOT / "mkdocs.yml").is_file()
        elif head == "python":
            assert (ROOT / words[1]).is_file(), f"README runs {words[1]}, not in the checkout"
    assert {"edgec"} <= seen if inline else {"edgec", "pip", "python", "mkdocs"} <= seen


def test_cluster_yaml_shown_validates(tmp_path):
    (block,) = [b for b in _indented() if b.startswith("devices:")]
    path = tmp_path / "cluster.yaml"
    path.write_text(block + "\n")
    cluster = load_cluster(path)
    assert [d.name for d in cluster.devices] == [d["name"] for d in yaml.safe_load(block)["devices"]]


def test_links_point_into_the_checkout():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    for anchor in re.findall(r"\]\(#([^)]+)\)", README):
        heads = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", README, re.M)}
        assert anchor in heads, f"README links to #{anchor}, no such heading"


@pytest.mark.parametrize("line_limit", [250])
def test_readme_stays_a_page(line_limit):
    assert len(README.splitlines()) <= line_limit


def test_generate_runs_as_written(tmp_path):
    """README's generate block: compile tinylm for generation, then generate on local workers, verified."""
    proc = _run_bash_block(tmp_path, "edgec generate ", ["tinylm"])
    assert "verify: PASS" in proc.stdout and proc.stdout.count("sequence ") == 2, proc.stdout
