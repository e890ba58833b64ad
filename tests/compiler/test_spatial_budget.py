"""The spatial and hybrid searches at fleet scale (issue 42 item 4): device classes and groups drawn from
them (spatial_groups.py), the node budget, and what a truncated search reports."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgec.compiler.cluster import ClusterModel, DeviceSpec, LinkSpec, load_profile
from edgec.compiler.cost import build_cost_table
from edgec.compiler.plan.planner import InfeasibleError, PlanOptions
from edgec.compiler.plan.spatial import plan_jointly, search_hybrid
from edgec.compiler.plan.spatial_groups import MIXES, class_ids, device_classes, groups
from edgec.compiler.plan.spatial_search import INF, SpatialSearch
from edgec.compiler.plan.stats import recording
from edgec.compiler.spatial import spatial_cuts
from tests.compiler.test_spatial import graph_of
from tests.conftest import conv_chain_model

PROFILES = {n: load_profile(n) for n in ("rpi5", "rpi4")}


def cluster(kinds, memory=None, links=None, mbps=100.0) -> ClusterModel:
    devs = tuple(DeviceSpec(f"d{i}", PROFILES[k], (memory or {}).get(i, PROFILES[k].memory_mb), None)
                 for i, k in enumerate(kinds))
    return ClusterModel(devs, mbps, 1.0, "switched", links or {}, "test.yaml")


def test_classes_are_devices_alike_in_figures_memory_and_links():
    graph = graph_of(conv_chain_model(n=2, channels=4, size=8))
    cost = build_cost_table(graph, cluster(["rpi5", "rpi5", "rpi4", "rpi5", "rpi4"], memory={3: 1000.0}))
    assert class_ids(cost) == {"d0": 0, "d1": 0, "d2": 2, "d3": 3, "d4": 2}
    assert device_classes(cost, ["d1", "d4", "d0", "d2"]) == ["d1", "d4"]
    # d1 alone has a slow link to d2: d0 and d1 differ in their links to a third device, d2 and d4 too
    slow = {frozenset(("d1", "d2")): LinkSpec(10.0, 1.0)}
    linked = build_cost_table(graph, cluster(["rpi5", "rpi5", "rpi4", "rpi5", "rpi4"], links=slow))
    assert class_ids(linked) == {"d0": 0, "d1": 1, "d2": 2, "d3": 0, "d4": 4}
    # an override equal to the network's default changes nothing
    same = {frozenset(("d1", "d2")): LinkSpec(100.0, 1.0)}
    assert class_ids(build_cost_table(graph, cluster(["rpi5", "rpi5", "rpi4"], links=same))) == {"d0": 0, "d1": 0, "d2": 2}


def test_few_mixes_are_every_mix_and_many_are_the_fastest_prefixes():
    graph = graph_of(conv_chain_model(n=2, channels=4, size=8))
    few = groups(build_cost_table(graph, cluster(["rpi5", "rpi5", "rpi4"])))
    assert few.every_mix and sorted(map(sorted, few.groups)) == [["d0", "d1"], ["d0", "d1", "d2"], ["d0", "d2"]]
    # 40 devices, each its own class: 2^40 mixes, counted, never built
    many_cost = build_cost_table(graph, cluster(["rpi4", "rpi5"] * 20, memory={i: 2000.0 + i for i in range(40)}))
    many = groups(many_cost)
    assert not many.every_mix and 2 ** 40 > MIXES
    assert [len(g) for g in many.groups] == [2, 4, 8, 16, 32, 40]
    total = many_cost.layer_ms.sum(axis=0)
    fastest = sorted(range(40), key=lambda i: total[i])
    assert many.groups[1] == [f"d{i}" for i in fastest[:4]]
    assert "fastest 2, 4, 8, 16, 32, 40 devices" in many.rule


def _ends(graph, cost, nodes):
    cuts = spatial_cuts(graph, 2)
    rest = [float(cost.layer_ms[c:, 0].sum()) for c in cuts]
    s = SpatialSearch(graph, cost, 2, list(cost.devices), cuts, rest, 0.3, None, nodes_left=nodes)
    ends = s.run(beam=None, branch=None)
    return s, min([INF, *(t for t, _ in ends.values())])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(6, 12), kinds=st.sampled_from([("rpi5", "rpi4"), ("rpi5", "rpi5", "rpi4"), ("rpi4", "rpi5", "rpi4", "rpi5")]),
       mbps=st.sampled_from([10.0, 100.0, 1000.0]), nodes=st.integers(0, 60))
def test_a_truncated_search_bounds_what_it_left(size, kinds, mbps, nodes):
    """An exact search stopped by its node budget: the best plan it found, or its bound on what it did not
    search, is no worse than the unbudgeted optimum; with the budget unspent it finds the optimum."""
    graph = graph_of(conv_chain_model(n=3, channels=4, size=size))
    cost = build_cost_table(graph, cluster(list(kinds), mbps=mbps))
    full, want = _ends(graph, cost, None)
    cut, got = _ends(graph, cost, nodes)
    assert cut.stats.nodes_visited <= full.stats.nodes_visited
    if cut.stats.truncated:
        assert not cut.stats.exact
        assert min(got, cut.stats.unsearched_ms) <= want + 1e-9
        assert got >= want - 1e-9
    else:
        assert math.isclose(got, want, rel_tol=1e-9) or got == want == INF
    big, best = _ends(graph, cost, 10**9)
    assert best == want and not big.stats.truncated


def test_auto_reports_the_budget_and_the_groups_it_truncated():
    """plan_jointly under a budget of a few nodes: --json's detail says the searches were truncated, how many,
    and the bound of what they left; on many distinct devices, that the groups were the fastest prefixes."""
    graph = graph_of(conv_chain_model(n=4, channels=8, size=32))
    cost = build_cost_table(graph, cluster(["rpi5", "rpi4"] * 10, memory={i: 2000.0 + i for i in range(20)}))
    with recording() as rec:
        found = plan_jointly(graph, cost, "latency", PlanOptions(search_nodes=5, jobs=1))
    d = rec["detail"]
    assert d["truncated"] is True and "fastest 2, 4, 8, 16, 20 devices" in d["groups"]
    assert d["truncated_searches"] >= 1 and math.isfinite(d["unsearched_bound_ms"])
    assert rec["work"]["nodes"] <= 5 + d["searches"]  # a partition search stops one node past its budget
    for got in found.values():
        assert isinstance(got, (list, InfeasibleError))


def test_a_spent_budget_without_a_plan_says_so():
    graph = graph_of(conv_chain_model(n=4, channels=8, size=32))
    cost = build_cost_table(graph, cluster(["rpi5", "rpi4", "rpi5"], memory={2: 1000.0}))
    try:
        plan, stats = search_hybrid(graph, cost, nodes=0)
    except InfeasibleError as exc:
        assert "search budget of 0 partition-tree nodes ran out" in str(exc)
    else:
        raise AssertionError(f"a search with no nodes found {plan}")
