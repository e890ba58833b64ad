"""Competing tails (auto runs spatial and hybrid together): one tail's plans bound the others, and the
best plan of any tail is still found, as is every tail's best within the slack of it."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgec.compiler.cost import build_cost_table
from edgec.compiler.plan.planner import Dominated
from edgec.compiler.plan.spatial import BOUND_SLACK, _outcompeted, _shared
from edgec.compiler.plan.spatial_search import INF, SpatialSearch
from edgec.compiler.spatial import spatial_cuts
from tests.compiler.test_spatial import graph_of, make_cluster
from tests.conftest import conv_chain_model


def _best_per_tail(ends: dict, tails) -> list[float]:
    return [min((prefix + tails[t][j] for j, (prefix, _) in ends.items()), default=INF) for t in range(len(tails))]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), size=st.integers(4, 9), kinds=st.sampled_from([("rpi5", "rpi4"), ("rpi5", "rpi5", "rpi4")]),
       mbps=st.sampled_from([1.0, 100.0]), slack=st.sampled_from([0.0, 0.05, BOUND_SLACK]), data=st.data())
def test_competing_tails_keep_the_best_plan(n, size, kinds, mbps, slack, data):
    graph = graph_of(conv_chain_model(n=n, channels=4, size=size))
    cost = build_cost_table(graph, make_cluster(kinds, mbps, 0.2))
    cuts = spatial_cuts(graph, 2)
    # tail 1 stays on a device, tail 2 on another with a random extra cost: either may win
    tails = [[float(cost.layer_ms[c:, d].sum()) + data.draw(st.floats(0.0, 5.0)) * (c < cuts[-1]) for c in cuts]
             for d in range(2)]

    def run(competing: float | None) -> tuple[list[float], int]:
        s = SpatialSearch(graph, cost, 2, list(cost.devices), cuts, tuple(tails), 0.3, None)
        ends = s.run_tails(beam=None, branch=None, incumbent=(INF, INF), slack=competing)
        return _best_per_tail(ends, tails), s.stats.states

    (alone, expanded), (competing, fewer) = run(None), run(slack)
    assert fewer <= expanded  # the shared bound only prunes
    best = min(alone)
    assert math.isclose(min(competing), best, rel_tol=1e-9)
    for got, want in zip(competing, alone):
        if want < best * (1 + slack) * (1 - 1e-9):  # within the slack of the best: found exactly
            assert math.isclose(got, want, rel_tol=1e-9), (got, want, best)
        else:  # bounded away, or found all the same
            assert got >= want - 1e-9


def test_shared_bounds_take_the_other_kinds_best_with_slack():
    best = {"spatial": 150.0, "hybrid": 80.0}
    got = _shared(best, "latency")
    assert got == {"spatial": 80.0 * (1 + BOUND_SLACK), "hybrid": 80.0}
    assert _shared(best, "throughput") == best  # the searches' totals are latencies: no bound on throughput
    assert _shared({"spatial": 150.0}, "latency") == {"spatial": 150.0}  # alone, a kind keeps its own bound
    assert _shared({"spatial": INF, "hybrid": INF}, "latency") == {"spatial": INF, "hybrid": INF}


def test_a_kind_left_without_plans_by_the_other_says_so():
    cands = {"spatial": [[], []], "hybrid": [[(80.0, None)], [(90.0, None)]]}
    got = _outcompeted("spatial", cands, "latency", incumbent=120.0)
    assert isinstance(got, Dominated) and "of 80 ms, the best plan of another planner (hybrid)" in str(got)
    assert _outcompeted("spatial", cands, "latency", incumbent=float("inf")) is not None  # no other planner's plan
    # the incumbent bounded it as tightly: the usual message (within 15% of the incumbent) is the reason
    assert _outcompeted("spatial", cands, "latency", incumbent=80.0) is None
    assert _outcompeted("hybrid", cands, "latency", incumbent=120.0) is None  # it has plans
    assert _outcompeted("spatial", cands, "throughput", incumbent=120.0) is None
