"""auto as a branch and bound over planners: a pruned search never hides a better plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgec import models
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.plan.choose import plan_model
from edgec.compiler.ingest import load_model

CLUSTERS = Path(__file__).resolve().parents[1] / "e2e/clusters"


BOTH = {"spatial", "hybrid"}


@pytest.mark.parametrize("name,cluster,prunes", [("tinychain", "two", BOTH), ("tinyconv", "four", BOTH),
                                                 ("squeezenet", "two", BOTH), ("squeezenet", "four", {"spatial"})])
def test_pruned_candidates_cannot_beat_auto(name, cluster, prunes):
    ing = load_model(models.ensure(name))
    cost = build_cost_table(ing.graph, load_cluster(CLUSTERS / f"{cluster}.yaml"), ing.sha256)
    best, cands = plan_model(ing.graph, cost, "auto", "latency")
    assert best.prediction.latency_ms == pytest.approx(min(c.prediction.latency_ms for c in cands if c.plan is not None),
                                                       rel=1e-9)  # equal to 10 digits is a tie (plan/choose.py _key)
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


def test_a_tie_to_rounding_goes_to_the_plan_with_fewer_fragment_runs():
    """On one device every planner predicts the same time, summed in different orders; BBGrap's 33 one-layer
    stages came out 1e-15 ms faster than the one-stage pipeline and won, and ran 33 fragments (MobileNetV2:
    14.7 ms measured against 7.7 ms whole). Figures equal to 10 digits tie; fewer fragment runs win."""
    from types import SimpleNamespace

    from edgec.compiler.plan.choose import _choose
    from edgec.compiler.plan_types import Plan, Segment, SpatialGroup, Stage, Tile

    one = Plan("pipeline", "latency", (Stage("d", 0, 33),))
    many = Plan("bbgrap", "latency", tuple(Stage("d", i, i + 1, SpatialGroup(2, (Segment(i, i + 1, (Tile("d", 0, 8),)),)))
                                           for i in range(33)))

    def cand(plan, ms):
        return SimpleNamespace(strategy=plan.strategy, plan=plan,
                               prediction=SimpleNamespace(latency_ms=ms, bottleneck_ms=ms))

    for objective in ("latency", "throughput"):
        assert _choose([cand(one, 9.0348), cand(many, 9.0348 - 1e-12)], objective, None, None).plan is one
        assert _choose([cand(one, 9.0348), cand(many, 9.0)], objective, None, None).plan is many  # a real difference
