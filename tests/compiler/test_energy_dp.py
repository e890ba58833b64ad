"""The pipeline energy DP (plan/pipeline_energy.py) equals brute force on small instances: hard and soft
SLAs, power modes (several columns of one device), per-request costs; and its infeasible cases. Its tables
are per class of alike columns, and its labels within a budget."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgec.compiler.plan import pipeline_energy
from edgec.compiler.plan.pipeline_energy import (EnergyColumns, LabelBudgetExceeded, column_tables,
                                                 energy_of, solve_energy)
from edgec.compiler.plan.pipeline_tables import column_classes
from edgec.compiler.plan.planner import EnergyGoal, InfeasibleError
from pipeline_reference import brute_force_energy
from test_pipeline_dp import make_problem, problems

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def instances(draw):
    """A small problem whose columns are grouped onto devices (modes), with power, radio and request
    figures, and a goal whose SLA ranges from unmeetable to loose."""
    problem = draw(problems(dyadic=False, max_blocks=6, max_devices=4))
    K = problem.n_devices
    device = np.array(draw(st.lists(st.integers(0, K - 1), min_size=K, max_size=K)))
    fl = lambda lo, hi: st.floats(lo, hi, allow_nan=False, allow_infinity=False)  # noqa: E731
    idle = np.array(draw(st.lists(fl(0.1, 10.0), min_size=K, max_size=K)))
    busy = idle + np.array(draw(st.lists(fl(0.0, 20.0), min_size=K, max_size=K)))
    tx = np.array(draw(st.lists(fl(0.0, 500.0), min_size=K, max_size=K)))
    rx = np.array(draw(st.lists(fl(0.0, 500.0), min_size=K, max_size=K)))
    req = draw(st.booleans())
    r_in = np.array(draw(st.lists(fl(0.0, 3.0), min_size=K, max_size=K))) if req else np.zeros(K)
    r_out = np.array(draw(st.lists(fl(0.0, 3.0), min_size=K, max_size=K))) if req else np.zeros(K)
    cols = EnergyColumns(device, idle, busy, tx, rx, r_in, r_out)
    goal = EnergyGoal(draw(fl(0.0, 60.0)), soft=draw(st.booleans()), lam=draw(fl(0.0, 50.0)))
    return problem, cols, goal


@SETTINGS
@given(instances())
def test_energy_dp_equals_brute_force(inst):
    problem, cols, goal = inst
    ref = [r for r in brute_force_energy(problem, cols, goal) if math.isfinite(r[0])]
    if not ref:
        with pytest.raises(InfeasibleError):
            solve_energy(problem, cols, goal)
        return
    sol = solve_energy(problem, cols, goal)
    assert sol.objective == pytest.approx(ref[0][0], rel=1e-9, abs=1e-9)
    lat, energy = energy_of(problem, cols, sol.stages)  # the plan it returns has the cost it claims
    assert lat == pytest.approx(sol.latency_ms, rel=1e-9, abs=1e-9)
    assert energy == pytest.approx(sol.energy_mj, rel=1e-9, abs=1e-9)
    assert len({int(cols.device[s.device]) for s in sol.stages}) == len(sol.stages)  # one mode per device


def _two_devices():
    """A fast hungry device and a slow frugal one: the latency plan and the energy plan differ."""
    problem = make_problem([[1.0, 4.0], [1.0, 4.0]], [0, 0], [0, 0], [100], [10**9, 10**9],
                           [[1.0, 1e6], [1e6, 1.0]])
    cols = EnergyColumns(np.array([0, 1]), np.array([5.0, 0.5]), np.array([30.0, 2.0]), np.zeros(2), np.zeros(2),
                         np.zeros(2), np.zeros(2))
    return problem, cols


def test_sla_decides_between_fast_and_frugal():
    problem, cols = _two_devices()
    loose = solve_energy(problem, cols, EnergyGoal(100.0))
    assert [s.device for s in loose.stages] == [1] and loose.energy_mj == pytest.approx(16.0)
    tight = solve_energy(problem, cols, EnergyGoal(3.0))
    assert [s.device for s in tight.stages] == [0] and tight.latency_ms == pytest.approx(2.0)


def test_unmeetable_hard_sla_is_infeasible_and_soft_pays_for_it():
    problem, cols = _two_devices()
    with pytest.raises(InfeasibleError):
        solve_energy(problem, cols, EnergyGoal(1.0))
    soft = solve_energy(problem, cols, EnergyGoal(1.0, soft=True, lam=1.0))
    assert soft.objective == pytest.approx(soft.energy_mj + 1.0 * (soft.latency_ms - 1.0))


def test_a_slower_partial_plan_is_kept_when_it_spends_less():
    """Two labels of one state (same devices used, same last device): the faster one spends more. The
    SLA rules out the frugal device alone; the best plan keeps most blocks on it, which only the slower
    label of its state leads to (a DP that kept the fastest label per state would answer 46.4 mJ)."""
    problem = make_problem([[1.0, 2.0]] * 3, [0] * 3, [0] * 3, [0, 0], [10**9, 10**9], [[1.0, 1.0], [1.0, 1.0]])
    cols = EnergyColumns(np.array([0, 1]), np.array([1.0, 0.1]), np.array([21.0, 1.1]), np.zeros(2), np.zeros(2),
                         np.zeros(2), np.zeros(2))
    sol = solve_energy(problem, cols, EnergyGoal(5.0))
    assert sol.latency_ms == pytest.approx(5.0) and sol.energy_mj == pytest.approx(29.5)
    assert [(s.hi - s.lo) for s in sol.stages if s.device == 1] == [2]


@pytest.mark.parametrize("seed", range(6))
def test_alike_devices_taken_in_order_keep_the_optimum(seed):
    """Three identical devices in two power modes each (six columns; a device's two columns share no link):
    taking alike devices in index order finds the optimum of the unrestricted search, and a plan on the
    first devices."""
    rng = np.random.default_rng(seed)
    B, D = 5, 3
    fast, slow = rng.uniform(0.5, 2.0, size=B), rng.uniform(2.0, 4.0, size=B)
    device = np.repeat(np.arange(D), 2)  # columns 2d and 2d + 1: device d in its fast and slow mode
    block = np.stack([fast if k % 2 == 0 else slow for k in range(2 * D)], axis=1)
    bw = np.where(device[:, None] == device[None, :], 0.0, 64.0)
    np.fill_diagonal(bw, 1.0)
    problem = make_problem(block, [3 * 10**6] * B, [10**6] * B, [256] * (B - 1), [8 * 10**6] * (2 * D), bw,
                           np.full((2 * D, 2 * D), 0.25))
    idle = np.tile([2.0, 1.0], D)
    cols = EnergyColumns(device, idle, idle + np.tile([6.0, 2.0], D), np.full(2 * D, 50.0), np.full(2 * D, 50.0),
                         np.zeros(2 * D), np.zeros(2 * D))
    for goal in (EnergyGoal(float(rng.uniform(8.0, 30.0))), EnergyGoal(5.0, soft=True, lam=3.0)):
        try:
            free = solve_energy(problem, cols, goal)
        except InfeasibleError:
            with pytest.raises(InfeasibleError):
                solve_energy(problem, cols, goal, alike=np.zeros(D, dtype=int))
            continue
        ordered = solve_energy(problem, cols, goal, alike=np.zeros(D, dtype=int))
        assert ordered.objective == pytest.approx(free.objective, rel=1e-12)
        used = [int(device[s.device]) for s in ordered.stages]
        assert sorted(used) == list(range(len(used)))  # the first devices, whatever the modes


def _moded_fleet(per_kind: list[int], B: int = 4, seed: int = 0):
    """Devices of a few kinds (alike within a kind), kind k with per_kind[k] devices in two power modes: its
    columns problem (a device's two columns share no link) and their figures."""
    rng = np.random.default_rng(seed)
    kinds = np.repeat(np.arange(len(per_kind)), per_kind)
    device = np.repeat(np.arange(kinds.size), 2)  # columns 2d, 2d + 1: device d in its fast and its slow mode
    kind = kinds[device]
    fast = rng.integers(2, 8, (B, len(per_kind))) / 4.0
    block = np.where(np.arange(device.size) % 2 == 0, fast[:, kind], 2.0 * fast[:, kind])
    bw_k = 2.0 ** rng.integers(5, 8, (len(per_kind), len(per_kind)))
    bw = np.minimum(bw_k, bw_k.T)[np.ix_(kind, kind)]
    bw[device[:, None] == device[None, :]] = 0.0
    problem = make_problem(block, [10**6] * B, [10**6] * B, [128] * (B - 1), [3 * 10**6] * device.size, bw,
                           np.full((device.size, device.size), 0.125))
    idle = np.where(np.arange(device.size) % 2 == 0, 2.0, 0.5) * (1 + kind)
    cols = EnergyColumns(device, idle, 3.0 * idle, np.full(device.size, 40.0), np.full(device.size, 20.0),
                         np.zeros(device.size), np.zeros(device.size))
    return problem, cols, kinds


def test_column_classes_are_the_modes_of_alike_devices():
    """3 kinds of 4, 1 and 3 devices, two modes each: 16 columns in 6 classes, and the tables hold 6 classes
    (the stage and transfer tables of 256 such devices are those of 8)."""
    problem, cols, _ = _moded_fleet([4, 1, 3])
    cls = column_classes(problem, cols.device)
    assert np.unique(cls).size == 6
    assert cls.tolist() == [0, 1, 0, 1, 0, 1, 0, 1, 8, 9, 10, 11, 10, 11, 10, 11]
    tab = column_tables(problem, cols)
    assert tab.Q == 6 and tab.T.shape == (3, 6, 6)
    for a in range(cols.device.size):  # every pair of columns of two devices: the problem's transfer
        for b in range(cols.device.size):
            if cols.device[a] != cols.device[b]:
                assert tab.T[0, tab.cq[a], tab.cq[b]] == problem.transfer_ms(0, a, b)
    big, big_cols, _ = _moded_fleet([128, 128])
    small, small_cols, _ = _moded_fleet([1, 1])
    held = [sum(x.nbytes for x in (t.C, t.T)) for t in (column_tables(big, big_cols), column_tables(small, small_cols))]
    assert held[0] == held[1]


@pytest.mark.parametrize("seed", range(4))
def test_energy_dp_on_column_classes_is_the_dp_on_columns(seed, monkeypatch):
    """The DP on the tables per class of columns returns the plan, latency and energy the DP on one class per
    column returns, bit for bit."""
    problem, cols, kinds = _moded_fleet([3, 2, 1], B=5, seed=seed)
    alike = np.array([int(np.flatnonzero(kinds == k)[0]) for k in kinds])
    goals = (EnergyGoal(12.0), EnergyGoal(3.0, soft=True, lam=2.0))
    got = [solve_energy(problem, cols, g, alike) for g in goals]
    monkeypatch.setattr(pipeline_energy, "column_classes", lambda p, device: np.arange(p.n_devices))
    want = [solve_energy(problem, cols, g, alike) for g in goals]
    assert got == want


def test_the_label_budget_refuses_in_one_line(monkeypatch):
    """Over LABEL_BUDGET labels held, the DP refuses with the size, in one line; the planner passes it on
    as it is (not as an SLA out of reach)."""
    problem, cols, _ = _moded_fleet([3, 2, 1], B=5)
    solve_energy(problem, cols, EnergyGoal(1e6, soft=True, lam=1.0))  # within the default budget
    monkeypatch.setattr(pipeline_energy, "LABEL_BUDGET", 20)
    with pytest.raises(LabelBudgetExceeded) as err:
        solve_energy(problem, cols, EnergyGoal(1e6, soft=True, lam=1.0))
    msg = str(err.value)
    assert "\n" not in msg and "more than 20 labels" in msg and f"over {cols.device.size} columns" in msg
