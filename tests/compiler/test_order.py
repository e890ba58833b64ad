"""Contention-aware send order (compiler/cost/order.py): it helps where it provably should, it is never
predicted worse than tile order, simulate replays it exactly, and nothing changes where order cannot matter."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table, evaluate, simulate_manifest
from edgec.compiler.cost.order import EXACT_LIMIT, exchange_order
from edgec.compiler.cost.tiles import _Timeline, predict_stage
from edgec.compiler.emit import assemble_manifest, build_fragments, write_output
from edgec.compiler.ingest import load_model
from edgec.compiler.plan_types import Plan, Stage
from edgec.runtime.manifest import load_manifest
from tests.compiler.test_tiles import blocks_net, plan_of, run_verified, spatial_stage
from tests.conftest import conv_chain_model


def write_cluster(tmp: Path, profiles: list[str], medium: str) -> Path:
    doc = {"devices": [{"name": f"d{i}", "profile": p} for i, p in enumerate(profiles)],
           "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": medium}}
    path = tmp / f"cluster-{'-'.join(profiles)}-{medium}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def setup(tmp: Path, model: Path, profiles: list[str], medium: str):
    ing = load_model(model)
    cost = build_cost_table(ing.graph, load_cluster(write_cluster(tmp, profiles, medium)), ing.sha256)
    return ing, cost


def chain(tmp: Path) -> Path:
    path = tmp / "chain.onnx"
    onnx.save(conv_chain_model(n=4, channels=64, size=32), path)
    return path


def emit(ing, cost, plan: Plan, pred, out: Path) -> dict:
    frags = build_fragments(ing, plan, pred)
    manifest = assemble_manifest(ing, plan, pred, frags, cost.cluster.to_dict(), out, {"strategy": "manual"})
    write_output(out, manifest, frags)
    return manifest


def slow_last(ing) -> Plan:
    """Equal row bands on a laptop (the stage's device, which keeps the first band), a laptop and a Pi 4:
    in tile order the scatter serves the fast laptop first and the slow Pi 4, the critical path, waits."""
    return plan_of(ing.graph, spatial_stage(ing.graph, ["d0", "d1", "d2"], 2, fused=True))


def test_scatter_serves_the_slowest_tile_first(tmp_path):
    ing, cost = setup(tmp_path, chain(tmp_path), ["laptop", "laptop", "rpi4"], "switched")
    plan = slow_last(ing)
    fixed = evaluate(plan, ing.graph, cost, contention_order=False)
    ordered = evaluate(plan, ing.graph, cost)
    # the scatter's one sender serves d2 (needs index 2) before d1: the stage is shorter by d1's message
    assert ordered.send_order[0][0] == ((2, 1, 0),)
    d1_message = next(t.ms for t in fixed.transfers if t.dst == "d1" and t.src == "d0")
    assert ordered.latency_ms == pytest.approx(fixed.latency_ms - d1_message, rel=1e-9)
    manifest = emit(ing, cost, plan, ordered, tmp_path / "o")
    scatter = [s["to"] for s in manifest["steps"]["d0"] if s["op"] == "send"][:2]
    assert scatter == ["d2", "d1"]
    sim = simulate_manifest(load_manifest(tmp_path / "o/manifest.json"))
    assert sim["latency_ms"] == pytest.approx(ordered.latency_ms, rel=1e-4)  # manifest times: 4 decimals
    run_verified(tmp_path / "o")  # the runtime runs the reordered schedule to the whole model's outputs


def test_an_order_that_loses_on_the_channel_later_is_not_kept(tmp_path):
    """On one shared channel the same scatter order lets the fast tile finish first and hold the channel
    with its gather while the slow tile's gather waits: worse overall, so the stage keeps tile order."""
    ing, cost = setup(tmp_path, chain(tmp_path), ["laptop", "laptop", "rpi4"], "shared")
    plan = slow_last(ing)
    jackson = predict_stage(plan.stages[0], ing.graph, cost, order=(((2, 1, 0),), ((0,), (0,), (0,))))
    tile_order = predict_stage(plan.stages[0], ing.graph, cost)
    assert jackson["latency_ms"] > tile_order["latency_ms"]
    ordered = evaluate(plan, ing.graph, cost)
    assert ordered.send_order == {}
    assert ordered.latency_ms == evaluate(plan, ing.graph, cost, contention_order=False).latency_ms


@pytest.mark.parametrize("medium", ["switched", "shared"])
def test_halo_orders_replay_as_predicted_and_never_worse(medium, tmp_path):
    """Uneven tiles over residual blocks, a segment per block (halo exchanges with two senders per
    receiver): every plan is predicted no worse than in tile order, and the replay of what is emitted
    agrees with the prediction."""
    ing, cost = setup(tmp_path, blocks_net(tmp_path / "m.onnx"), ["laptop", "rpi4", "phone", "rpi5", "rpi4"], medium)
    devs = ["d0", "d1", "d2", "d3", "d4"]
    reordered = 0
    for seed in range(6):
        plan = plan_of(ing.graph, spatial_stage(ing.graph, devs, 2, rng=np.random.default_rng(seed)))
        fixed = evaluate(plan, ing.graph, cost, contention_order=False)
        ordered = evaluate(plan, ing.graph, cost)
        assert ordered.latency_ms <= fixed.latency_ms
        assert ordered.bottleneck_ms <= fixed.bottleneck_ms
        if ordered.send_order:
            reordered += 1
            assert ordered.latency_ms < fixed.latency_ms or ordered.bottleneck_ms < fixed.bottleneck_ms
            out = tmp_path / f"o{seed}"
            emit(ing, cost, plan, ordered, out)
            sim = simulate_manifest(load_manifest(out / "manifest.json"))
            assert sim["latency_ms"] == pytest.approx(ordered.latency_ms, rel=1e-4)  # manifest times: 4 decimals
    assert reordered  # the instances exercise a reordering


def test_pipeline_and_two_device_plans_are_emitted_byte_identical(tmp_path):
    """Where no sender has two messages in one exchange, order cannot matter: the manifest is the same."""
    ing, cost = setup(tmp_path, chain(tmp_path), ["laptop", "rpi4", "rpi5"], "shared")
    n = len(ing.graph.layers)
    plans = [Plan("manual", "latency", (Stage("d0", 0, 2), Stage("d1", 2, 4), Stage("d2", 4, n))).ensures(ing.graph),
             plan_of(ing.graph, spatial_stage(ing.graph, ["d0", "d1"], 2, fused=True))]
    for k, plan in enumerate(plans):
        ordered = evaluate(plan, ing.graph, cost)
        assert ordered.send_order == {}
        texts = []
        for name, pred in (("fixed", evaluate(plan, ing.graph, cost, contention_order=False)), ("ordered", ordered)):
            emit(ing, cost, plan, pred, tmp_path / f"{name}{k}")
            texts.append((tmp_path / f"{name}{k}/manifest.json").read_text())
        assert json.loads(texts[0])["steps"] and texts[0] == texts[1]


def _timeline(cost, clock: dict[str, float]) -> _Timeline:
    return _Timeline(cost, dict(clock))


def _real_makespan(tl: _Timeline, holders, needs, per_cell, tail, order) -> tuple[float, float]:
    """The objective of exchange_order, measured on the timeline's own exchange (not its fast replay)."""
    trial = tl.copy()
    ready = trial.exchange("x", per_cell, holders, needs, order)
    ends = [max(c, ready.get(d, 0.0)) + tail.get(d, 0.0) for d, c in trial.clock.items()]
    return max(ends), sum(ends)


@pytest.mark.parametrize("medium", ["switched", "shared"])
def test_exact_search_finds_the_brute_force_optimum(medium, tmp_path):
    """Two or three holders, overlapping needs, random clocks and remaining work: the order chosen is
    optimal over every combination of per-holder orders, each timed by _Timeline.exchange itself."""
    _, cost = setup(tmp_path, chain(tmp_path), ["laptop", "rpi4", "phone", "rpi5"], medium)
    devs = ["d0", "d1", "d2", "d3"]
    rng = np.random.default_rng(0)
    several = 0
    for _ in range(20):
        k = int(rng.integers(2, 4))
        cuts = sorted(rng.choice(np.arange(1, 32), k - 1, replace=False).tolist())
        edges = [0, *cuts, 32]
        holders = [(devs[i], ((edges[i], edges[i + 1]),)) for i in range(k)]
        needs = []
        for d in devs:
            a = int(rng.integers(0, 28))
            needs.append((d, ((a, int(rng.integers(a + 1, 33))),)))
        tl = _timeline(cost, {d: float(rng.uniform(0, 5)) for d in devs})
        tail = {d: float(rng.uniform(0, 50)) for d in devs}
        got = exchange_order(tl, holders, needs, 4096.0, tail)
        sends = [[n for n, (dst, need) in enumerate(needs) if dst != src and
                  min(need[0][1], have[0][1]) > max(need[0][0], have[0][0])] for src, have in holders]
        assert math.prod(math.factorial(len(s)) for s in sends) <= EXACT_LIMIT
        best = min(_real_makespan(tl, holders, needs, 4096.0, tail,
                                  tuple((*c, *(n for n in range(len(needs)) if n not in c)) for c in combo))
                   for combo in itertools.product(*(itertools.permutations(s) for s in sends)))
        # the makespan is the objective (one sender: Jackson's rule, which ignores the sum's tie-break)
        assert _real_makespan(tl, holders, needs, 4096.0, tail, got)[0] == pytest.approx(best[0], rel=1e-12)
        several += sum(1 for x in sends if x) > 1
    assert several >= 10


def test_one_sender_follows_longest_remaining_work(tmp_path):
    """The scatter (one sender): Jackson's rule, longest remaining work first, ties in need order."""
    _, cost = setup(tmp_path, chain(tmp_path), ["laptop", "rpi4", "phone", "rpi5"], "switched")
    whole = ((0, 32),)
    needs = [("d0", whole), ("d1", ((0, 8),)), ("d2", ((8, 16),)), ("d3", ((16, 32),))]
    tl = _timeline(cost, {d: 0.0 for d in ("d0", "d1", "d2", "d3")})
    got = exchange_order(tl, [("d0", whole)], needs, 4096.0, {"d0": 1.0, "d1": 5.0, "d2": 9.0, "d3": 5.0})
    assert got == ((2, 1, 3, 0),)
