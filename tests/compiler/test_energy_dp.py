"""The pipeline energy DP (plan/pipeline_energy.py) equals brute force on small instances: hard and soft
SLAs, power modes (several columns of one device), per-request costs; and its infeasible cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgec.compiler.plan.pipeline_energy import EnergyColumns, energy_of, solve_energy
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
