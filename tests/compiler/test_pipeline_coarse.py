"""pipeline_coarse.py: on chains of more than COARSE_ABOVE blocks the planner solves coarse groups exactly and
refines each boundary; its plans are real, never better than the exact DP's, and reported inexact with a gap
that bounds their distance to the optimum. The layer graph's footprints, summed in one sweep, equal their
definition."""

from __future__ import annotations

import numpy as np
import pytest

import edgec.compiler.plan.pipeline_coarse as coarse
from edgec.compiler.graph import LayerGraph
from edgec.compiler.ingest import load_model
from edgec.compiler.plan.pipeline_dp import solve_pipeline
from edgec.compiler.plan.pipeline_problem import PIPELINE_OBJECTIVES
from test_pipeline_dp import check_solution, make_problem
from tests.conftest import residual_model

MB = 1_000_000


def _chain(B: int, D: int, seed: int, medium: str = "switched"):
    rng = np.random.default_rng(seed)
    speed = rng.uniform(0.5, 2.0, size=D)
    block = rng.uniform(0.05, 0.2, size=B)
    bw = np.full((D, D), 2000.0)
    return make_problem(block[:, None] * speed[None, :], [MB // 4] * B, [MB // 8] * B, [4096] * (B - 1),
                        [60 * MB] * D, bw, np.full((D, D), 0.5), medium)


@pytest.mark.parametrize("objective", PIPELINE_OBJECTIVES)
@pytest.mark.parametrize("seed", [0, 1])
def test_coarse_plans_are_real_and_within_their_gap(objective, seed, monkeypatch):
    """300 blocks, coarsened into 40 groups (thresholds lowered to keep the exact DP quick): 75 MB of
    weights on 60 MB devices forces a split."""
    monkeypatch.setattr(coarse, "COARSE_ABOVE", 100)
    monkeypatch.setattr(coarse, "GROUPS", 40)
    problem = _chain(300, 3, seed)
    exact = solve_pipeline(problem, objective, top_k=3, copies=False)
    report: dict = {}
    got = coarse.solve_chain(problem, objective, 3, report=report)
    assert report["exact"] is False and report["optimality_gap"] >= 0.0
    for sol in got:
        check_solution(problem, sol)
    best, opt = got[0].key(objective)[0], exact[0].key(objective)[0]
    assert best >= opt * (1 - 1e-12)
    assert best / (1.0 + report["optimality_gap"]) <= opt * (1 + 1e-9)
    assert best <= opt * 1.05  # refinement recovers the exact plan's boundaries to within 5% here
    assert len({s.stages for s in got}) == len(got)


def test_short_chains_take_the_exact_dp(monkeypatch):
    problem = _chain(50, 3, 2)
    report: dict = {}
    got = coarse.solve_chain(problem, "latency", 3, report=report)
    assert report["exact"] is True
    assert [s.stages for s in got] == [s.stages for s in solve_pipeline(problem, "latency", top_k=3, copies=False)]


def _footprints_by_definition(g: LayerGraph) -> tuple[int, ...]:
    last_use = {t: max(users) for t, users in g.consumers.items()}
    out = []
    for layer in g.layers:
        i = layer.index
        live = {t for t, p in g.producer.items() if p < i and last_use.get(t, -1) > i}
        live |= set(layer.inputs) | set(layer.outputs)
        out.append(sum(g.tensors[t].nbytes for t in live if t in g.tensors))
    return tuple(out)


def test_footprints_equal_their_definition(tmp_path):
    import onnx

    path = tmp_path / "residual.onnx"
    onnx.save(residual_model(), path)
    g = load_model(path).graph
    assert any(len(g.live_across(c)) > 1 for c in range(1, len(g.layers)))  # a skip: tensors live through layers
    assert g.footprint_bytes == _footprints_by_definition(g)
