"""edgec allocate: SERVICES.yaml, device classes, candidate plans, the L(n) fit, CP-SAT against brute force,
fairness, infeasibility and best effort, and OUTDIR (allocation.json, --json, nothing half-written)."""

from __future__ import annotations

import json
import os
import random
import threading
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgec.compiler.allocate import allocate
from edgec.compiler.allocate.candidates import _shares, plan_service, used_devices, utility
from edgec.compiler.allocate.classes import device_classes, restrict, sub_cluster
from edgec.compiler.allocate.fit import fit_latency
from edgec.compiler.allocate.services import Service, load_services
from edgec.compiler.allocate.solve import SCALE, Item, Problem, brute_force, solve
from edgec.compiler.cli import cli
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import CostTable, build_cost_table
from edgec.compiler.errors import UserError
from edgec.compiler.ingest import load_model
from edgec.runtime.front.runall import load_allocation

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="edgec")


def error_line(res) -> str:
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert "Traceback" not in res.stderr and res.stdout == "", res.output
    line = res.stderr.splitlines()[-1]
    assert line.startswith("edgec: ")
    return line


def cluster_file(tmp_path: Path, devices: list[tuple[str, str]], links: str = "") -> Path:
    lines = ["devices:"] + [f"  - {{name: {n}, profile: {p}}}" for n, p in devices]
    lines += ["network: {bandwidth_mbps: 100, latency_ms: 1, medium: switched" + links + "}"]
    path = tmp_path / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def services_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "services.yaml"
    path.write_text(text)
    return path


# -- SERVICES.yaml ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, expected", [
    ("services:\n  - {name: a, model: m.onnx, sla_ms: 10, prio: 2}\n", "unknown key 'prio' in services[0]"),
    ("services:\n  - {name: a, model: m.onnx}\n", "missing required key 'sla_ms' in services[0]"),
    ("services:\n  - {name: a, model: m.onnx, sla_ms: -1}\n", "service 'a': sla_ms"),
    ("services:\n  - {name: a, model: m.onnx, sla_ms: 5, priority: 0}\n", "priority must be a number from 0.001"),
    ("services:\n  - {name: a, model: m.onnx, sla_ms: 5, shape: {x: [1, 0]}}\n", "shape['x'][1] must be a positive"),
    ("services:\n  - {name: a, model: m.onnx, sla_ms: 5}\n  - {name: a, model: m.onnx, sla_ms: 5}\n",
     "duplicate service name 'a'"),
    ("services:\n  - {name: a, model: m.onnx, sla_ms: 5, min_devices: 3, max_devices: 2}\n",
     "min_devices 3 is more than max_devices 2"),
    ("services: []\n", "services must be a non-empty list of services"),
    ("", "services file is empty"),
])
def test_services_file_errors_are_one_line_exit_2(tmp_path, body, expected):
    devices = cluster_file(tmp_path, [("p", "rpi5")])
    res = invoke("allocate", services_file(tmp_path, body), "--devices", devices, "-o", tmp_path / "out")
    line = error_line(res)
    assert str(tmp_path / "services.yaml") in line and expected in line, line
    assert not (tmp_path / "out").exists()


def test_services_resolve_models_against_their_file(tmp_path):
    sub = tmp_path / "conf"
    sub.mkdir()
    (s,) = load_services(services_file(sub, "services:\n  - {name: a, model: ../m.onnx, sla_ms: 5, rate_ips: 2}\n"))
    assert s.model == sub / "../m.onnx" and s.rate_ips == 2 and s.priority == 1 and s.min_devices == 1


def test_min_devices_beyond_the_cluster_is_refused(tmp_path):
    devices = cluster_file(tmp_path, [("p", "rpi5")])
    body = f"services:\n  - {{name: a, model: {MODELS / 'tinychain.onnx'}, sla_ms: 50, min_devices: 2}}\n"
    line = error_line(invoke("allocate", services_file(tmp_path, body), "--devices", devices, "-o", tmp_path / "o"))
    assert "service 'a': min_devices 2 is more than the 1 device(s)" in line


# -- device classes ---------------------------------------------------------------------------------------

def test_classes_group_interchangeable_devices(tmp_path):
    path = cluster_file(tmp_path, [("a", "rpi5"), ("b", "rpi4"), ("c", "rpi5"), ("d", "rpi5"), ("e", "rpi4")],
                        links=", links: [{a: d, b: e, bandwidth_mbps: 10}]")
    classes = device_classes(load_cluster(path))
    # d and e sit on a link of their own: not interchangeable with their profile's other devices.
    assert classes.members == (("a", "c"), ("b",), ("d",), ("e",))
    assert classes.first((1, 1, 0, 1)) == ("a", "b", "e")
    assert classes.counts(["c", "e"]) == (1, 0, 0, 1)


def test_restrict_prices_as_the_sub_cluster(tmp_path):
    cluster = load_cluster(cluster_file(tmp_path, [("a", "rpi5"), ("b", "phone"), ("c", "rpi4")]))
    ing = load_model(MODELS / "tinyconv.onnx")
    full = build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)
    sub = sub_cluster(cluster, ["c", "a"])
    got, want = restrict(full, sub), build_cost_table(ing.graph, sub, ing.sha256, model=ing.model)
    assert got.devices == want.devices == ("a", "c")
    for name in ("layer_ms", "overhead_ms", "priced_ms", "shared_weight_ms", "out_elems", "out_positions"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    assert got.measured == want.measured and got.curves == want.curves and got.cluster is sub
    for f in fields(CostTable):  # every other field as the sub-cluster's own table has it
        if f.name not in ("layer_ms", "overhead_ms", "priced_ms", "shared_weight_ms", "out_elems", "out_positions",
                          "cluster"):
            assert getattr(got, f.name) == getattr(want, f.name), f.name


# -- candidates -------------------------------------------------------------------------------------------

def _service(sla: float, **kw) -> Service:
    return Service("s", MODELS / "tinyconv.onnx", {}, sla, kw.get("rate_ips"), 1.0, kw.get("min_devices", 1),
                   kw.get("max_devices"))


def test_the_pruned_shares_give_the_options_of_planning_every_share(tmp_path):
    cluster = load_cluster(cluster_file(tmp_path, [("a", "rpi5"), ("b", "rpi5"), ("c", "rpi4"), ("d", "phone")]))
    classes = device_classes(cluster)
    ing = load_model(MODELS / "tinyconv.onnx")
    cost = build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)
    got = plan_service(_service(1e4), ing.graph, cost, classes)
    assert len(got.planned) < len(_shares(classes.sizes, 4))  # the monotonicity rules skipped shares
    for share in _shares(classes.sizes, 4):  # the reference: each share planned alone
        one = plan_service(_service(1e4, max_devices=sum(share)), ing.graph,
                           restrict(cost, sub_cluster(cluster, classes.first(share))),
                           device_classes(sub_cluster(cluster, classes.first(share))))
        best = max(o.utility for o in one.options)
        assert any(o.utility >= best - 1e-12 and all(a <= b for a, b in zip(o.counts, share))
                   for o in got.options), share
    for o in got.options:
        assert utility(_service(1e4), o.prediction) == o.utility
        assert classes.counts(used_devices(o.plan)) == o.counts


@pytest.mark.parametrize("sla", [1e4, None])
def test_with_max_devices_the_fleet_walk_probes_and_keeps_the_options_within_it(tmp_path, monkeypatch, sla):
    """The fleet walk (shares.py, forced here on a small cluster) with max_devices 2 plans the whole cluster
    first, a probe over the limit; its options are those of planning every share of at most 2 devices alone,
    none uses more than 2 devices, and neither does the best run it reports (a tight SLA: the best's)."""
    from edgec.compiler.allocate import shares as shares_mod

    cluster = load_cluster(cluster_file(tmp_path, [("a", "rpi5"), ("b", "rpi5"), ("c", "rpi4"), ("d", "phone")]))
    classes = device_classes(cluster)
    ing = load_model(MODELS / "tinyconv.onnx")
    cost = build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)
    alone = {share: plan_service(_service(1e4, max_devices=sum(share)), ing.graph,
                                 restrict(cost, sub_cluster(cluster, classes.first(share))),
                                 device_classes(sub_cluster(cluster, classes.first(share))))
             for share in _shares(classes.sizes, 2)}
    if sla is None:  # just under the best any share of 2 devices gets: no option, the best reported
        sla = min(one.best.prediction.latency_ms for one in alone.values()) * 0.999
    monkeypatch.setattr(shares_mod, "LISTED", 0)
    got = plan_service(_service(sla, max_devices=2), ing.graph, cost, classes)
    assert got.planned[0].share == classes.sizes  # the probe
    assert all(o.size <= 2 for o in got.options) and sum(got.best.used) <= 2
    for share, one in alone.items():
        best = max((o.utility for o in one.options if utility(_service(sla), o.prediction) is not None),
                   default=None)
        if best is not None:
            assert any(o.utility >= best - 1e-12 and all(a <= b for a, b in zip(o.counts, share))
                       for o in got.options), share
    if not got.options:
        assert got.best.prediction.latency_ms == min(one.best.prediction.latency_ms for one in alone.values())


def test_options_meet_the_sla_and_min_devices_pads(tmp_path):
    cluster = load_cluster(cluster_file(tmp_path, [("a", "rpi5"), ("b", "rpi4"), ("c", "rpi4")]))
    classes = device_classes(cluster)
    ing = load_model(MODELS / "tinyconv.onnx")
    cost = build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)
    free = plan_service(_service(1e4), ing.graph, cost, classes)
    sla = sorted(r.prediction.latency_ms for r in free.planned)[0] * 1.0001  # only the fastest plans qualify
    tight = plan_service(_service(sla), ing.graph, cost, classes)
    assert tight.options and all(o.prediction.latency_ms <= sla for o in tight.options)
    padded = plan_service(_service(1e4, min_devices=2), ing.graph, cost, classes)
    assert padded.options and all(o.size >= 2 for o in padded.options)
    capped = plan_service(_service(1e4, max_devices=1), ing.graph, cost, classes)
    assert all(sum(r.share) == 1 for r in capped.planned)


def test_a_rate_turns_utility_into_throughput_headroom(tmp_path):
    cluster = load_cluster(cluster_file(tmp_path, [("a", "rpi5")]))
    ing = load_model(MODELS / "tinyconv.onnx")
    cost = build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)
    so = plan_service(_service(1e4, rate_ips=1.0), ing.graph, cost, device_classes(cluster))
    (o,) = so.options
    assert o.utility == pytest.approx(o.prediction.throughput_ips - 1.0)
    assert plan_service(_service(1e4, rate_ips=1e6), ing.graph, cost, device_classes(cluster)).options == ()


# -- L(n) -------------------------------------------------------------------------------------------------

def test_fit_recovers_hitdl_constants():
    pts = [(n, 20 + 300 / n + 40 / n ** 2) for n in (1, 1.5, 2, 3, 4)]
    f = fit_latency(pts)
    assert (f.c0, f.c1, f.c2) == pytest.approx((20, 300, 40))
    assert f.max_error < 1e-9
    noisy = fit_latency([(n, ms * (1.1 if i % 2 else 0.9)) for i, (n, ms) in enumerate(pts)])
    assert 0.01 < noisy.mean_error < 0.2
    assert fit_latency([]) is None
    assert fit_latency([(1.0, 50.0), (1.0, 60.0)]).c1 == 0  # one distinct n: a constant


# -- CP-SAT -----------------------------------------------------------------------------------------------

def _random_problem(rng: random.Random, fairness: bool) -> Problem:
    capacity = tuple(rng.randint(1, 3) for _ in range(rng.randint(1, 3)))
    items = []
    for _ in range(rng.randint(1, 4)):
        opts = [Item(c, rng.randint(0, 10 ** 6), rng.randint(0, SCALE))
                for c in (tuple(rng.randint(0, k) for k in capacity) for _ in range(rng.randint(1, 5))) if sum(c)]
        items.append(tuple(opts) or (Item((1,) + (0,) * (len(capacity) - 1), 1, 1),))
    return Problem(capacity, tuple(items), fairness)


@pytest.mark.parametrize("fairness", [False, True])
def test_cpsat_is_optimal_against_brute_force(fairness):
    rng = random.Random(13)
    infeasible = 0
    for _ in range(150):
        problem = _random_problem(rng, fairness)
        sol = solve(problem)
        choice, key = brute_force(problem)
        assert sol.key == key, problem
        if choice is None:
            infeasible += 1
            assert sol.status == "INFEASIBLE"
        else:
            assert sol.status == "OPTIMAL" and problem.fits(sol.choice) and sol.gap == 0
    assert 0 < infeasible < 150  # both kinds of instance were met


def test_ties_go_to_fewer_devices():
    problem = Problem((3,), ((Item((1,), 5, 5), Item((2,), 5, 5)),))
    assert solve(problem).choice == (0,)


def test_fairness_raises_the_worst_normalised_utility():
    # A (priority 10) on the fast device leaves B the slow one; fairness gives B the fast one.
    a = (Item((1, 0), 9_000_000, round(SCALE * 0.9 / 0.95)), Item((0, 1), 5_000_000, round(SCALE * 0.5 / 0.95)),
         Item((1, 1), 9_500_000, SCALE))
    b = (Item((1, 0), 800_000, SCALE), Item((0, 1), 100_000, round(SCALE * 0.1 / 0.8)))
    weighted, fair = solve(Problem((1, 1), (a, b))), solve(Problem((1, 1), (a, b), fairness=True))
    assert weighted.choice == (0, 1) and fair.choice == (1, 0)
    worst = [Problem((1, 1), (a, b)).least_fair(s.choice) for s in (weighted, fair)]
    assert worst[1] > worst[0]


# -- allocate end to end ----------------------------------------------------------------------------------

TWO_SERVICES = """services:
  - {{name: chain, model: {chain}, sla_ms: {sla_chain}, priority: 2}}
  - {{name: conv, model: {conv}, sla_ms: {sla_conv}}}
"""


def _two(tmp_path, sla_chain=1e4, sla_conv=1e4) -> Path:
    return services_file(tmp_path, TWO_SERVICES.format(chain=MODELS / "tinychain.onnx", conv=MODELS / "tinyconv.onnx",
                                                       sla_chain=sla_chain, sla_conv=sla_conv))


def test_allocation_json_and_json_output(tmp_path):
    devices = cluster_file(tmp_path, [("a", "rpi5"), ("b", "rpi4"), ("c", "phone")])
    out = tmp_path / "out"
    res = invoke("allocate", _two(tmp_path), "--devices", devices, "-o", out, "--json")
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert printed == json.loads((out / "allocation.json").read_text())
    assert {"services", "status", "solve_seconds"} <= printed.keys() and printed["status"] == "OPTIMAL"
    seen = set()
    for name, s in printed["services"].items():
        assert {"devices", "strategy", "predicted_latency_ms", "predicted_throughput_ips", "utility",
                "sla_ms"} <= s.keys()
        assert not seen & set(s["devices"])
        seen |= set(s["devices"])
        manifest = json.loads((out / name / "manifest.json").read_text())
        assert [d["name"] for d in manifest["devices"]] == s["devices"]
        assert manifest["predicted"]["latency_ms"] == pytest.approx(s["predicted_latency_ms"], abs=1e-3)
        # the shipped profiles have power figures: each service's energy per request on its devices
        assert s["predicted_energy_mj"] == pytest.approx(manifest["predicted"]["energy_mj"], abs=1e-3)
        assert s["predicted_energy_mj"] > 0 and set(s["memory_mb"]) == set(s["devices"])
    assert load_allocation(out).services[0].name == "chain"


def test_fairness_objective_is_recorded(tmp_path):
    devices = cluster_file(tmp_path, [("a", "rpi5"), ("b", "rpi4")])
    got = allocate(_two(tmp_path), devices, tmp_path / "out", fairness=True)
    assert got["objective"] == "fairness" and got["status"] == "OPTIMAL"


def test_an_sla_no_plan_meets_exits_2_naming_the_service(tmp_path):
    devices = cluster_file(tmp_path, [("a", "rpi5"), ("b", "rpi4")])
    line = error_line(invoke("allocate", _two(tmp_path, sla_conv="0.001"), "--devices", devices, "-o", tmp_path / "o"))
    assert "cannot meet every SLA" in line and "'conv': sla 0.001 ms, best " in line and "'chain'" not in line
    assert not (tmp_path / "o").exists()


def test_best_effort_drops_the_lowest_priority_first(tmp_path):
    devices = cluster_file(tmp_path, [("a", "rpi5")])  # one device: one service at most
    line = error_line(invoke("allocate", _two(tmp_path), "--devices", devices, "-o", tmp_path / "o"))
    assert "'conv': meets its SLA alone" in line and "'chain'" not in line
    got = allocate(_two(tmp_path), devices, tmp_path / "o", best_effort=True)
    assert list(got["services"]) == ["chain"] and [d["name"] for d in got["dropped"]] == ["conv"]


def test_an_earlier_allocation_is_replaced_and_foreign_files_are_not(tmp_path):
    devices = cluster_file(tmp_path, [("a", "rpi5"), ("b", "rpi4")])
    out = tmp_path / "out"
    allocate(_two(tmp_path), devices, out)
    allocate(_two(tmp_path), devices, out)  # over its own earlier output
    (out / "mine.txt").write_text("keep")
    with pytest.raises(UserError, match="mine.txt"):
        allocate(_two(tmp_path), devices, out)
    assert (out / "mine.txt").read_text() == "keep" and (out / "allocation.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


# -- planning time: the SLA bound, alike services, side by side ---------------------------------------------

def _alexnet_cluster(tmp_path):
    # alexnet on two rpi4 and an rpi5 at 1 Gbps: a spatial plan beats the pipeline plan by a few ms
    path = tmp_path / "fast.yaml"
    path.write_text("devices:\n  - {name: a, profile: rpi4}\n  - {name: b, profile: rpi4}\n  - {name: c, profile: rpi5}\n"
                    "network: {bandwidth_mbps: 1000, latency_ms: 0.1}\n")
    cluster = load_cluster(path)
    ing = load_model(MODELS / "alexnet.onnx")
    return cluster, ing, build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)


def test_the_sla_bound_keeps_every_option_of_unbounded_auto(tmp_path, monkeypatch):
    from edgec.compiler.allocate import candidates
    from edgec.compiler.plan.choose import plan_model

    cluster, ing, cost = _alexnet_cluster(tmp_path)
    classes = device_classes(cluster)
    reference = {}  # every share planned by plain auto, no bound
    for share in _shares(classes.sizes, 3):
        sub = restrict(cost, sub_cluster(cluster, classes.first(share)))
        chosen, cands = plan_model(ing.graph, sub, "auto" if sum(share) > 1 else "pipeline", "latency")
        reference[share] = chosen.prediction.latency_ms, {c.strategy: c.prediction.latency_ms for c in cands
                                                          if c.prediction is not None}
    full = reference[classes.sizes]
    assert full[1]["pipeline"] > full[0]  # a search beats the pipeline: an SLA between them binds the searches
    seen = []
    monkeypatch.setattr(candidates, "plan_model", lambda *a, **k: seen.append(a[4].incumbent) or plan_model(*a, **k))
    for sla in (full[0] * 1.001, (full[0] + full[1]["pipeline"]) / 2, 1e4):
        got = plan_service(_service(sla, max_devices=None), ing.graph, cost, classes)
        assert seen and all(b == sla for b in seen)
        seen.clear()
        for share, (ms, _) in reference.items():
            if ms <= sla:  # an option of the reference: an option at least as good on no more devices
                u = (sla - ms) / sla
                assert any(o.utility >= u - 1e-12 and all(a <= b for a, b in zip(o.counts, share))
                           for o in got.options), (sla, share)
        assert all(o.prediction.latency_ms <= sla for o in got.options)


def test_a_service_no_share_serves_reports_its_unbounded_best(tmp_path):
    cluster, ing, cost = _alexnet_cluster(tmp_path)
    from edgec.compiler.plan.choose import plan_model

    best = plan_model(ing.graph, cost, "auto", "latency")[0].prediction.latency_ms
    got = plan_service(_service(best * 0.5), ing.graph, cost, device_classes(cluster))
    assert got.options == () and got.best.prediction.latency_ms == pytest.approx(best)


def test_alike_services_plan_once_and_processes_do_not_change_the_options(tmp_path, monkeypatch):
    from edgec.compiler.allocate import candidates, planning
    from edgec.compiler.plan.planner import PlanOptions

    cluster = load_cluster(cluster_file(tmp_path, [("a", "rpi5"), ("b", "rpi4"), ("c", "phone")]))
    classes = device_classes(cluster)
    chain, conv = MODELS / "tinychain.onnx", MODELS / "tinyconv.onnx"
    services = (Service("x", chain, {}, 1e4, None, 1.0, 1, None), Service("y", conv, {}, 1e4, None, 1.0, 1, None),
                Service("z", chain, {}, 1e4, None, 3.0, 2, None),  # x's runs, its own options (min_devices)
                Service("w", chain, {}, 50.0, None, 1.0, 1, None))  # another SLA: planned on its own
    calls = []
    real = candidates.plan_shares
    monkeypatch.setattr(planning, "plan_shares", lambda s, *a, **k: calls.append(s.name) or real(s, *a, **k))
    one = planning.plan_all(services, cluster, classes, PlanOptions(jobs=1))
    assert sorted(calls) == ["w", "x", "y"]
    assert one[0][0].cost is one[2][0].cost  # one model file, read once
    assert all(o.size >= 2 for o in one[2][1].options) and not all(o.size >= 2 for o in one[0][1].options)
    lanes, run_lanes = [], planning.run_lanes
    monkeypatch.setattr(planning, "run_lanes", lambda fn, ls, w: lanes.append(w) or run_lanes(fn, ls, w))
    alone = threading.active_count() == 1  # earlier tests may leave a thread behind: then forking is unsafe
    two = planning.plan_all(services, cluster, classes, PlanOptions(jobs=2))
    assert lanes == ([2] if alone else [])

    def key(got):
        return [(x.service.name, [(o.counts, o.plan, o.prediction.latency_ms, o.utility) for o in so.options])
                for x, so in got]

    assert key(two) == key(one) and [x.service.name for x, _ in two] == ["x", "y", "z", "w"]
