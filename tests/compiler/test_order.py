"""Contention-aware send order (compiler/cost/order.py): it helps where it provably should, it is never
predicted worse than tile order (a spatial stage's exchanges) or `hops` order (a stage's burst of messages
to several later stages), simulate replays it exactly, and nothing changes where order cannot matter."""

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
from edgec.compiler.cost.evaluate import _predict, _StageTimes
from edgec.compiler.cost.order import EXACT_LIMIT, exchange_order
from edgec.compiler.cost.stage_timeline import _Timeline, predict_stage
from edgec.compiler.emit import assemble_manifest, build_fragments, write_output
from edgec.compiler.ingest import load_model
from edgec.compiler.plan_types import Plan, Stage
from edgec.runtime.manifest.load import load_manifest
from tests.compiler.test_tiles import Net, blocks_net, plan_of, run_verified, spatial_stage
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
        assert ordered.send_order == {} and ordered.burst_order == {}
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


def fan_net(path: Path, depths: tuple[int, ...]) -> Path:
    """A stem, then one branch of `depths[i]` conv layers per i, all reading the stem's output, concatenated
    and classified: layer 0 is the stem, then each branch's layers in turn (`branch_stages`)."""
    n = Net(2, 3, 32, 32)
    stem = n.act(n.conv("x", 32))
    ends = []
    for depth in depths:
        t = stem
        for _ in range(depth):
            t = n.act(n.conv(t, 32))
        ends.append(t)
    return n.save(n.conv(n.merge("Concat", ends), 8, k=1, p=0), path)


def branch_stages(ing, depths: tuple[int, ...], devices: list[str]) -> Plan:
    """The stem on devices[0], branch i on devices[i + 1], the head on devices[-1]: the stem's stage sends
    its output to every branch's stage, one burst."""
    bounds = [0, *itertools.accumulate(depths, initial=1), len(ing.graph.layers)]
    stages = tuple(Stage(d, a, b) for d, a, b in zip(devices, bounds, bounds[1:]))
    return Plan("manual", "latency", stages).ensures(ing.graph)


def test_burst_serves_the_longer_branch_first(tmp_path):
    """The stem's stage sends the stem's output to a short branch on a laptop (stage 1) and a long one on a
    Pi 4 (stage 2), whose result then crosses the network again: `hops` order serves stage 1 first, and
    the Pi 4, the critical path, waits a whole message for it."""
    ing, cost = setup(tmp_path, fan_net(tmp_path / "fan.onnx", (1, 3)), ["laptop", "laptop", "rpi4"], "switched")
    plan = branch_stages(ing, (1, 3), ["d0", "d1", "d2", "d1"])
    fixed = evaluate(plan, ing.graph, cost, contention_order=False)
    ordered = evaluate(plan, ing.graph, cost)
    assert [(a, b) for _, a, b in ordered.hops if a == 0] == [(0, 1), (0, 2)]
    assert ordered.burst_order == {0: (1, 0)}
    to_d2 = next(t.ms for t in fixed.transfers if t.dst == "d2")
    assert ordered.latency_ms == pytest.approx(fixed.latency_ms - to_d2, rel=1e-9)
    assert ordered.bottleneck_ms == fixed.bottleneck_ms  # order moves no work: the same holds
    manifest = emit(ing, cost, plan, ordered, tmp_path / "o")
    assert [s["to"] for s in manifest["steps"]["d0"] if s["op"] == "send"] == ["d2", "d1"]
    sim = simulate_manifest(load_manifest(tmp_path / "o/manifest.json"))
    assert sim["latency_ms"] == pytest.approx(ordered.latency_ms, rel=1e-4)  # manifest times: 4 decimals
    run_verified(tmp_path / "o")  # the runtime runs the reordered burst to the whole model's outputs


def test_burst_on_a_shared_channel_replays_as_predicted(tmp_path):
    ing, cost = setup(tmp_path, fan_net(tmp_path / "fan.onnx", (1, 3)), ["laptop", "laptop", "rpi4"], "shared")
    plan = branch_stages(ing, (1, 3), ["d0", "d1", "d2", "d1"])
    ordered = evaluate(plan, ing.graph, cost)
    assert ordered.burst_order == {0: (1, 0)}
    assert ordered.latency_ms < evaluate(plan, ing.graph, cost, contention_order=False).latency_ms
    emit(ing, cost, plan, ordered, tmp_path / "o")
    sim = simulate_manifest(load_manifest(tmp_path / "o/manifest.json"))
    assert sim["latency_ms"] == pytest.approx(ordered.latency_ms, rel=1e-4)


def test_burst_already_in_the_best_order_is_emitted_unchanged(tmp_path):
    """The long branch is stage 1, which `hops` order serves first anyway: no order is recorded and the
    manifest is byte for byte the one in `hops` order."""
    ing, cost = setup(tmp_path, fan_net(tmp_path / "fan.onnx", (3, 1)), ["laptop", "rpi4", "laptop"], "switched")
    plan = branch_stages(ing, (3, 1), ["d0", "d1", "d2", "d2"])
    ordered = evaluate(plan, ing.graph, cost)
    assert ordered.burst_order == {}
    texts = []
    for name, pred in (("fixed", evaluate(plan, ing.graph, cost, contention_order=False)), ("ordered", ordered)):
        emit(ing, cost, plan, pred, tmp_path / name)
        texts.append((tmp_path / name / "manifest.json").read_text())
    assert texts[0] == texts[1]


def test_bursts_take_the_channel_first_come_first_served(tmp_path):
    """Both branches send to the head on the stem's device over one shared channel. With the long branch
    served first, its stage is through computing before the short one's and takes the channel first
    (the coordinator grants it first come first served): the prediction of that order is what the
    replay of its manifest gives, not the stage order's."""
    ing, cost = setup(tmp_path, fan_net(tmp_path / "fan.onnx", (1, 3)), ["laptop", "laptop", "rpi4"], "shared")
    plan = branch_stages(ing, (1, 3), ["d0", "d1", "d2", "d0"])
    fixed = evaluate(plan, ing.graph, cost, contention_order=False)
    served = _predict(plan, ing.graph, cost, {}, _StageTimes(fixed.stage_ms, fixed.stage_ms), list(fixed.hops), {0: (1, 0)})
    sends = sorted((e.start_ms, e.device) for e in served.timeline if e.kind == "transfer" and e.device != "d0")
    assert [d for _, d in sends] == ["d2", "d1"]
    emit(ing, cost, plan, served, tmp_path / "o")
    sim = simulate_manifest(load_manifest(tmp_path / "o/manifest.json"))
    assert sim["latency_ms"] == pytest.approx(served.latency_ms, rel=1e-6)


def _random_plans(ing, depths: tuple[int, ...], rng, devices: list[str], count: int):
    """`count` plans: every other one a stage per branch (branch_stages) on distinct random devices, the
    head on a random one (maybe a branch's: a message that stays on its device); the others 3 to 5 stages
    at random cuts, each on its own device."""
    n = len(ing.graph.layers)
    for j in range(count):
        devs = [str(d) for d in rng.permutation(devices)]
        if j % 2 == 0:
            yield branch_stages(ing, depths, [*devs[:len(depths) + 1], str(rng.choice(devices))])
            continue
        k = int(rng.integers(3, 6))
        bounds = [0, *sorted(rng.choice(np.arange(1, n), k - 1, replace=False).tolist()), n]
        yield Plan("manual", "latency", tuple(Stage(d, a, b) for d, a, b in zip(devs, bounds, bounds[1:]))).ensures(ing.graph)


@pytest.mark.parametrize("medium", ["switched", "shared"])
def test_burst_order_is_never_worse_and_optimal(medium, tmp_path):
    """Random plans of fan nets: never predicted worse than `hops` order; strictly better whenever an
    order is recorded, and then the replay of what is emitted agrees; and where one stage sends to several
    stages, the order found is as good as the best of every permutation of its messages (interleavings
    included), each timed by _predict (on a switched network a theorem, on the shared channel true of
    these instances)."""
    devices = ["d0", "d1", "d2", "d3", "d4"]
    rng = np.random.default_rng(7)
    reordered = brute_forced = 0
    for m, depths in enumerate([(1, 3, 2), (3, 1), (1, 4, 1), (2, 1, 3)]):
        ing, cost = setup(tmp_path, fan_net(tmp_path / f"fan{m}.onnx", depths), ["laptop", "rpi4", "phone", "rpi5", "rpi4"],
                          medium)
        for plan in _random_plans(ing, depths, rng, devices, 16):
            fixed = evaluate(plan, ing.graph, cost, contention_order=False)
            ordered = evaluate(plan, ing.graph, cost)
            assert ordered.latency_ms <= fixed.latency_ms and ordered.bottleneck_ms <= fixed.bottleneck_ms
            if ordered.burst_order:
                reordered += 1
                assert ordered.latency_ms < fixed.latency_ms
                emit(ing, cost, plan, ordered, tmp_path / "o")
                sim = simulate_manifest(load_manifest(tmp_path / "o/manifest.json"))
                assert sim["latency_ms"] == pytest.approx(ordered.latency_ms, rel=1e-4)
            brute_forced += _check_exact(plan, ing, cost, ordered)
    assert reordered >= 2 and brute_forced >= 20


def _check_exact(plan: Plan, ing, cost, ordered) -> bool:
    """Where exactly one stage sends to several stages, each over the network: the prediction is the best
    of every permutation of that stage's messages. False where the check does not apply."""
    hops, devs = list(ordered.hops), [s.device for s in plan.stages]
    several = [k for k in range(len(plan.stages)) if len({b for _, a, b in hops if a == k}) > 1]
    if len(several) != 1 or any(devs[a] == devs[b] for _, a, b in hops if a == several[0]):
        return False
    k = several[0]
    count = sum(1 for _, a, _ in hops if a == k)
    best = min(_predict(plan, ing.graph, cost, {}, _StageTimes(ordered.stage_ms, ordered.stage_ms), hops, {k: perm}).latency_ms
               for perm in itertools.permutations(range(count)))
    assert ordered.latency_ms == pytest.approx(best, rel=1e-12)
    return True
