"""The documentation's generated parts: the benchmark results files and their pages, benchlib's writer that
every bench script calls, and the reference generators (docs/gen) on the current code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import importlib.util

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "bench"


def _load(path: Path, name: str):
    """A module of the checkout that is no package (tests/bench, benchmarks, docs/gen), under its own name,
    without putting its folder on sys.path for the other tests."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


benchlib = _load(BENCH / "benchlib.py", "edgec_test_benchlib")
reference = _load(ROOT / "docs" / "gen" / "reference.py", "edgec_docs_reference")
render = _load(ROOT / "benchmarks" / "render.py", "edgec_docs_render")
MEANINGS = _load(ROOT / "docs" / "gen" / "meanings.py", "edgec_docs_meanings").MEANINGS

PROVENANCE = ("bench", "date", "commit", "command", "machine", "load", "tables")


def test_every_bench_script_records_its_results():
    for script in sorted(BENCH.glob("bench_*.py")):
        text = script.read_text(encoding="utf-8")
        assert re.search(r'if __name__ == "__main__":\n(    .*\n)*    sys\.exit\((benchlib\.)?recorded\(main\)\)', text), script.name


def test_write_results_keeps_provenance_and_tables(tmp_path, monkeypatch):
    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", [str(BENCH / "bench_x.py"), "--quick"])
    printed = "## Latency\n\n| model | ms | met? |\n|---|---:|---|\n| resnet50 | 77.5 | yes |\n\nall met: yes\n"
    path = benchlib.write_results("bench_x", printed, load_start=[0.5, 0.4, 0.3])
    doc = json.loads(path.read_text())
    assert all(k in doc for k in PROVENANCE)
    assert doc["command"] == "python tests/bench/bench_x.py --quick"
    assert doc["machine"]["cores"] >= 1 and doc["load"]["start"] == [0.5, 0.4, 0.3]
    assert doc["tables"] == [{"title": "Latency", "columns": ["model", "ms", "met?"], "rows": [["resnet50", 77.5, "yes"]]}]
    assert "all met: yes" in doc["notes"]
    page = render.page("bench_x", doc)
    assert "| resnet50 | 77.5 | yes |" in page and "tests/bench/bench_x.py --quick" in page


def test_recorded_writes_after_main_returns_and_not_after_it_raises(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["bench_y.py"])
    assert benchlib.recorded(lambda: print("| a |\n|---|\n| 1 |") or 1) == 1
    assert json.loads((tmp_path / "bench_y.json").read_text())["exit_code"] == 1
    monkeypatch.setattr(sys, "argv", ["bench_z.py"])
    with pytest.raises(RuntimeError):
        benchlib.recorded(lambda: (_ for _ in ()).throw(RuntimeError("broke")))
    assert not (tmp_path / "bench_z.json").exists()


def test_committed_results_render():
    docs = render.load()
    assert docs, "benchmarks/results is empty"
    for name, doc in docs.items():
        assert doc["tables"] and all(t["rows"] for t in doc["tables"]), name
        assert all(len(row) == len(t["columns"]) for t in doc["tables"] for row in t["rows"]), name
    pages = render.pages()
    assert set(pages) == {f"{n}.md" for n in docs} | {"index.md"}
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in docs:
        assert f"benchmarks/{name}.md" in nav, f"{name} is missing from mkdocs.yml's nav"


def test_reference_generators_cover_the_code():
    from edgec.compiler.allocate.services import ServicesDoc
    from edgec.compiler.cluster.schema import ClusterDoc, ProfileDoc

    for root in (ClusterDoc, ServicesDoc, ProfileDoc):
        page = reference.schema_page("t", "i", root, MEANINGS, "x: 1")
        assert f"## {root.__name__}" in page
    cli = reference.cli_page()
    assert "## edgec compile" in cli and "## edgec worker" in cli
    manifest = reference.manifest_page()
    assert "### Fragment" in manifest and "edgec.manifest" in manifest


def test_a_field_without_a_meaning_stops_the_build():
    from edgec.compiler.cluster.schema import ClusterDoc

    partial = {k: v for k, v in MEANINGS.items() if k != "DeviceDoc.address"}
    with pytest.raises(SystemExit, match="DeviceDoc.address"):
        reference.schema_page("t", "i", ClusterDoc, partial, "x: 1")


def test_render_script_writes_pages(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "index.md").is_file() and (tmp_path / "bench_pipeline.md").is_file()
