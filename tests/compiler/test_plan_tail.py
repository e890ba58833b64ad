"""Hybrid's pipeline tails (PipelineTail): suffix tables sliced from the whole chain's are the suffix's own,
bit for bit, so every tail plan is what solving the suffix from scratch gives; and the DPs' k-best
selection (one sort) picks what K rounds of min-and-mask pick."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgec.compiler.cost import build_cost_table
from edgec.compiler.plan.pipeline import PipelineTail
from edgec.compiler.plan.pipeline_dp import _select_k, solve_on_tables, solve_pipeline
from edgec.compiler.plan.pipeline_tables import StageTables
from tests.compiler.test_pipeline_dp import problems
from tests.compiler.test_spatial import graph_of, make_cluster
from tests.conftest import residual_model

FIELDS = ("C", "mem_ok", "T", "lat_rest", "max_rest", "cls")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(dyadic=False, max_blocks=8), objective=st.sampled_from(["latency", "throughput"]))
def test_sliced_suffix_tables_are_the_suffix_tables(problem, objective):
    full = StageTables(problem)
    for first in range(problem.n_blocks):
        sub = problem.suffix(first)
        sliced, own = StageTables(sub, full, first), StageTables(sub)
        assert (sliced.B, sliced.D) == (own.B, own.D)
        for name in FIELDS:
            assert np.array_equal(getattr(sliced, name), getattr(own, name)), (first, name)
        try:
            want = solve_pipeline(sub, objective, top_k=3)
        except Exception as exc:  # the same refusal either way
            want = type(exc)
        try:
            got = solve_on_tables(sub, sliced, objective, 3, None)
        except Exception as exc:
            got = type(exc)
        assert got == want


def _select_k_rounds(p: np.ndarray, s: np.ndarray, K: int):
    """Reference: K rounds of (least p, then least s, then lowest index), each pick masked out."""
    p, s = p.copy(), s.copy()
    idxs, ps, ss = [], [], []
    for _ in range(K):
        pm = p.min(axis=-1, keepdims=True)
        idx = np.where(p == pm, s, np.inf).argmin(axis=-1)[..., None]
        vp = np.take_along_axis(p, idx, -1)
        idxs.append(idx)
        ps.append(vp)
        ss.append(np.where(np.isfinite(vp), np.take_along_axis(s, idx, -1), np.inf))
        np.put_along_axis(p, idx, np.inf, -1)
        np.put_along_axis(s, idx, np.inf, -1)
    return np.concatenate(idxs, -1), np.concatenate(ps, -1), np.concatenate(ss, -1)


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 4), n=st.integers(1, 12), K=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_select_k_picks_what_k_rounds_pick(rows, n, K, seed):
    rng = np.random.default_rng(seed)
    p = rng.integers(0, 3, size=(rows, n)).astype(float)  # few values: ties in p and in s
    s = rng.integers(0, 3, size=(rows, n)).astype(float)
    gone = rng.random((rows, n)) < 0.3
    p[gone], s[gone] = np.inf, np.inf  # a forbidden label: inf in both, as the DPs make them
    idx, vp, vs = _select_k(p, s, K)
    ridx, rp, rs = _select_k_rounds(p, s, K)
    assert np.array_equal(vp, rp) and np.array_equal(vs, rs)
    live = np.isfinite(rp)  # an exhausted slot's index is never followed back
    assert np.array_equal(idx[live], ridx[live])


def test_tail_is_the_suffix_solved_from_scratch():
    graph = graph_of(residual_model())
    cost = build_cost_table(graph, make_cluster(("rpi5", "rpi4", "rpi4"), 100.0, 0.5))
    tail = PipelineTail(graph, cost)
    for bi, (lo, _) in enumerate(graph.pipeline_blocks):
        sols = solve_pipeline(tail.problem.suffix(bi), "latency", top_k=3)
        sizes = [graph.tensors[t].nbytes for t in graph.live_across(lo)]
        for g in cost.devices:
            want = min(sum(cost.transfer_ms(nb, g, tail.problem.devices[s.stages[0].device]) for nb in sizes)
                       + s.latency_ms for s in sols)
            got, stages = tail.best(lo, g)
            assert math.isclose(got, want, rel_tol=0, abs_tol=0)
            assert stages and stages[0].lo == lo and stages[-1].hi == len(graph.layers)
