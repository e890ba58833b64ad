"""Search statistics: every planner's work in `edgec compile --json` (`planning`), the same with any --jobs."""

from __future__ import annotations

import json
import re

import onnx
import pytest
import yaml
from onnx import shape_inference

import edgec
from edgec.compiler.cost import build_cost_table
from edgec.compiler.plan.choose import plan_model
from edgec.compiler.layers import build_layer_graph
from edgec.compiler.plan import stats
from edgec.compiler.plan.planner import PlanOptions
from edgec.compiler.plan.registry import COMPARISONS, STRATEGIES
from edgec.compiler.progress import LineProgress
from tests.compiler.test_spatial import make_cluster
from tests.conftest import conv_chain_model
WORK = {  # the unit each planner counts its work in
    "pipeline": "labels", "single": "plans", "even": "plans", "neurosurgeon": "plans", "bbgrap": "plans",
    "edgeflow": "nodes", "deepthings": "plans",
}


# four devices on a fast network, and a conv chain wide enough to tile there: auto's searches do work
FAST_FOUR = {"devices": [{"name": f"pi{k}-{i}", "profile": f"rpi{k}"} for k in (5, 4) for i in "ab"],
             "network": {"bandwidth_mbps": 1000, "latency_ms": 0.2, "medium": "switched"}}


def _chain():
    return conv_chain_model(n=4, channels=32, size=64)


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("stats")
    onnx.save(_chain(), tmp / "chain.onnx")
    (tmp / "four.yaml").write_text(yaml.safe_dump(FAST_FOUR))
    return edgec.compile(tmp / "chain.onnx", tmp / "four.yaml", tmp / "out")


def test_every_planner_reports_its_time_and_work(summary):
    planning = summary["planning"]
    assert [p["strategy"] for p in planning] == [c["strategy"] for c in summary["candidates"]]
    assert {p["strategy"] for p in planning} == set(STRATEGIES) - {"auto", *COMPARISONS}  # auto skips those
    for p in planning:
        assert set(p) == {"strategy", "seconds", "group", "work", "detail"}
        assert p["seconds"] >= 0 and set(p["work"]) <= set(stats.UNITS)
        assert all(isinstance(n, int) and n >= 0 for n in p["work"].values())
        if p["strategy"] in WORK:
            assert p["group"] == [p["strategy"]]
            assert p["work"][WORK[p["strategy"]]] > 0
    json.dumps(summary, allow_nan=False)  # strict JSON: no inf or NaN anywhere


def test_the_searches_share_their_figures(summary):
    by = {p["strategy"]: p for p in summary["planning"]}
    spatial, hybrid = by["spatial"], by["hybrid"]
    assert spatial["group"] == hybrid["group"] == ["spatial", "hybrid"]
    assert spatial["work"] == hybrid["work"] and spatial["detail"] == hybrid["detail"]
    assert spatial["work"]["nodes"] > 0 and spatial["work"]["states"] > 0 and spatial["work"]["plans"] > 0
    assert spatial["detail"]["searches"] >= 1 and isinstance(spatial["detail"]["exact"], bool)


def test_figures_do_not_depend_on_the_processes():
    """Forked lanes report their searches as data, and the lanes are fixed: one process or two, the
    same figures (only the seconds differ)."""
    graph = build_layer_graph(shape_inference.infer_shapes(_chain()))
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi5", "rpi4", "rpi4"), 1000.0, 0.2))

    def work(jobs: int) -> dict:
        _, candidates = plan_model(graph, cost, "auto", "latency", PlanOptions(jobs=jobs))
        return {c.strategy: (c.stats["work"], {k: v for k, v in c.stats["detail"].items() if "seconds" not in k})
                for c in candidates}

    one = work(1)
    assert one["spatial"][0]["nodes"] > 0  # the searches ran, in two lanes (lanes.py)
    assert one == work(2)


def test_recording_counts_only_inside_and_checks_the_unit():
    stats.count("nodes", 5)  # outside a recording: nothing to add to, nothing happens
    with stats.recording() as rec:
        stats.count("nodes", 5)
        stats.count("nodes", 2)
        stats.count("plans", 1)
        stats.detail(searches=1, exact=True)
        stats.detail(searches=2, exact=False)
        with stats.suspended():
            stats.count("nodes", 100)
        with pytest.raises(ValueError, match="unknown unit"):
            stats.count("flops", 1)
    assert rec == {"work": {"nodes": 7, "plans": 1}, "detail": {"searches": 3, "exact": False}}


def test_progress_lines_say_what_each_planner_did():
    graph = build_layer_graph(shape_inference.infer_shapes(_chain()))
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi4"), 100.0, 1.0))
    notes: list[str] = []
    plan_model(graph, cost, "auto", "latency", PlanOptions(jobs=1), LineProgress(notes.append))
    pipeline = next(n for n in notes if n.startswith("edgec: plan: pipeline:"))
    assert re.search(r"\(\d+\.\d\ds, [\d,]+ labels\)$", pipeline), pipeline
    even = next(n for n in notes if n.startswith("edgec: plan: even:"))
    assert even.endswith(", 1 plan)"), even
