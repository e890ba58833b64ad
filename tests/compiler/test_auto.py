"""auto as a branch and bound over planners: a pruned search never hides a better plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgec import models
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.driver import plan_model
from edgec.compiler.ingest import load_model

CLUSTERS = Path(__file__).resolve().parents[1] / "e2e/clusters"


BOTH = {"spatial", "hybrid"}


@pytest.mark.parametrize("name,cluster,prunes", [("tinychain", "two", BOTH), ("tinyconv", "four", BOTH),
                                                 ("squeezenet", "two", BOTH), ("squeezenet", "four", {"spatial"})])
def test_pruned_candidates_cannot_beat_auto(name, cluster, prunes):
    ing = load_model(models.ensure(name))
    cost = build_cost_table(ing.graph, load_cluster(CLUSTERS / f"{cluster}.yaml"), ing.sha256)
    best, cands = plan_model(ing.graph, cost, "auto", "latency")
    assert best.prediction.latency_ms == min(c.prediction.latency_ms for c in cands if c.plan is not None)
    pruned = [c for c in cands if c.pruned]
    # where a pipeline plan wins both searches stop early; hybrid's plan bounds spatial's (a superset)
    assert {c.strategy for c in pruned} == prunes
    assert all(c.plan is None and "another planner" in c.error for c in pruned)
    for c in pruned:  # run alone, unbounded, the pruned planner finds nothing better than auto's choice
        alone, _ = plan_model(ing.graph, cost, c.strategy, "latency")
        assert alone.prediction.latency_ms >= best.prediction.latency_ms - 1e-9, c.strategy
    # the bound applies to the latency objective only: under throughput every search runs to the end
    _, cands = plan_model(ing.graph, cost, "auto", "throughput")
    assert not any(c.pruned for c in cands)
