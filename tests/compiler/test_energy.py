"""Energy per request (cost/energy.py) in evaluate, simulate, compile --json and inspect; power modes in
profiles, clusters and manifests; `--objective energy --sla-ms` end to end and its errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from edgec.compiler.api import compile as compile_api
from edgec.compiler.cli import cli
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cluster.profile import validate_profile_dict
from edgec.compiler.cost import build_cost_table, evaluate, simulate_manifest
from edgec.compiler.cluster.power import DevicePower
from edgec.compiler.cost.energy import request_energy
from edgec.compiler.errors import UserError
from edgec.compiler.ingest import load_model
from edgec.compiler.plan_types import Plan, Stage
from edgec.runtime.errors import InputError
from edgec.runtime.manifest.load import load_manifest, parse_manifest

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
TINY = MODELS / "tinychain.onnx"

FAST = {"name": "fast", "memory_mb": 4096, "usable_memory_fraction": 0.8, "runtime_overhead_mb": 50,
        "op_overhead_us": 5, "gflops": {"conv": 200.0, "depthwise_conv": 50.0, "gemm": 200.0, "other": 50.0},
        "memory_gbps": 40.0, "power_w": {"idle": 4.0, "busy": 40.0},
        "radio_nj_per_byte": {"tx": 100.0, "rx": 50.0}, "sources": ["test figures"]}
SLOW = FAST | {"name": "slow", "gflops": {"conv": 20.0, "depthwise_conv": 5.0, "gemm": 20.0, "other": 5.0},
               "memory_gbps": 4.0, "power_w": {"idle": 0.5, "busy": 2.0}}
MODED = FAST | {"name": "moded", "mode": "max", "modes": {
    "eco": {"gflops": {"conv": 50.0, "depthwise_conv": 12.5, "gemm": 50.0, "other": 12.5}, "memory_gbps": 10.0,
            "power_w": {"idle": 1.0, "busy": 5.0}, "sources": ["test figures"]}}}


def write_cluster(folder: Path, profiles: dict[str, dict], devices: list[tuple[str, str]], mbps: float = 100.0) -> Path:
    for name, doc in profiles.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    doc = {"devices": [{"name": n, "profile": f"{p}.yaml"} for n, p in devices],
           "network": {"bandwidth_mbps": mbps, "latency_ms": 0.5}}
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="edgec")


def error_line(res) -> str:
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert "Traceback" not in res.stderr and res.stdout == ""
    return res.stderr.splitlines()[-1]


# ---------------------------------------------------------------------------------------------------
# the energy model


def test_request_energy_charges_used_devices_over_the_span():
    power = {"a": DevicePower(1.0, 5.0, 10.0, 20.0), "b": DevicePower(2.0, 3.0), "c": DevicePower(0.5, 9.0)}
    e = request_energy(10.0, {"a": 4.0, "b": 6.0}, {"a": 1e6}, {"b": 1e6}, power)
    assert e.devices["a"].compute_mj == pytest.approx(20.0) and e.devices["a"].idle_mj == pytest.approx(6.0)
    assert e.devices["a"].radio_mj == pytest.approx(10.0)  # 1e6 bytes x 10 nJ
    assert e.devices["b"].total_mj == pytest.approx(18.0 + 8.0)  # no radio figures: none charged
    assert e.total_mj == pytest.approx(36.0 + 26.0)
    assert e.idle_devices == {"c": 0.5}  # left out: reported, not charged


def test_request_energy_is_unknown_when_a_used_device_has_no_power():
    e = request_energy(5.0, {"a": 1.0, "b": 1.0}, {}, {}, {"a": DevicePower(1.0, 2.0), "b": DevicePower()})
    assert e.total_mj is None and e.unknown == ("b",)


def test_evaluate_prices_energy_from_its_own_timeline(tmp_path):
    cluster = load_cluster(write_cluster(tmp_path, {"fast": FAST, "slow": SLOW}, [("f", "fast"), ("s", "slow")]))
    ing = load_model(TINY)
    cost = build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)
    n = len(ing.graph.layers)
    cut = ing.graph.pipeline_cuts[len(ing.graph.pipeline_cuts) // 2]
    pred = evaluate(Plan("pipeline", "latency", (Stage("f", 0, cut), Stage("s", cut, n))), ing.graph, cost)
    sent = sum(t.nbytes for t in pred.transfers)
    assert sent > 0
    L, busy = pred.latency_ms, pred.busy_ms
    want = (40.0 * busy["f"] + 4.0 * (L - busy["f"]) + 100.0 * sent / 1e6
            + 2.0 * busy["s"] + 0.5 * (L - busy["s"]) + 50.0 * sent / 1e6)
    assert pred.energy_mj == pytest.approx(want, rel=1e-12)
    assert pred.to_dict()["energy_mj"] == round(want, 4)


# ---------------------------------------------------------------------------------------------------
# power modes


@pytest.mark.parametrize("change, message", [
    ({"modes": {"eco": {"power_w": {"idle": 3.0, "busy": 2.0}, "sources": ["x"]}}},
     "modes.eco.power_w.busy (2) is below its idle (3)"),
    ({"mode": "max"}, "mode 'max' names the top level's operating point, but there are no modes"),
    ({"mode": "eco", "modes": MODED["modes"]}, "modes.eco: the top level's operating point is already called 'eco'"),
    ({"power_w": {"idle": 1.0}, "modes": MODED["modes"]}, "modes need power_w (idle and busy) at the top level too"),
    ({"modes": {"eco": {"power_w": {"idle": 1.0, "busy": 2.0}}}}, "missing required key 'sources' in modes['eco']"),
    ({"modes": {"e co": MODED["modes"]["eco"]}},
     "modes: keys must be 1-32 characters from [A-Za-z0-9._-] starting with a letter or digit, got str 'e co'"),
])
def test_bad_modes_are_one_line_errors(change, message):
    with pytest.raises(UserError) as ei:
        validate_profile_dict(FAST | change, "board.yaml")
    assert str(ei.value).startswith("board.yaml: ") and message in str(ei.value)
    assert "\n" not in str(ei.value)


def test_a_mode_is_the_top_level_with_its_own_figures():
    p = validate_profile_dict(MODED, "moded.yaml")
    assert p.mode_names == ("max", "eco")
    eco = p.mode_figures("eco")
    assert eco.gflops["conv"] == 50.0 and eco.memory_gbps == 10.0 and eco.op_overhead_us == FAST["op_overhead_us"]
    assert p.mode_power("eco") == (1.0, 5.0) and p.mode_power("max") == (4.0, 40.0)
    assert validate_profile_dict(FAST, "fast.yaml").mode_names == ("default",)


def test_cluster_with_modes_prices_the_mode(tmp_path):
    cluster = load_cluster(write_cluster(tmp_path, {"moded": MODED}, [("m", "moded")]))
    eco = cluster.with_modes({"m": "eco"})
    assert eco.devices[0].figures.gflops["conv"] == 50.0 and eco.devices[0].power.busy_w == 5.0
    assert eco.to_dict()["devices"][0]["mode"] == "eco" and cluster.to_dict()["devices"][0]["mode"] == "max"
    assert cluster.with_modes({"m": "max"}).devices[0].mode is None
    with pytest.raises(ValueError, match="no mode 'turbo'"):
        cluster.with_modes({"m": "turbo"})


def test_profiles_without_modes_leave_the_manifest_devices_without_one(tmp_path):
    cluster = load_cluster(write_cluster(tmp_path, {"fast": FAST}, [("f", "fast")]))
    assert "mode" not in cluster.to_dict()["devices"][0]


# ---------------------------------------------------------------------------------------------------
# --objective energy end to end


def test_energy_plan_chooses_a_mode_and_the_manifest_says_so(tmp_path):
    """With an SLA far above the latency, the moded device alone in its eco mode spends least: the
    manifest names the mode, simulate and inspect report the energy compile predicted."""
    path = write_cluster(tmp_path, {"moded": MODED, "slow": SLOW}, [("m", "moded"), ("s", "slow")])
    fast = compile_api(TINY, path, tmp_path / "lat", strategy="pipeline")
    s = compile_api(TINY, path, tmp_path / "en", strategy="pipeline", objective="energy",
                    sla_ms=3 * fast["predicted_latency_ms"])
    assert s["objective"] == "energy" and s["predicted_energy_mj"] < fast["predicted_energy_mj"]
    assert s["predicted_latency_ms"] <= 3 * fast["predicted_latency_ms"]
    modes = {d["name"]: d["mode"] for d in s["devices"]}
    used = {st["device"] for st in s["stages"]}
    manifest = load_manifest(tmp_path / "en" / "manifest.json")
    assert {d.name: d.mode for d in manifest.devices} == modes
    assert "eco" in {modes[d] for d in used if modes[d]}  # the point of the test: a mode was chosen
    sim = simulate_manifest(manifest)
    assert sim["predicted_energy_mj"] == pytest.approx(s["predicted_energy_mj"], rel=1e-3)
    res = invoke("inspect", tmp_path / "en" / "manifest.json", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {d["name"]: d["mode"] for d in doc["devices"]} == modes
    assert doc["predicted_energy_mj"] == s["predicted_energy_mj"]


def test_soft_sla_trades_energy_for_lateness(tmp_path):
    path = write_cluster(tmp_path, {"fast": FAST, "slow": SLOW}, [("f", "fast"), ("s", "slow")])
    fast = compile_api(TINY, path, tmp_path / "lat", strategy="pipeline")
    sla = fast["predicted_latency_ms"] / 2  # unmeetable
    cheap = compile_api(TINY, path, tmp_path / "a", strategy="pipeline", objective="energy", sla_ms=sla,
                        sla_soft=True, lam=0.0)
    dear = compile_api(TINY, path, tmp_path / "b", strategy="pipeline", objective="energy", sla_ms=sla,
                       sla_soft=True, lam=1e6)
    assert cheap["predicted_energy_mj"] <= dear["predicted_energy_mj"]
    assert dear["predicted_latency_ms"] == pytest.approx(fast["predicted_latency_ms"])


@pytest.mark.parametrize("args, message", [
    (["--objective", "energy"], "--objective energy needs --sla-ms"),
    (["--sla-ms", "5"], "--sla-ms, --sla-soft and --lambda apply to --objective energy, not latency"),
    (["--objective", "energy", "--sla-ms", "-1"], "--sla-ms -1.0: expected a positive number of milliseconds"),
    (["--objective", "energy", "--sla-ms", "5", "--lambda", "3"], "--lambda prices a missed SLA: it needs --sla-soft"),
    (["--sla-soft"], "--sla-soft and --lambda need --sla-ms"),
])
def test_energy_option_errors_are_one_line(tmp_path, args, message):
    path = write_cluster(tmp_path, {"fast": FAST}, [("f", "fast")])
    res = invoke("compile", TINY, "--devices", path, "-o", tmp_path / "out", *args)
    assert error_line(res) == f"edgec: {message}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("strategy", ["pipeline", "auto"])
def test_unmeetable_sla_names_the_fastest_latency(tmp_path, strategy):
    path = write_cluster(tmp_path, {"fast": FAST, "slow": SLOW}, [("f", "fast"), ("s", "slow")])
    fast = compile_api(TINY, path, tmp_path / "lat", strategy=strategy)["predicted_latency_ms"]
    res = invoke("compile", TINY, "--devices", path, "-o", tmp_path / "out", "--strategy", strategy,
                 "--objective", "energy", "--sla-ms", fast / 10)
    line = error_line(res)
    assert line.startswith(f"edgec: {path}: no ") and f"takes {fast:.3f} ms" in line
    assert not (tmp_path / "out").exists()


def test_unknown_power_is_an_error_for_the_energy_objective(tmp_path):
    bare = {k: v for k, v in FAST.items() if k != "power_w"} | {"name": "bare"}
    path = write_cluster(tmp_path, {"bare": bare}, [("b", "bare")])
    res = invoke("compile", TINY, "--devices", path, "-o", tmp_path / "out", "--objective", "energy",
                 "--sla-ms", 1000)
    assert "no power_w" in error_line(res) or "needs power_w" in error_line(res)


# ---------------------------------------------------------------------------------------------------
# the runtime's schema


def test_manifest_power_figures_are_checked(tmp_path):
    path = write_cluster(tmp_path, {"fast": FAST}, [("f", "fast")])
    compile_api(TINY, path, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert data["devices"][0]["power_w"] == {"idle": 4.0, "busy": 40.0}
    parse_manifest(data, tmp_path / "out" / "manifest.json")
    data["devices"][0]["power_w"]["busy"] = -1
    with pytest.raises(InputError, match=r"devices\[0\]\.power_w\.busy"):
        parse_manifest(data, tmp_path / "out" / "manifest.json")


def test_latency_bound_is_where_idle_power_alone_spends_the_incumbent():
    from edgec.compiler.plan.planner import EnergyGoal

    hard = EnergyGoal(100.0)
    assert hard.latency_bound(float("inf"), 2.0) == 100.0  # nothing found yet: the SLA
    assert hard.latency_bound(50.0, 2.0) == 25.0  # 25 ms of 2 W idle is 50 mJ already
    assert hard.latency_bound(1000.0, 2.0) == 100.0
    soft = EnergyGoal(10.0, soft=True, lam=3.0)
    assert soft.latency_bound(10.0, 2.0) == 5.0
    bound = soft.latency_bound(40.0, 2.0)  # 2 x L + 3 x (L - 10) = 40
    assert 2.0 * bound + 3.0 * (bound - 10.0) == pytest.approx(40.0)
    assert soft.latency_bound(40.0, 0.0) == float("inf")


def test_auto_bounds_the_searches_by_the_best_energy_so_far(tmp_path, monkeypatch):
    """The searching planners run last, bounded by the latency at which the least idle power alone spends
    what the best plan before them did (or the SLA, if lower)."""
    from edgec.compiler.plan.choose import _key, plan_model
    from edgec.compiler.plan import registry
    from edgec.compiler.plan.planner import EnergyGoal, PlanOptions

    cluster = load_cluster(write_cluster(tmp_path, {"fast": FAST, "slow": SLOW}, [("f", "fast"), ("s", "slow")]))
    ing = load_model(TINY)
    cost = build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)
    seen = {}
    real = registry.plan_jointly

    def spy(graph, cost_, objective, options, group):
        seen["incumbent"], seen["objective"] = options.incumbent, objective
        return real(graph, cost_, objective, options, group)

    monkeypatch.setattr(registry, "plan_jointly", spy)
    goal = EnergyGoal(1e6)
    chosen, cands = plan_model(ing.graph, cost, "auto", "energy", PlanOptions(energy=goal))
    before = [c for c in cands if c.strategy not in registry.SEARCHES and c.prediction is not None]
    best = min(_key(c, "energy", goal)[0] for c in before)
    assert seen["objective"] == "latency"
    assert seen["incumbent"] == pytest.approx(goal.latency_bound(best, 0.5)) and seen["incumbent"] < 1e6


def test_energy_on_power_modes_beside_alike_devices(tmp_path):
    """A laptop, a Jetson with power modes and two alike phones (issue 37): the energy objective, the
    pipeline strategy and --pareto all plan (the power-mode columns kept `traits` one per column), the
    energy plan meets its SLA and costs less energy than the latency plan."""
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump({
        "devices": [{"name": "laptop", "profile": "laptop"}, {"name": "orin", "profile": "jetson-orin-nano-cuda"},
                    {"name": "phone-a", "profile": "phone"}, {"name": "phone-b", "profile": "phone"}],
        "network": {"bandwidth_mbps": 200, "latency_ms": 1}}))
    model = MODELS / "squeezenet.onnx"
    figures = {}
    for objective in ("latency", "energy"):
        extra = ["--sla-ms", 30] if objective == "energy" else []
        res = invoke("compile", model, "--devices", path, "-o", tmp_path / objective, "--objective", objective,
                     *extra, "--json")
        assert res.exit_code == 0, res.output
        figures[objective] = json.loads(res.stdout)
    assert figures["energy"]["predicted_latency_ms"] <= 30
    assert figures["energy"]["predicted_energy_mj"] < figures["latency"]["predicted_energy_mj"]
    res = invoke("compile", model, "--devices", path, "-o", tmp_path / "pipe", "--objective", "energy", "--sla-ms", 30,
                 "--strategy", "pipeline")
    assert res.exit_code == 0, res.output
    res = invoke("compile", model, "--devices", path, "-o", tmp_path / "front", "--pareto")
    assert res.exit_code == 0, res.output


def test_the_energy_dps_label_budget_is_a_one_line_refusal(tmp_path, monkeypatch):
    """Over the energy DP's label budget, `compile --strategy pipeline --objective energy` exits 2 with the DP's
    reason (its size), not an internal error, and writes nothing (auto goes on with its other planners)."""
    from edgec.compiler.plan import pipeline_energy
    monkeypatch.setattr(pipeline_energy, "LABEL_BUDGET", 1)
    path = write_cluster(tmp_path, {"fast": FAST, "slow": SLOW}, [("f", "fast"), ("s", "slow")])
    res = invoke("compile", TINY, "--devices", path, "-o", tmp_path / "out", "--strategy", "pipeline",
                 "--objective", "energy", "--sla-ms", 1000)
    line = error_line(res)
    assert "the energy DP would hold more than 1 labels" in line, line
    assert not (tmp_path / "out").exists()


def test_columns_share_one_cost_table_per_mode_priced_as_one_device_at_a_time(tmp_path):
    """The energy planner prices every column of one power mode in one cost table (not one table per column,
    O(columns x layers x devices)): each column's figures are those of its device alone in that mode, bit for bit."""
    from edgec.compiler.plan.pipeline_energy import _columns

    moded2 = MODED | {"name": "moded2"}
    path = write_cluster(tmp_path, {"moded": MODED, "moded2": moded2, "fast": FAST},
                         [("m1", "moded"), ("f", "fast"), ("m2", "moded"), ("m3", "moded2")])
    ing = load_model(TINY)
    cost = build_cost_table(ing.graph, load_cluster(path), ing.sha256, model=ing.model)
    columns = _columns(cost)
    assert [c.device for c in columns] == [0, 0, 1, 2, 2, 3, 3]
    assert [(c.device, c.mode) for c in columns if c.cost is not cost] == [(0, "eco"), (2, "eco"), (3, "eco")]
    assert len({id(c.cost) for c in columns}) == 2  # the cluster as it is, and every moded device in "eco"
    for c in columns:
        alone = cost if c.cost is cost else cost.with_modes({cost.devices[c.device]: c.mode})
        assert np.array_equal(c.cost.layer_ms[:, c.device], alone.layer_ms[:, c.device])
        assert c.cost.cluster.devices[c.device].traits == alone.cluster.devices[c.device].traits
