"""bench_fidelity's part hetero, its logic without a testbed: the shares it accepts, the targets' verdicts, the
pipeline efficiency ratio, the check that the machine held still, and its tables as the results file and the docs
page read them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import benchlib  # tests/bench is on sys.path: pytest puts a test file's folder there (no __init__.py)
import fidelity_part_hetero
from fidelity_part_hetero import Build, ModelRun, drift, efficiency, hetero_text, measure_rounds, parse_shares, targets

RENDER = Path(__file__).resolve().parents[2] / "benchmarks" / "render.py"
_spec = importlib.util.spec_from_file_location("edgec_bench_render", RENDER)
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)


def _row(model, plan, kind, devices, pred_ms, meas_ms, pred_ips, meas_ips):
    return {"model": model, "kind": kind, "plan": plan, "stages": len(devices), "devices": devices,
            "predicted_latency_ms": pred_ms, "measured_latency_ms": meas_ms, "latency_error": meas_ms / pred_ms - 1,
            "predicted_throughput_ips": pred_ips, "measured_throughput_ips": meas_ips,
            "throughput_error": meas_ips / pred_ips - 1, "latency_rounds": [meas_ms], "throughput_rounds": [meas_ips],
            "loadavg_rounds": [[1.0, 1.0, 1.0]]}


def test_shares_are_two_to_four_quotas_that_leave_the_coordinator_room():
    assert parse_shares("0.9,0.45,0.25", 2) == [0.9, 0.45, 0.25]
    assert parse_shares(" 0.5, 0.5 ,", 2) == [0.5, 0.5]
    for text, said in (("0.9", "2 to 4"), ("0.5,0.5,0.5,0.2,0.2", "2 to 4"), ("0.9,x", "numbers"),
                       ("0.9,0.1", "from 0.2 to 1"), ("1.5,0.25", "from 0.2 to 1"), ("0.9,0.9", "1.8 cores"),
                       ("1,0.8", "more than this machine's 2")):
        with pytest.raises(ValueError, match=said):
            parse_shares(text, 2)
    assert parse_shares("1,1,1,0.5", 4) == [1, 1, 1, 0.5]


def test_targets_each_latency_within_15_median_within_10_each_throughput_within_20():
    rows = [_row("m", "a", "plan", ["dev-a"], 100, 108, 10, 8.5),  # +8%, -15%
            _row("m", "b", "plan", ["dev-a", "dev-b"], 100, 95, 10, 11.9),  # -5%, +19%
            _row("m", "c", "plan", ["dev-b"], 100, 114, 10, 10),  # +14%
            _row("m", "single/dev-c", "single", ["dev-c"], 100, 300, 10, 1)]  # single devices are not counted
    t = targets(rows)
    assert t["cases"] == 3 and t["latency_within"] == 3 and t["throughput_within"] == 3
    assert t["latency_median_error"] == pytest.approx(0.08) and t["pass"]
    rows[2] = _row("m", "c", "plan", ["dev-b"], 100, 116, 10, 7.9)  # one latency +16%, one throughput -21%
    t = targets(rows)
    assert not t["latency_pass"] and not t["throughput_pass"] and t["latency_median_pass"] and not t["pass"]
    rows[0] = _row("m", "a", "plan", ["dev-a"], 100, 112, 10, 10)  # median error now 12%
    assert not targets(rows)["latency_median_pass"]
    ok = [_row("m", "a", "plan", ["dev-a"], 100, 100, 10, 10)]
    assert targets(ok)["pass"] and not targets(ok, errors=1)["pass"]  # a failed model fails every target
    assert not targets([])["pass"] and targets([])["latency_median_error"] is None


def test_efficiency_takes_the_plan_of_the_highest_predicted_throughput_over_the_sum_of_single_devices():
    plans = [_row("m", "pipeline/latency", "plan", ["dev-a"], 10, 10, 100, 90),
             _row("m", "auto/throughput", "plan", ["dev-a", "dev-b"], 20, 20, 150, 120)]
    singles = [_row("m", "single/dev-a", "single", ["dev-a"], 10, 10, 100, 80),
               _row("m", "single/dev-b", "single", ["dev-b"], 20, 20, 50, 40)]
    e = efficiency("m", plans, singles)
    assert e["plan"] == "auto/throughput" and e["devices"] == ["dev-a", "dev-b"]
    assert e["measured_ratio"] == pytest.approx(120 / 120) and e["predicted_ratio"] == pytest.approx(150 / 150)
    assert e["single_measured_ips"] == {"dev-a": 80, "dev-b": 40}


def test_the_part_prints_tables_the_results_file_keeps():
    plans = [_row("m", "pipeline/throughput=auto/throughput", "plan", ["dev-a", "dev-b"], 20, 21, 150, 140)]
    singles = [_row("m", "single/dev-a", "single", ["dev-a"], 10, 10, 100, 95),
               _row("m", "single/dev-b", "single", ["dev-b"], 20, 22, 50, 48)]
    h = {"ran": True, "rows": plans + singles, "errors": [{"model": "n", "error": "edgec run x exited 1:\nboom"}],
         "refused": [{"model": "m", "plan": "spatial/latency", "reason": "no layer can be tiled"}],
         "efficiency": [efficiency("m", plans, singles)], "targets": targets(plans + singles, 1),
         "profiles": {"dev-a": {"device": "dev-a", "share": 0.9, "cpu_quota": {"cores": 0.9}, "verdict": "quiet",
                                "seconds": 60.0}},
         "loadavg_start": [1.0, 1.0, 1.0], "loadavg_end": [1.0, 1.0, 1.0], "seconds": 100.0}
    tables, notes = benchlib.tables_of(hetero_text(h))
    plan_table, eff_table = tables
    assert plan_table["title"].startswith("Heterogeneous plans") and len(plan_table["rows"]) == 4
    assert plan_table["rows"][0][:2] == ["m", "pipeline/throughput=auto/throughput"]
    assert plan_table["rows"][0][6] == "+5.0%" and plan_table["rows"][3][1].startswith("FAILED: edgec run x")
    assert eff_table["title"].startswith("Pipeline efficiency") and eff_table["rows"][0][5] == 0.98  # 140 / (95 + 48)
    assert any("overall FAIL" in n and "(1 model(s) failed)" in n for n in notes)
    assert any("spatial/latency: refused at compile: no layer can be tiled" in n for n in notes)
    doc = {"command": "python tests/bench/bench_fidelity.py --parts hetero", "date": None, "commit": None,
           "machine": {}, "load": {}, "tables": tables, "notes": notes}
    page = render.page("bench_fidelity", doc)
    assert "## Pipeline efficiency" in page and "| m | pipeline/throughput=auto/throughput | dev-a+dev-b |" in page


class _Reprofiled:
    """A HeteroCluster that profiled its devices again: what `drift` asks of it."""

    def __init__(self, tmp: Path):
        self.tmp, self.asked = tmp, []

    def profile_again(self):
        return ({"dev-a": self.tmp / "pa.yaml", "dev-b": self.tmp / "pb.yaml"},
                {d: {"device": d, "seconds": 60.0, "verdict": "quiet"} for d in ("dev-a", "dev-b")})

    def single_file(self, device, profile, name):
        self.asked.append((device, profile.name, name))
        return self.tmp / f"cluster-{name}.yaml"


def test_drift_predicts_each_single_row_again_with_the_profile_after_and_says_whether_the_machine_held(
        tmp_path, monkeypatch):
    after = {("m", "dev-a"): 10.5, ("m", "dev-b"): 26.0}  # +5% and +30% over the rows' predictions below
    monkeypatch.setattr(fidelity_part_hetero, "model_path", lambda name: Path(f"/models/{name}.onnx"))
    monkeypatch.setattr(fidelity_part_hetero, "compile_build", lambda model, cluster, out: (
        {"predicted_latency_ms": after[(model.stem, cluster.stem.split("-", 1)[1].rsplit("-", 1)[0])]}, None))
    rows = [_row("m", "auto/latency", "plan", ["dev-a", "dev-b"], 8, 8, 100, 100),
            _row("m", "single/dev-a", "single", ["dev-a"], 10, 9, 100, 100),
            _row("m", "single/dev-b", "single", ["dev-b"], 20, 25, 50, 40)]
    tc = _Reprofiled(tmp_path)
    d = drift(tc, rows, tmp_path)
    assert tc.asked == [("dev-a", "pa.yaml", "dev-a-after"), ("dev-b", "pb.yaml", "dev-b-after")]
    assert [(x["device"], x["before_ms"], x["after_ms"], x["measured_ms"]) for x in d["rows"]] == [
        ("dev-a", 10, 10.5, 9), ("dev-b", 20, 26.0, 25)]
    assert d["worst"] == pytest.approx(0.30) and d["held"] is False
    after[("m", "dev-b")] = 19.0  # -5%
    assert drift(tc, rows, tmp_path)["held"] is True


def test_the_drift_check_prints_a_verdict_and_a_table_or_why_it_is_not_known():
    plans = [_row("m", "auto/latency", "plan", ["dev-a"], 10, 10, 100, 100)]
    singles = [_row("m", "single/dev-a", "single", ["dev-a"], 10, 9, 100, 100)]
    h = {"ran": True, "rows": plans + singles, "errors": [], "refused": [], "efficiency": [],
         "targets": targets(plans + singles), "profiles": {}, "loadavg_start": [1.0] * 3, "loadavg_end": [1.0] * 3,
         "seconds": 1.0, "drift": {"profiles": {"dev-a": {"device": "dev-a", "seconds": 60.0, "verdict": "quiet"}},
                                   "rows": [{"model": "m", "device": "dev-a", "before_ms": 10.0, "after_ms": 12.5,
                                             "change": 0.25, "measured_ms": 9.0}], "worst": 0.25, "held": False}}
    tables, notes = benchlib.tables_of(hetero_text(h))
    assert tables[-1]["title"].startswith("The machine's drift") and tables[-1]["rows"] == [
        ["m", "dev-a", 10.0, 12.5, "+25.0%", 9.0]]
    assert any("moved by up to 25.0% (at most 10%): MOVED" in n for n in notes)
    h["drift"] = {"error": "edgec profile on dev-a exited 1: boom"}
    _, notes = benchlib.tables_of(hetero_text(h))
    assert any(n.startswith("Whether the machine held still: not known (profiling again") for n in notes)


class _Testbed:
    """A HeteroCluster whose runs answer at once, in the order asked (and fail for one build)."""

    def __init__(self, fail: str | None = None):
        self.ran, self.fail = [], fail

    def run(self, path, requests, *flags):
        if path.name == self.fail:
            raise fidelity_part_hetero.ClusterError(f"edgec run {path.name} exited 1")
        self.ran.append((path.name, "latency" if "--inflight" in flags else "throughput"))
        return {"latency_ms": 10.0, "throughput_ips": 100.0}

    def worker_logs(self):
        return {}


def _model(name: str) -> ModelRun:
    summary = {"predicted_latency_ms": 10.0, "predicted_throughput_ips": 100.0, "stages": [], "devices": []}
    return ModelRun(name, [Build(["auto/latency"], Path(f"{name}-plan"), summary)],
                    [Build(["single/dev-a"], Path(f"{name}-single"), summary)], [])


def test_rounds_take_every_model_in_turn_and_leave_out_a_model_that_failed():
    tb, runs = _Testbed(), [_model("m"), _model("n")]
    assert measure_rounds(tb, runs, 2, repeat=1) == []
    order = [name for name, kind in tb.ran if kind == "latency"]
    assert order == ["m-single", "m-plan", "n-single", "n-plan"] * 2  # each round: every model, singles first
    assert [len(b.latency_ms) for m in runs for b in m.singles + m.builds] == [2] * 4
    assert all(len(m.loads) == 2 for m in runs)
    tb, runs = _Testbed(fail="m-plan"), [_model("m"), _model("n")]
    errors = measure_rounds(tb, runs, 2, repeat=1)
    assert [e["model"] for e in errors] == ["m"] and "m-plan exited 1" in errors[0]["error"]
    assert [m.name for m in runs] == ["n"] and [name for name, kind in tb.ran if kind == "latency"] == [
        "m-single", "n-single", "n-plan", "n-single", "n-plan"]
