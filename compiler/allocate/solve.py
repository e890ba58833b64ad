"""The allocation as a multiple-choice knapsack (HiTDL Sec. 6): one option per service, the devices of
every class shared out within the class's size, solved exactly with ortools CP-SAT; and a brute-force
reference for small instances (the tests check that CP-SAT's answer is optimal against it).

The values are integers (CP-SAT's objective is linear over integers; the brute force compares the same
integers, so the two agree exactly):

- weighted: maximise  sum_i (value_i * K - devices_i)  with value_i = round(SCALE * priority_i * utility_i)
  and K = one more than the cluster's devices, so that of two allocations of equal value the one that
  leaves more devices idle wins;
- fairness: first maximise the least normalised utility min_i fair_i (fair_i = round(SCALE * utility_i /
  the service's best utility)), then, with that minimum kept, the weighted objective (lexicographic).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

__all__ = ["Item", "Problem", "Solution", "SCALE", "solve", "brute_force"]

SCALE = 1_000_000


@dataclass(frozen=True)
class Item:
    """One option of one service: devices per class, its integer value and normalised utility."""

    counts: tuple[int, ...]
    value: int
    fair: int

    @property
    def size(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class Problem:
    capacity: tuple[int, ...]  # devices per class
    items: tuple[tuple[Item, ...], ...]  # per service, its options
    fairness: bool = False

    @property
    def k(self) -> int:
        return sum(self.capacity) + 1

    def weighted(self, choice: tuple[int, ...]) -> int:
        return sum(self.items[i][j].value * self.k - self.items[i][j].size for i, j in enumerate(choice))

    def least_fair(self, choice: tuple[int, ...]) -> int:
        return min((self.items[i][j].fair for i, j in enumerate(choice)), default=0)

    def key(self, choice: tuple[int, ...]) -> tuple[int, ...]:
        """What the solver maximises, as a tuple compared lexicographically."""
        w = self.weighted(choice)
        return (self.least_fair(choice), w) if self.fairness else (w,)

    def fits(self, choice: tuple[int, ...]) -> bool:
        used = [0] * len(self.capacity)
        for i, j in enumerate(choice):
            for k, c in enumerate(self.items[i][j].counts):
                used[k] += c
        return all(u <= c for u, c in zip(used, self.capacity))


@dataclass(frozen=True)
class Solution:
    status: str  # OPTIMAL, FEASIBLE (stopped at the time limit with a solution), INFEASIBLE or UNKNOWN
    choice: tuple[int, ...] | None  # the option chosen per service
    key: tuple[int, ...] | None
    gap: float | None  # FEASIBLE: (bound - objective) / |bound| of the last stage solved; else None or 0
    seconds: float


def solve(problem: Problem, time_limit: float = 10.0, workers: int = 1) -> Solution:
    """The optimal choice by CP-SAT (one search worker by default: the same answer on every run)."""
    from ortools.sat.python import cp_model  # imported here: the rest of edgec does not need ortools loaded

    t0 = time.perf_counter()
    model = cp_model.CpModel()
    x = [[model.NewBoolVar(f"x{i}_{j}") for j in range(len(opts))] for i, opts in enumerate(problem.items)]
    for row in x:
        model.AddExactlyOne(row)
    for k, cap in enumerate(problem.capacity):
        model.Add(sum(it.counts[k] * x[i][j] for i, opts in enumerate(problem.items)
                      for j, it in enumerate(opts) if it.counts[k]) <= cap)
    weighted = sum((it.value * problem.k - it.size) * x[i][j]
                   for i, opts in enumerate(problem.items) for j, it in enumerate(opts))
    stages = []
    if problem.fairness:
        least = model.NewIntVar(0, SCALE, "least")
        for i, opts in enumerate(problem.items):
            model.Add(least <= sum(it.fair * x[i][j] for j, it in enumerate(opts)))
        stages.append(least)
    stages.append(weighted)
    status, gap = "OPTIMAL", 0.0
    solver = None
    for n, objective in enumerate(stages):
        model.Maximize(objective)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = workers
        solver.parameters.max_time_in_seconds = max(time_limit - (time.perf_counter() - t0), 0.01)
        result = solver.Solve(model)
        if result == cp_model.INFEASIBLE:
            return Solution("INFEASIBLE", None, None, None, time.perf_counter() - t0)
        if result not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return Solution("UNKNOWN", None, None, None, time.perf_counter() - t0)
        if result == cp_model.FEASIBLE:
            status = "FEASIBLE"
            bound, value = solver.BestObjectiveBound(), solver.ObjectiveValue()
            gap = max(gap, (bound - value) / max(abs(bound), 1.0))
        if n + 1 < len(stages):  # keep what this stage reached while the next one optimises
            model.Add(objective >= int(round(solver.ObjectiveValue())))
            model.ClearHints()
            for row in x:
                for v in row:
                    model.AddHint(v, solver.BooleanValue(v))
    choice = tuple(next(j for j, v in enumerate(row) if solver.BooleanValue(v)) for row in x)
    return Solution(status, choice, problem.key(choice), gap, time.perf_counter() - t0)


def brute_force(problem: Problem) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(the best choice, its key) by trying every combination of options; (None, None) if none fits."""
    best, best_key = None, None
    for choice in itertools.product(*(range(len(opts)) for opts in problem.items)):
        if problem.fits(choice):
            key = problem.key(choice)
            if best_key is None or key > best_key:
                best, best_key = choice, key
    return best, best_key
