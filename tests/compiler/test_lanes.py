"""Searches in fixed lanes: the same results in one process or several, and a failed worker costs time only."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from edgec.compiler.cost import build_cost_table
from edgec.compiler.ingest import load_model
from edgec.compiler.plan import lanes
from edgec.compiler.plan.spatial import plan_searches
from edgec.compiler.plan_types import Plan
from edgec.runtime.device.zygote import zygote_pids
from tests.compiler.test_spatial import make_cluster
from tests.runtime.procs import children

LIGHT = Path(__import__("onnx").__file__).parent / "backend/test/data/light"
PARENT = os.getpid()


def _work(lane):
    return {"lane": lane, "sum": float(sum(lane)), "inf": float("inf"), "pid": os.getpid()}


needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


@needs_fork
def test_lanes_after_the_first_run_in_other_processes_with_the_same_values():
    lanes_in = [(1, 2), (3,), (4, 5, 6)]
    here = lanes.run_lanes(_work, lanes_in, workers=1)
    forked = lanes.run_lanes(_work, lanes_in, workers=3)
    assert [r["pid"] for r in here] == [os.getpid()] * 3
    assert forked[0]["pid"] == os.getpid() and {r["pid"] for r in forked[1:]}.isdisjoint({os.getpid()})
    for a, b in zip(here, forked):
        assert {k: v for k, v in a.items() if k != "pid"} == {k: v for k, v in b.items() if k != "pid"}
    assert here[2]["lane"] == [4, 5, 6]  # msgpack: tuples come back as lists, both ways


def _dies_in_a_child(lane):
    if os.getpid() != PARENT:
        os._exit(7)  # as if killed
    return list(lane)


@needs_fork
def test_a_worker_that_dies_has_its_lane_run_again_here(caplog):
    with caplog.at_level(logging.WARNING, logger="edgec.compiler.plan.lanes"):
        assert lanes.run_lanes(_dies_in_a_child, [(1,), (2,)], workers=2) == [[1], [2]]
    assert "running its lane again here" in caplog.text


def _fails(lane):
    if lane == "bad":
        raise ValueError("a planner bug")
    return lane


@needs_fork
def test_an_error_surfaces_here_and_leaves_no_worker_behind():
    with pytest.raises(ValueError, match="a planner bug"):
        lanes.run_lanes(_fails, ["bad", "ok"], workers=2)
    with pytest.raises(ValueError, match="a planner bug"):  # the child's lane: rerun here, where it raises
        lanes.run_lanes(_fails, ["ok", "bad"], workers=2)
    assert not [pid for pid in children(os.getpid()) if pid not in zygote_pids()]  # every lane worker was reaped


@needs_fork
def test_auto_searches_give_the_same_plans_with_one_process_or_two():
    graph = load_model(LIGHT / "light_squeezenet.onnx").graph
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi5", "rpi4", "rpi4"), 100.0))
    for objective, incumbent in (("latency", float("inf")), ("latency", 60.0), ("latency", 13.0), ("throughput", float("inf"))):
        one, stats1 = plan_searches(graph, cost, objective, ("spatial", "hybrid"), incumbent=incumbent, workers=1)
        two, stats2 = plan_searches(graph, cost, objective, ("spatial", "hybrid"), incumbent=incumbent, workers=2)
        counts = [(s.nodes_visited, s.states, s.pruned, s.memo_hits, s.exact) for s in (stats1, stats2)]
        assert counts[0] == counts[1] and (counts[0][0] > 0 or incumbent < 20)  # 13 ms: every search pruned at once
        for kind in ("spatial", "hybrid"):
            a, b = one[kind], two[kind]
            if isinstance(a, Plan):
                assert a == b
            else:
                assert type(a) is type(b) and str(a) == str(b)
