"""Multi-tensor pipeline cuts: the DP prices every crossing tensor as its own message, forwarded stage to
stage, and equals brute force over the layer graph (a broadcast tensor; the tinytransformer model) and
over random problems whose cuts carry several tensors."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table, evaluate
from edgec.compiler.cost.evaluate import tensor_hops
from edgec.compiler.ingest import load_model
from edgec.compiler.plan.pipeline_dp import solve_pipeline
from edgec.compiler.plan.pipeline_problem import pipeline_problem, to_plan, validate_request
from edgec.compiler.plan.planner import InfeasibleError
from pipeline_reference import brute_force, brute_force_layers
from edgec.compiler.plan.pipeline_problem import PIPELINE_OBJECTIVES
from test_pipeline_dp import check_solution, keys, problems

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])


def broadcast_model(n: int = 5, width: int = 256, seed: int = 3) -> onnx.ModelProto:
    """A chain of MatMul, Add(., m) pairs where m = ReduceMean(x) (4 bytes) feeds every Add: a small
    tensor live across every cut after the first, beside one 1 KiB activation."""
    rng = np.random.default_rng(seed)
    inits = []
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1, name="mean")]
    prev = "x"
    for i in range(n):
        inits.append(numpy_helper.from_array(rng.normal(0, width ** -0.5, (width, width)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Add", [f"h{i}", "m"], [f"a{i}"], name=f"add{i}"))
        prev = f"a{i}"
    graph = helper.make_graph(nodes, "bcast", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, width])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def cluster(tmp_path, profiles, mbps, latency_ms, medium="switched"):
    doc = {"devices": [{"name": f"d{i}", "profile": p} for i, p in enumerate(profiles)],
           "network": {"bandwidth_mbps": mbps, "latency_ms": latency_ms, "medium": medium}}
    path = tmp_path / f"cluster-{medium}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_cluster(path)


def dp_plans(graph, cost, objective, k):
    """The DP's k best plans as (key, ((lo, hi, device name), ...)) in layers."""
    problem = pipeline_problem(graph, cost)
    out = []
    for sol in solve_pipeline(problem, objective, top_k=k):
        plan = to_plan(sol, "pipeline", objective, graph, problem)
        out.append((sol.key(objective), tuple((s.lo, s.hi, s.device) for s in plan.stages)))
    return out


def close(a, b):
    return a == pytest.approx(b, rel=1e-12, abs=1e-12)


def assert_dp_matches_reference(graph, cost, k=3):
    """The DP's k best equal brute force's up to rounding: the objective at every rank, the tie-break
    measure of the best (among plans whose objective differs from the best's only by rounding, the two
    sums are added in different orders), and each DP plan's price."""
    for objective in PIPELINE_OBJECTIVES:
        ref = brute_force_layers(graph, cost, objective, graph.pipeline_cuts)
        got = dp_plans(graph, cost, objective, k)
        assert len(got) == min(k, len(ref))
        for (gk, _), (rk, _) in zip(got, ref):
            assert close(gk[0], rk[0])
        assert close(got[0][0][1], min(rk[1] for rk, _ in ref if close(rk[0], ref[0][0][0])))
        ref_keys = dict((stages, key) for key, stages in ref)
        for key, stages in got:
            assert close(ref_keys[stages], key)


def test_broadcast_tensor_cuts_match_brute_force(tmp_path):
    path = tmp_path / "bcast.onnx"
    onnx.save(broadcast_model(), path)
    graph = load_model(path).graph
    assert graph.block_cuts == (1,)  # m is live across every later cut
    assert graph.pipeline_cuts == tuple(range(1, len(graph.layers)))
    # a message's latency (10 us) outweighs its bytes (1 KiB: 8 us), so pricing m and the activation as
    # one message, or not sending m, would put a key off by 10 us per cut
    cost = build_cost_table(graph, cluster(tmp_path, ["rpi4", "rpi5", "rpi5"], 1000, 0.01))
    assert_dp_matches_reference(graph, cost)
    (key, stages), = dp_plans(graph, cost, "throughput", 1)
    assert len(stages) == 3
    assert all(len(graph.live_across(lo)) == 2 for lo, _, _ in stages[1:])  # the best cuts carry two tensors


def test_shared_medium_broadcast_matches_brute_force(tmp_path):
    path = tmp_path / "bcast.onnx"
    onnx.save(broadcast_model(n=4), path)
    graph = load_model(path).graph
    assert_dp_matches_reference(graph, build_cost_table(graph, cluster(tmp_path, ["rpi4", "rpi5", "rpi5"], 1000, 0.01, "shared")))


def test_tinytransformer_matches_brute_force(tmp_path):
    graph = load_model(MODELS / "tinytransformer.onnx").graph
    new = sorted(set(graph.pipeline_cuts) - set(graph.block_cuts))
    assert {21, 22, 27, 28} <= set(new)  # attention/FFN and encoder boundaries of encoder 0
    cost = build_cost_table(graph, cluster(tmp_path, ["rpi4", "rpi5", "rpi5"], 1000, 0.05))
    assert_dp_matches_reference(graph, cost)


# ----------------------------------------------------------------------------------------------------
# random problems with several tensors per cut


@st.composite
def multi_tensor_problems(draw):
    """problems() with each cut's bytes split into 1-3 messages (multiples of 32 bytes, some empty), so
    sums stay exact and the per-message latency counts once per non-empty tensor."""
    problem = draw(problems())
    per_cut = []
    for total in np.asarray(problem.cut_bytes).tolist():
        units = int(total) // 32
        parts = draw(st.lists(st.integers(0, units), min_size=0, max_size=2))
        edges = sorted(parts)
        sizes = [b - a for a, b in zip([0, *edges], [*edges, units])]
        per_cut.append(tuple(32 * s for s in sizes))
    return replace(problem, cut_tensor_bytes=tuple(per_cut))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multi_tensor_problems())
def test_dp_equals_brute_force_with_several_tensors_per_cut(problem):
    for objective in PIPELINE_OBJECTIVES:
        ref = brute_force(problem, objective)
        if not ref:
            with pytest.raises(InfeasibleError):
                solve_pipeline(problem, objective)
            continue
        top = solve_pipeline(problem, objective, top_k=3)
        assert keys(top, objective) == keys(ref[:3], objective)
        for sol in top:
            check_solution(problem, sol)


def test_each_message_pays_the_link_latency():
    problem = replace(_two_device_problem(), cut_tensor_bytes=((64, 0, 32),))
    # 64 and 32 bytes at 32 bytes/ms, 0.5 ms each; the empty message is free
    assert problem.transfer_ms(0, 0, 1) == (2.0 + 0.5) + (1.0 + 0.5)
    (sol,) = solve_pipeline(problem, "throughput")
    assert sol.transfer_ms == (4.0,)


def test_rejects_cut_tensor_bytes_that_disagree_with_cut_bytes():
    with pytest.raises(ValueError, match="sums to 95"):
        validate_request(replace(_two_device_problem(), cut_tensor_bytes=((64, 31),)), "latency")
    with pytest.raises(ValueError, match="2 cuts, expected 1"):
        validate_request(replace(_two_device_problem(), cut_tensor_bytes=((64,), (32,))), "latency")


def _two_device_problem():
    from test_pipeline_dp import make_problem

    return make_problem([[8.0, 8.0], [8.0, 8.0]], [0, 0], [0, 0], [96], [10**9] * 2, np.full((2, 2), 32.0),
                        lat=np.full((2, 2), 0.5))


# ----------------------------------------------------------------------------------------------------
# routes: what the emitter sends is what evaluate timed, never worse than the DP's price


def four_pi_cost(tmp_path, graph, chain_only: bool):
    """4 rpi4 at 1000 Mbps / 0.1 ms; with chain_only, every other pair at 1 Mbps / 20 ms."""
    net = {"bandwidth_mbps": 1000, "latency_ms": 0.1}
    if chain_only:
        net = {"bandwidth_mbps": 1, "latency_ms": 20,
               "links": [{"a": f"pi{i}", "b": f"pi{i + 1}", "bandwidth_mbps": 1000, "latency_ms": 0.1} for i in range(3)]}
    path = tmp_path / f"four-{chain_only}.yaml"
    path.write_text(yaml.safe_dump({"devices": [{"name": f"pi{i}", "profile": "rpi4"} for i in range(4)], "network": net}))
    return build_cost_table(graph, load_cluster(path))


@pytest.mark.parametrize("chain_only", [False, True])
def test_mask_route_is_the_cheaper_one_and_no_worse_than_the_dp(tmp_path, chain_only):
    graph = load_model(MODELS / "tinytransformer.onnx").graph
    cost = four_pi_cost(tmp_path, graph, chain_only)
    problem = pipeline_problem(graph, cost)
    (sol,) = solve_pipeline(problem, "throughput")
    plan = to_plan(sol, "pipeline", "throughput", graph, problem)
    mask_stages = {k for k, s in enumerate(plan.stages) if any("reshape_0" in graph.layers[i].inputs for i in range(s.lo, s.hi))}
    assert len(plan.stages) == 4 and 1 not in mask_stages and 2 in mask_stages  # the mask skips stage 1
    pred = evaluate(plan, graph, cost)
    mask_hops = [(a, b) for t, a, b in pred.hops if t == "reshape_0"]
    assert mask_hops == ([(0, 1), (1, 2)] if chain_only else [(0, 2)])
    assert pred.hops == tuple(tensor_hops(plan, graph, frozenset() if chain_only else frozenset({"reshape_0"})))
    # never worse than the DP's price (every tensor forwarded); all forwarded, it is that price. (Up to
    # rounding: the DP sums layer times per block first, evaluate per stage.)
    tol = 1 + 1e-12
    assert pred.bottleneck_ms <= sol.bottleneck_ms * tol and pred.latency_ms <= sol.latency_ms * tol
    if chain_only:
        assert pred.latency_ms == pytest.approx(sol.latency_ms, rel=1e-12)
    else:
        assert pred.latency_ms < sol.latency_ms - 0.1  # the mask's second message (0.1 ms latency) is saved
