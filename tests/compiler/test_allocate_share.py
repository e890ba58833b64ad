"""edgec allocate --share: devices serving several services within their memory and time budget; CP-SAT's
placement against the brute-force reference; allocation.json's shared devices, read by run-all."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgec.compiler.allocate import allocate
from edgec.compiler.allocate.allocate import BUDGET_MS, LOAD_SCALE
from edgec.compiler.allocate.solve import SCALE, Item, Problem, Role, Sharing, brute_force, solve
from edgec.compiler.cli import cli
from edgec.compiler.errors import UserError
from edgec.runtime.front.runall import load_allocation

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
BUDGET = round(BUDGET_MS * LOAD_SCALE)


def _random_shared(rng: random.Random, fairness: bool) -> Problem:
    capacity = tuple(rng.randint(1, 2) for _ in range(rng.randint(1, 2)))
    memory = tuple(tuple(rng.choice((60, 100)) for _ in range(c)) for c in capacity)
    items = []
    for _ in range(rng.randint(1, 3)):
        opts = []
        for _ in range(rng.randint(1, 3)):
            roles = tuple(Role(k, rng.randint(0, 70), rng.randint(0, 700))
                          for k, c in enumerate(capacity) for _ in range(rng.randint(0, c)))
            if roles:
                counts = tuple(sum(r.cls == k for r in roles) for k in range(len(capacity)))
                opts.append(Item(counts, rng.randint(0, 10 ** 6), rng.randint(0, SCALE), roles))
        items.append(tuple(opts) or (Item((1,) + (0,) * (len(capacity) - 1), 1, 1, (Role(0, 1, 1),)),))
    return Problem(capacity, tuple(items), fairness, Sharing(memory, 1000))


def _check_placement(problem: Problem, choice, placement) -> None:
    """Every role on a device of its class, one role of a service per device, memory and budget kept."""
    memory, load = {}, {}
    for i, (j, where) in enumerate(zip(choice, placement)):
        roles = problem.items[i][j].roles
        assert len(where) == len(roles) and len(set(where)) == len(where)
        for role, (k, m) in zip(roles, where):
            assert role.cls == k
            memory[(k, m)] = memory.get((k, m), 0) + role.memory
            load[(k, m)] = load.get((k, m), 0) + role.load
    assert all(v <= problem.sharing.memory[k][m] for (k, m), v in memory.items())
    assert all(v <= problem.sharing.budget for v in load.values())


@pytest.mark.parametrize("fairness", [False, True])
def test_cpsat_places_shared_roles_optimally_against_brute_force(fairness):
    rng = random.Random(7)
    infeasible = shared = 0
    for _ in range(120):
        problem = _random_shared(rng, fairness)
        sol = solve(problem)
        choice, key = brute_force(problem)
        assert sol.key == key, problem
        if choice is None:
            infeasible += 1
            assert sol.status == "INFEASIBLE" and sol.placement is None
            continue
        assert sol.status == "OPTIMAL"
        _check_placement(problem, sol.choice, sol.placement)
        used = [d for where in sol.placement for d in where]
        shared += len(used) > len(set(used))
    assert 0 < infeasible < 120 and shared > 0  # every kind of instance was met


def test_memory_and_the_time_budget_bound_a_shared_device():
    one = Sharing(((100,),), 1000)

    def two(a: Role, b: Role) -> Problem:
        return Problem((1,), ((Item((1,), 5, SCALE, (a,)),), (Item((1,), 5, SCALE, (b,)),)), sharing=one)

    ok = solve(two(Role(0, 50, 500), Role(0, 50, 500)))
    assert ok.status == "OPTIMAL" and ok.placement == (((0, 0),), ((0, 0),))
    assert solve(two(Role(0, 51, 500), Role(0, 50, 500))).status == "INFEASIBLE"  # 101 bytes
    assert solve(two(Role(0, 50, 501), Role(0, 50, 500))).status == "INFEASIBLE"  # 1001 of 1000
    # one service never takes a device twice, whatever the budgets
    twice = Problem((1,), ((Item((2,), 5, SCALE, (Role(0, 1, 1), Role(0, 1, 1))),),), sharing=one)
    assert solve(twice).status == "INFEASIBLE" and brute_force(twice) == (None, None)


def test_roles_must_match_counts():
    bad = Problem((2,), ((Item((2,), 5, SCALE, (Role(0, 1, 1),)),),), sharing=Sharing(((9, 9),), 10))
    with pytest.raises(ValueError, match="roles do not match"):
        solve(bad)


# -- allocate --share end to end --------------------------------------------------------------------------

def _files(tmp_path: Path, rates: tuple = (None, None)) -> tuple[Path, Path]:
    (tmp_path / "cluster.yaml").write_text("devices:\n  - {name: a, profile: rpi5}\n"
                                           "network: {bandwidth_mbps: 100, latency_ms: 1}\n")
    lines = ["services:"]
    for (name, model), rate in zip((("chain", "tinychain"), ("conv", "tinyconv")), rates):
        extra = "" if rate is None else f", rate_ips: {rate}"
        lines.append(f"  - {{name: {name}, model: {MODELS / (model + '.onnx')}, sla_ms: 1000{extra}}}")
    (tmp_path / "services.yaml").write_text("\n".join(lines) + "\n")
    return tmp_path / "services.yaml", tmp_path / "cluster.yaml"


def test_sharing_meets_every_sla_where_exclusive_devices_cannot(tmp_path):
    services, devices = _files(tmp_path)
    with pytest.raises(UserError, match="cannot meet every SLA"):  # one device, two services
        allocate(services, devices, tmp_path / "x")
    res = CliRunner().invoke(cli, ["allocate", str(services), "--devices", str(devices), "-o", str(tmp_path / "out"),
                                   "--share", "--json"], prog_name="edgec")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["dropped"] == [] and got["status"] == "OPTIMAL"
    assert [s["devices"] for s in got["services"].values()] == [["a"], ["a"]]
    (a,) = got["share"]["devices"].values()
    assert a["services"] == ["chain", "conv"]
    assert a["memory_mb"] == pytest.approx(sum(s["memory_mb"]["a"] for s in got["services"].values()), abs=2e-3)
    # no rate: each service loads the device with 1000 / sla_ms requests per second
    held = {n: 1000.0 / s["sla_ms"] * s["predicted_latency_ms"] for n, s in got["services"].items()}
    assert a["held_ms_per_s"] == pytest.approx(sum(held.values()), rel=1e-3)
    assert load_allocation(tmp_path / "out").shared


def test_the_time_budget_refuses_what_each_service_alone_fits(tmp_path):
    services, devices = _files(tmp_path)
    free = allocate(services, devices, tmp_path / "free", share=True)["services"]
    # each at 60% of its throughput: 600 ms per s of the device alone, 1200 together
    rates = tuple(round(0.6 * free[n]["predicted_throughput_ips"], 3) for n in ("chain", "conv"))
    services, devices = _files(tmp_path, rates)
    with pytest.raises(UserError, match="cannot meet every SLA"):
        allocate(services, devices, tmp_path / "busy", share=True)
    got = allocate(services, devices, tmp_path / "busy", share=True, best_effort=True)
    assert len(got["services"]) == 1 and len(got["dropped"]) == 1
    (a,) = got["share"]["devices"].values()
    assert 550 < a["held_ms_per_s"] <= BUDGET_MS


def test_without_share_the_reader_refuses_a_device_given_twice(tmp_path):
    services, devices = _files(tmp_path)
    allocate(services, devices, tmp_path / "out", share=True)
    data = json.loads((tmp_path / "out" / "allocation.json").read_text())
    data["share"] = None
    (tmp_path / "out" / "allocation.json").write_text(json.dumps(data))
    from edgec.runtime.errors import InputError
    with pytest.raises(InputError, match="is given to both 'chain' and 'conv'"):
        load_allocation(tmp_path / "out")
    for entry in data["services"].values():  # an allocation written before --share: no such keys
        entry.pop("held_ms_per_s")
    data.pop("share")
    data["services"]["conv"]["devices"] = ["b"]
    (tmp_path / "out" / "allocation.json").write_text(json.dumps(data))
    assert not load_allocation(tmp_path / "out").shared
