"""What compile, inspect, simulate and allocate print for people: every line fits 100 columns (long cells
wrap, --json unchanged); a hint when the plan leaves devices idle; --help explains every strategy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgec.compiler.cli import cli
from edgec.compiler.plan.registry import STRATEGIES
from edgec.compiler.report import idle_devices_hint
from edgec.runtime.manifest.types import OBJECTIVES
from edgec.compiler.text import fit, table
from tests.compiler.test_allocate import _two, cluster_file

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models" / "build"
FOUR = ROOT / "tests/e2e/clusters/four.yaml"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="edgec")


def assert_fits(text: str) -> None:
    long = [ln for ln in text.splitlines() if len(ln) > 100]
    assert not long, long


def test_a_wide_cell_wraps_in_its_column_and_narrow_tables_print_as_before():
    cells = "width: " + "; ".join(f"L{k}-{k + 3} pi5-a[0:40] pi5-b[40:80]" for k in range(8))
    text = table(["stage", "device", "tiles"], [[0, "pi5-a", cells], [1, "pi5-b", "-"]])
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100 and len(lines) > 4
    start = lines[0].index("tiles")
    assert all(ln[start:].strip() for ln in lines[2:-1])  # every continuation line is the tiles column's
    assert " ".join(ln[start:].strip() for ln in lines[2:-1]) == cells  # nothing lost, words kept whole
    assert table(["a", "b"], [[1, "x"]]) == "a  b\n-  -\n1  x"
    assert fit("short\n" + "word " * 30) == "short\n" + ("word " * 20).strip() + "\n  " + ("word " * 10).strip()


def test_compile_inspect_and_simulate_fit_100_columns_and_json_is_unchanged(tmp_path):
    out = tmp_path / "out"
    res = invoke("compile", MODELS / "yolo_focus.onnx", "--devices", FOUR, "-o", out, "--strategy", "hybrid")
    assert res.exit_code == 0, res.output
    assert_fits(res.stdout)
    assert "pi5-a.f0s0t0.onnx" in res.stdout
    as_json = invoke("compile", MODELS / "yolo_focus.onnx", "--devices", FOUR, "-o", out, "--strategy", "hybrid",
                     "--json")
    summary = json.loads(as_json.stdout)
    assert any(len(", ".join(d["fragments"])) > 40 for d in summary["devices"])  # long values are whole in JSON
    for args in (["inspect", out / "manifest.json"], ["inspect", MODELS / "yolo_focus.onnx", "--devices", FOUR],
                 ["simulate", out / "manifest.json"]):
        res = invoke(*args)
        assert res.exit_code == 0, res.output
        assert_fits(res.stdout)


def test_allocate_fits_100_columns(tmp_path, monkeypatch):
    devices = cluster_file(tmp_path, [("a-device-with-a-long-name", "rpi5"), ("b-another-long-device-name", "rpi4"),
                                      ("c-and-a-third-long-device-name", "phone")])
    monkeypatch.chdir(tmp_path)  # the output's path is printed whole: pytest's own (tmp_path) varies in length
    res = invoke("allocate", _two(tmp_path), "--devices", devices, "-o", "out")
    assert res.exit_code == 0, res.output
    assert_fits(res.stdout)


def test_a_plan_that_leaves_devices_idle_says_why_in_one_line(tmp_path):
    res = invoke("compile", MODELS / "squeezenet.onnx", "--devices", FOUR, "-o", tmp_path / "out", "--json")
    assert res.exit_code == 0, res.output
    idle = [d["name"] for d in json.loads(res.stdout)["devices"] if not d["fragments"]]
    assert idle  # the latency plan of this model leaves the two slower devices out
    hints = [ln for ln in res.stderr.splitlines() if ln.startswith("edgec: hint: ")]
    assert hints == [f"edgec: hint: {len(idle)} of 4 devices idle ({', '.join(idle)}): the plans found using them "
                     "predict slower requests (transfers outweigh shared compute); --objective throughput plans "
                     "for streamed requests"], res.stderr
    everything = invoke("compile", MODELS / "tinychain.onnx", "--devices", ROOT / "tests/e2e/clusters/two.yaml",
                        "-o", tmp_path / "o2", "--strategy", "even")
    assert everything.exit_code == 0 and "hint" not in everything.stderr  # every device used: no hint


@pytest.mark.parametrize("objective,says", [("latency", "--objective throughput plans for streamed requests"),
                                            ("throughput", "predicts more requests per second"),
                                            ("energy", "least energy within --sla-ms")])
def test_the_hint_names_the_idle_devices_and_the_objective_s_reason(objective, says):
    devices = [{"name": n, "fragments": f} for n, f in
               [("a", ["a.f0.onnx"]), ("b", []), ("c", []), ("d", []), ("e", [])]]
    ran = [{"strategy": "pipeline"}, {"strategy": "single"}]
    hint = idle_devices_hint({"devices": devices, "objective": objective, "strategy": "single", "candidates": ran})
    assert hint.startswith("4 of 5 devices idle (b, c, d and 1 more): ") and hint.endswith(says)
    assert idle_devices_hint({"devices": devices[:1], "objective": objective, "candidates": ran}) is None
    forced = idle_devices_hint({"devices": devices, "objective": objective, "strategy": "single",
                                "candidates": ran[1:]})
    assert forced.endswith(": --strategy single planned it so (--strategy auto weighs every planner's plans)")


def test_compile_offers_exactly_the_registry_strategies_and_the_manifest_objectives():
    params = {p.name: p for p in cli.commands["compile"].params}
    assert tuple(params["strategy"].type.choices) == STRATEGIES  # spelt out in cli.py to keep --help light
    assert tuple(params["objective"].type.choices) == OBJECTIVES


def test_help_explains_every_strategy():
    text = invoke("compile", "--help").stdout
    listed = text[text.index("Strategies (--strategy):"):text.index("Options:")]
    for name in STRATEGIES:
        line = next((ln for ln in listed.splitlines() if ln.strip().startswith(name + " ")), None)
        assert line is not None and len(line.split(None, 1)[1]) > 15, name
