"""bench_generate's logic without a testbed or a model: the split-only cluster's memory, the targets' verdicts,
and its tables as the results file and the docs page read them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import benchlib  # tests/bench is on sys.path: pytest puts a test file's folder there (no __init__.py)
from bench_generate import (HETERO, SPLIT_SHARE, inflight_markdown, inflight_targets, measure_markdown,
                            measure_targets, plan_markdown, plan_row, plan_targets, priced, split_only_memory,
                            write_cluster)

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("edgec_bench_render", ROOT / "benchmarks" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)


def _plan_row(cluster, objective, strategy, one, inflight):
    return {"cluster": cluster, "objective": objective, "strategy": strategy, "chose": strategy,
            "stages": [("pi5-a", 10), ("phone", 5)], "tokens_per_s": inflight, "one_tokens_per_s": one,
            "tpot_ms": 1000.0 / one, "ttft_ms": 50.0}


@pytest.mark.parametrize("strategy", ["auto", "equal-layers"])
def test_part_plan_figures_are_edgec_compiles(tmp_path, strategy):
    """Part plan prices and plans in-process (reading a large model once for every strategy); its figures must be
    what `edgec compile --generate --json` says of the same model, cluster and options."""
    from edgec import models
    from edgec.compiler.ingest.phases import GenerateOptions

    model = models.ensure("tinylm")
    cluster = write_cluster(tmp_path / "c.yaml", [("pi5", "rpi5"), ("pi4", "rpi4"), ("phone", "phone")], {})
    row = plan_row(*priced(model, cluster, GenerateOptions(max_context=128, prompt_len=16)), "throughput", strategy)
    done = subprocess.run([sys.executable, "-m", "edgec.compiler", "compile", str(model), "--devices", str(cluster),
                           "-o", str(tmp_path / "out"), "--generate", "--max-context", "128", "--prompt-len", "16",
                           "--objective", "throughput", "--strategy", strategy, "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    cli = json.loads(done.stdout)
    assert row["chose"] == cli["strategy"]
    assert row["stages"] == [(s["device"], s["layers"][1] - s["layers"][0]) for s in cli["stages"]]
    for key in ("tokens_per_s", "tpot_ms", "ttft_ms"):  # the summary rounds to 4 decimals
        assert round(row[key], 4) == pytest.approx(cli[f"predicted_{key}"], abs=1e-4)


def test_split_only_memory_leaves_no_device_the_whole_model_and_all_of_them_more_than_it():
    need = 1800.0
    memory = split_only_memory(need)
    usable = []
    for _, profile in HETERO:
        doc = yaml.safe_load((ROOT / "profiles" / f"{profile}.yaml").read_text())
        usable.append(memory[profile] * doc["usable_memory_fraction"] - doc.get("runtime_overhead_mb", 0))
    assert all(abs(u - SPLIT_SHARE * need) < 1e-6 for u in usable)
    assert max(usable) < need < sum(usable)


def test_plan_targets_compare_one_sequence_for_latency_and_in_flight_for_throughput():
    rows = [_plan_row("hetero", "latency", "auto", 9.0, 9.0), _plan_row("hetero", "latency", "ring-memory", 3.0, 30.0),
            _plan_row("hetero", "latency", "equal-layers", 7.0, 7.0),
            _plan_row("hetero", "throughput", "auto", 4.0, 26.0),
            _plan_row("hetero", "throughput", "ring-memory", 3.0, 20.0),
            {"cluster": "hetero", "objective": "throughput", "strategy": "equal-layers", "error": "does not fit"},
            _plan_row("split-only", "latency", "auto", 1.0, 1.0)]  # split-only has no target
    verdicts = {name: ok for name, ok, _ in plan_targets({"rows": rows})}
    assert verdicts == {"hetero latency: auto >= 1.3x ring-memory": True,  # 9 against 3 (not 30 in flight)
                        "hetero latency: auto >= 1.3x equal-layers": False,  # 9 against 7: 1.29x
                        "hetero throughput: auto >= 1.3x ring-memory": True,  # 26 against 20
                        "hetero throughput: auto >= 1.3x equal-layers": True}  # no baseline plan
    tables, _ = benchlib.tables_of("\n".join(plan_markdown({"model": "m", "need_mb": 10.0, "rows": rows})))
    assert len(tables[0]["rows"]) == len(rows)


def test_measure_targets_within_15_percent_either_way():
    rows = [{"model": "tinylm", "objective": o, "strategy": "pipeline", "stages": 1, "sequences": 1, "figure": f,
             "predicted": p, "measured": m, "predicted_ttft_ms": 10.0, "ttft_ms": 12.0}
            for o, f, p, m in (("latency", "TPOT ms", 10.0, 11.4), ("throughput", "tokens/s", 100.0, 84.0))]
    assert [ok for _, ok, _ in measure_targets({"rows": rows})] == [True, False]
    text = "\n".join(measure_markdown({"prompt": 16, "new": 32, "rows": rows,
                                       "profiles": {"dev-a": {"share": 0.6, "seconds": 60.0}}}))
    tables, notes = benchlib.tables_of(text)
    ratio = tables[0]["columns"].index("measured/predicted")
    assert tables[0]["rows"][1][ratio] == 0.84 and any("dev-a at 0.6" in n for n in notes)


def test_inflight_target_needs_four_stages_and_two_and_a_half_times_s1():
    def result(stages, tps):
        return {"strategy": "equal-layers", "forced": True, "stages": stages, "predicted_tokens_per_s": 40.0,
                "predicted_tpot_ms": 50.0, "rows": [{"sequences": s, "tokens_per_s": t, "tpot_ms": 1000.0 / t * s}
                                                    for s, t in zip((1, 2, 4, 8), tps)]}

    assert inflight_targets(result(4, (10, 18, 25, 26)))[0][1]
    assert not inflight_targets(result(4, (10, 18, 24.9, 26)))[0][1]
    assert not inflight_targets(result(3, (10, 18, 30, 30)))[0][1]
    text = "\n".join(inflight_markdown(result(4, (10, 18, 25, 26))))
    doc = {"bench": "bench_generate", "date": "2026-11-29", "commit": None, "command": "x", "machine": {},
           "load": {"start": None, "end": None}, "tables": benchlib.tables_of(text)[0]}
    page = render.page("bench_generate", doc)
    assert "Generation across devices" in page and "| 4 | 25" in page
    # predicted: one token per TPOT (50 ms) per sequence, 40 tokens/s at most: 20, 40, 40, 40; a gain of 2x at most
    table = benchlib.tables_of(text)[0][0]
    col = table["columns"].index("predicted tokens/s")
    assert [row[col] for row in table["rows"]] == [20.0, 40.0, 40.0, 40.0]
    assert "a gain of at most 2.00x" in text
