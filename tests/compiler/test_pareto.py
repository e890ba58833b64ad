"""`edgec compile --pareto`: the non-dominated (latency, throughput, energy) plans of every planner run.

The frontier holds the latency- and the throughput-optimal plans found, no point dominated by another, no
plan twice; energy is an axis only when every plan's energy is known; without --pareto nothing changes."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from edgec.compiler.api import compile as compile_api
from edgec.compiler.cli import cli
from edgec.compiler.cost import evaluate
from edgec.compiler.driver import compile_model
from edgec.compiler.plan.choose import pareto_points
from edgec.compiler.errors import UserError
from edgec.compiler.plan.frontier import Point, pareto_front, plan_key
from edgec.compiler.plan.pipeline_energy import energy_frontier
from edgec.compiler.plan.pipeline import plan_pipeline
from edgec.compiler.plan.planner import EnergyGoal, PlanOptions
from edgec.compiler.plan_types import Plan, Stage

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
TINY = MODELS / "tinychain.onnx"

# Three devices slow enough (1/100 of a laptop) that compute outweighs a 1 Gb/s link: pipelines pay off in
# throughput, a single fast device wins latency and the frugal one energy, so the frontier has a shape.
BASE = {"memory_mb": 4096, "usable_memory_fraction": 0.8, "runtime_overhead_mb": 50, "op_overhead_us": 5,
        "radio_nj_per_byte": {"tx": 100.0, "rx": 50.0}, "sources": ["test figures"]}


def _profile(name: str, gflops: float, gbps: float, idle: float, busy: float) -> dict:
    return BASE | {"name": name, "gflops": {"conv": gflops, "depthwise_conv": gflops / 4, "gemm": gflops,
                                            "other": gflops / 4}, "memory_gbps": gbps,
                   "power_w": {"idle": idle, "busy": busy}}


PROFILES = {"fast": _profile("fast", 2.0, 0.4, 4.0, 40.0), "mid": _profile("mid", 0.6, 0.12, 1.5, 9.0),
            "slow": _profile("slow", 0.2, 0.04, 0.5, 2.0)}


def _cluster(folder: Path, profiles: dict) -> Path:
    for name, doc in profiles.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    doc = {"devices": [{"name": n[0], "profile": f"{n}.yaml"} for n in profiles],
           "network": {"bandwidth_mbps": 1000.0, "latency_ms": 0.2}}
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return _cluster(tmp_path_factory.mktemp("three"), PROFILES)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """An energy-capable cluster of shipped profiles (power_w; the Orin has power modes)."""
    path = tmp_path_factory.mktemp("shipped") / "cluster.yaml"
    path.write_text("devices:\n  - {name: laptop, profile: laptop}\n  - {name: orin, profile: jetson-orin-nano-cuda}\n"
                    "  - {name: phone-a, profile: phone}\nnetwork: {bandwidth_mbps: 200, latency_ms: 1, medium: shared}\n")
    return path


def _axes(p: Point, energy: bool) -> tuple:
    return (p.latency_ms, -p.throughput_ips) + ((p.energy_mj,) if energy else ())


def _check_front(front: list[Point], points: list[Point], energy: bool) -> None:
    """The frontier's promises against every point it was taken from."""
    assert front, "an empty frontier from plans that exist"
    assert min(p.latency_ms for p in front) == min(p.latency_ms for p in points)
    assert max(p.throughput_ips for p in front) == max(p.throughput_ips for p in points)
    for a in front:
        for b in front:
            if a is not b:
                worse = all(x <= y for x, y in zip(_axes(b, energy), _axes(a, energy)))
                assert not (worse and _axes(b, energy) != _axes(a, energy)), (a, b)
    keys = [plan_key(p.plan) for p in front]
    assert len(keys) == len(set(keys))
    assert [p.latency_ms for p in front] == sorted(p.latency_ms for p in front)
    # every point left out is dominated by (or equal to) one kept
    kept = {plan_key(p.plan) for p in front}
    for p in points:
        if plan_key(p.plan) not in kept:
            assert any(all(x <= y for x, y in zip(_axes(f, energy), _axes(p, energy))) for f in front), p


# --------------------------------------------------------------------------------------------- unit


def _point(i: int, lat: float, thr: float, energy: float | None, strategy: str = "x") -> Point:
    pred = SimpleNamespace(latency_ms=lat, throughput_ips=thr, energy_mj=energy)
    return Point(strategy, Plan(strategy, "latency", (Stage(f"d{i}", 0, 1),)), pred)


@pytest.mark.parametrize("seed", range(20))
def test_front_of_random_points_keeps_the_optima_and_drops_only_dominated(seed):
    rng = random.Random(seed)
    points = [_point(rng.randrange(12), rng.choice([1.0, 2.0, 3.0, 4.0]), rng.choice([10.0, 20.0, 30.0]),
                     rng.choice([5.0, 6.0, 7.0])) for _ in range(15)]
    firsts = {}
    for p in points:
        firsts.setdefault(plan_key(p.plan), p)
    front, energy = pareto_front(points)
    assert energy
    _check_front(front, list(firsts.values()), energy)
    assert all(firsts[plan_key(p.plan)] is p for p in front), "a duplicate plan kept the later name"


def test_same_stages_are_one_point_and_the_first_name_wins():
    a, b = _point(0, 1.0, 10.0, 5.0, "pipeline"), _point(0, 1.0, 10.0, 5.0, "single")
    front, _ = pareto_front([a, b])
    assert [p.strategy for p in front] == ["pipeline"]


def test_an_unknown_energy_leaves_energy_out_of_the_axes():
    # with energy, the slow frugal plan would be kept; over latency and throughput it is dominated
    fast, frugal = _point(0, 1.0, 10.0, 9.0), _point(1, 2.0, 5.0, 1.0)
    assert len(pareto_front([fast, frugal])[0]) == 2
    front, energy = pareto_front([fast, frugal, _point(2, 3.0, 1.0, None)])
    assert not energy and front == [fast]


# --------------------------------------------------------------------------------------------- planned


def _compiled(cluster: Path, out: Path, objective: str, options: PlanOptions = PlanOptions()):
    return compile_model(TINY, cluster, out, "auto", objective, options=options, pareto=True)


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_front_of_every_planner_holds_both_optima(three, tmp_path, objective):
    res = _compiled(three, tmp_path / "out", objective)
    points = pareto_points(res.ingested.graph, res.cost, res.chosen, res.candidates, objective, PlanOptions())
    assert res.pareto_energy
    _check_front(list(res.pareto), points, energy=True)
    # whatever the objective, the exact pipeline optima of both are among the plans found
    for goal in ("latency", "throughput"):
        best = plan_pipeline(res.ingested.graph, res.cost, goal, PlanOptions(top_k=1))[0]
        pred = evaluate(best, res.ingested.graph, res.cost)
        assert min(p.latency_ms for p in res.pareto) <= pred.latency_ms
        assert max(p.throughput_ips for p in res.pareto) >= pred.throughput_ips
    assert len(res.pareto) >= 3  # this cluster has a real trade-off: a test of one point would prove little
    assert any(len(p.plan.stages) > 1 for p in res.pareto)


def test_energy_objective_front_has_the_energy_dp_frontier(three, tmp_path):
    goal = EnergyGoal(100.0)
    res = _compiled(three, tmp_path / "out", "energy", PlanOptions(energy=goal))
    points = pareto_points(res.ingested.graph, res.cost, res.chosen, res.candidates, "energy", PlanOptions(energy=goal))
    _check_front(list(res.pareto), points, energy=True)
    # the least energy within the SLA is not dominated: a plan beating it would be faster, so within it too
    assert plan_key(res.chosen.plan) in {plan_key(p.plan) for p in res.pareto}
    dp = energy_frontier(res.ingested.graph, res.cost, goal)
    assert len(dp) >= 2  # a fast hungry plan and a slow frugal one at least
    kept = {plan_key(p.plan) for p in res.pareto}
    assert any(plan_key(p) in kept for p in dp if p.stages != res.chosen.plan.stages)


def test_shipped_profiles_front_is_over_energy_too(shipped, tmp_path):
    summary = compile_api(TINY, shipped, tmp_path / "out", objective="energy", sla_ms=50.0, pareto=True)
    assert summary["pareto_axes"] == ["latency_ms", "throughput_ips", "energy_mj"]
    assert summary["pareto_energy_unknown"] is False
    front = summary["pareto"]
    assert all(p["predicted_energy_mj"] is not None for p in front)
    assert min(p["predicted_energy_mj"] for p in front) <= summary["predicted_energy_mj"]
    # the energy planner returns one plan; several power-mode choices can only come from its DP's frontier
    assert len({json.dumps(p["modes"], sort_keys=True) for p in front if p["modes"]}) >= 2, front
    for p in front:
        assert set(p) == {"strategy", "stages", "modes", "predicted_latency_ms", "predicted_throughput_ips",
                          "predicted_energy_mj"}
        assert p["stages"] and {"device", "layers", "first_layer", "last_layer", "spatial"} <= set(p["stages"][0])


def test_a_device_without_power_figures_leaves_energy_out(tmp_path):
    profiles = {name: {k: v for k, v in doc.items() if k != "power_w"} if name == "slow" else doc
                for name, doc in PROFILES.items()}
    summary = compile_api(TINY, _cluster(tmp_path, profiles), tmp_path / "out", pareto=True)
    assert summary["pareto_axes"] == ["latency_ms", "throughput_ips"]
    assert summary["pareto_energy_unknown"] is True
    for p in summary["pareto"]:
        used = {st["device"] for st in p["stages"]} | {d for st in p["stages"] for d in (st["spatial"] or {}).get("devices", [])}
        assert (p["predicted_energy_mj"] is None) == ("s" in used), p


# --------------------------------------------------------------------------------------------- surface


def test_without_pareto_nothing_changes(three, tmp_path):
    plain = compile_api(TINY, three, tmp_path / "a")
    front = compile_api(TINY, three, tmp_path / "b", pareto=True)
    assert not {"pareto", "pareto_axes", "pareto_energy_unknown"} & set(plain)
    assert "pareto" not in plain["timings"]
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    volatile = {"manifest", "compile_seconds", "timings", "planning", "pareto", "pareto_axes", "pareto_energy_unknown"}
    assert {k: v for k, v in front.items() if k not in volatile} == {k: v for k, v in plain.items() if k not in volatile}


def test_cli_prints_the_frontier(three, tmp_path):
    res = CliRunner().invoke(cli, ["compile", str(TINY), "--devices", str(three), "-o", str(tmp_path / "o"),
                                   "--pareto", "--json"], prog_name="edgec")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["pareto"]) >= 3
    res = CliRunner().invoke(cli, ["compile", str(TINY), "--devices", str(three), "-o", str(tmp_path / "o"),
                                   "--pareto"], prog_name="edgec")
    assert res.exit_code == 0, res.output
    assert "Pareto frontier over latency_ms, throughput_ips, energy_mj:" in res.stdout


def test_pareto_must_be_a_bool(three, tmp_path):
    with pytest.raises(UserError, match="pareto 'yes'"):
        compile_api(TINY, three, tmp_path / "o", pareto="yes")
    assert not (tmp_path / "o").exists()


def test_no_point_is_another_with_alike_devices_swapped(tmp_path):
    """Two alike devices: a pipeline and its mirror (the same stages, the devices swapped) predict alike, so
    neither dominates the other; the pipeline planner returns one of each such pair, and the frontier lists
    no mirror."""
    doc = PROFILES["mid"]
    cluster = tmp_path / "cluster.yaml"
    (tmp_path / "mid.yaml").write_text(yaml.safe_dump(doc))
    cluster.write_text(yaml.safe_dump({"devices": [{"name": n, "profile": "mid.yaml"} for n in ("a", "b")],
                                       "network": {"bandwidth_mbps": 1000.0, "latency_ms": 0.2}}))
    res = _compiled(cluster, tmp_path / "out", "throughput")
    split = [tuple((s.lo, s.hi) for s in p.plan.stages) for p in res.pareto if p.strategy == "pipeline"]
    assert any(len(s) > 1 for s in split)
    assert len(split) == len(set(split)), split
