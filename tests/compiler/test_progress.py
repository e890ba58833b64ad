"""Compile progress: each planner's result as a line, a live status on a terminal, nothing on stdout."""

from __future__ import annotations

import io
import json
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from edgec import models
from edgec.compiler.cli import cli
from edgec.compiler.driver import compile_model
from edgec.compiler.progress import LineProgress, Progress, RichProgress

CLUSTERS = Path(__file__).resolve().parents[1] / "e2e" / "clusters"


class _Recorder(Progress):
    def __init__(self):
        self.events: list[tuple[str, str]] = []

    def note(self, message: str) -> None:
        self.events.append(("note", message))

    def status(self, message: str) -> None:
        self.events.append(("status", message))


def test_driver_reports_every_planner_and_the_best_so_far(tmp_path):
    rec = _Recorder()
    compile_model(models.ensure("tinyconv"), CLUSTERS / "two.yaml", tmp_path / "out", progress=rec)
    notes = [m for kind, m in rec.events if kind == "note"]
    statuses = [m for kind, m in rec.events if kind == "status"]
    for planner in ("pipeline", "single", "even", "neurosurgeon", "bbgrap", "edgeflow", "deepthings", "spatial",
                    "hybrid"):
        assert any(m.startswith(f"plan: {planner}:") for m in notes), planner
    assert [m.split(":")[0] for m in notes if not m.startswith("plan: ")] == ["cluster", "ingest", "cost", "emit", "write"]
    assert any(m.startswith("planning: searching spatial and hybrid (best so far: ") for m in statuses)
    assert statuses[0] == "reading the cluster"


def test_rich_progress_draws_status_and_keeps_notes():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with RichProgress(console) as progress:
        progress.status("planning: spatial [best so far: pipeline, 1.0 ms]")
        progress.note("plan: pipeline: latency 1.0 ms [x]")
    text = out.getvalue()
    assert "planning: spatial [best so far: pipeline, 1.0 ms]" in text  # brackets are text, not markup
    assert "edgec: plan: pipeline: latency 1.0 ms [x]" in text


def test_line_progress_prints_notes_only():
    lines: list[str] = []
    progress = LineProgress(lines.append)
    progress.status("planning: pipeline")
    progress.note("plan: pipeline: latency 1.0 ms")
    assert lines == ["edgec: plan: pipeline: latency 1.0 ms"]


def test_json_stdout_holds_only_the_summary(tmp_path):
    res = CliRunner().invoke(cli, ["compile", str(models.ensure("tinychain")), "--devices", str(CLUSTERS / "two.yaml"),
                                   "-o", str(tmp_path / "out"), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["strategy"]
    assert "edgec: plan: pipeline:" in res.stderr
