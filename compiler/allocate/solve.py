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

Exclusive devices (the default): the options chosen take at most a class's size of its devices, a count
per class (the devices of a class are interchangeable). Shared devices (`Problem.sharing`): each option
lists its roles, one per device its plan works on (class, bytes it holds, load), and every role is placed
on a device of its class, two roles of one service never on the same device, so that on every device the
bytes held fit its memory and the loads add up to at most the time budget (allocate.py says what a load
is). `devices_i` then counts a service's roles.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass

__all__ = ["Item", "Role", "Sharing", "Problem", "Solution", "SCALE", "solve", "brute_force"]

SCALE = 1_000_000


@dataclass(frozen=True)
class Role:
    """A device an option works on, when devices may be shared: its class, the bytes it must hold there,
    and its load there (an integer; a device takes at most `Sharing.budget`)."""

    cls: int
    memory: int
    load: int


@dataclass(frozen=True)
class Item:
    """One option of one service: devices per class, its integer value and normalised utility; with
    shared devices, its roles too (as many of each class as `counts` says)."""

    counts: tuple[int, ...]
    value: int
    fair: int
    roles: tuple[Role, ...] = ()

    @property
    def size(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class Sharing:
    """What each device may take when services share devices: `memory[k][m]`, the bytes device m of class
    k may hold; `budget`, the load any device may take."""

    memory: tuple[tuple[int, ...], ...]
    budget: int


Placement = tuple[tuple[tuple[int, int], ...], ...]  # per service, per role of its option: (class, member)


@dataclass(frozen=True)
class Problem:
    capacity: tuple[int, ...]  # devices per class
    items: tuple[tuple[Item, ...], ...]  # per service, its options
    fairness: bool = False
    sharing: Sharing | None = None  # None: every device serves one service at most

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
        if self.sharing is not None:
            return self.place(choice) is not None
        used = [0] * len(self.capacity)
        for i, j in enumerate(choice):
            for k, c in enumerate(self.items[i][j].counts):
                used[k] += c
        return all(u <= c for u, c in zip(used, self.capacity))

    def place(self, choice: tuple[int, ...]) -> Placement | None:
        """Shared devices: a device for every role of the chosen options within every device's memory and
        budget (a depth-first search, heaviest roles first: for the reference on small instances), or None."""
        sh = self.sharing
        roles = sorted(((i, r, role) for i, j in enumerate(choice) for r, role in enumerate(self.items[i][j].roles)),
                       key=lambda t: (-t[2].memory, -t[2].load, t[0], t[1]))
        memory = [list(m) for m in sh.memory]
        load = [[sh.budget] * len(m) for m in sh.memory]
        taken: set[tuple[int, int, int]] = set()  # (service, class, member)
        where: dict[tuple[int, int], tuple[int, int]] = {}

        def go(n: int) -> bool:
            if n == len(roles):
                return True
            i, r, role = roles[n]
            k = role.cls
            for m in range(len(memory[k])):
                if (i, k, m) in taken or memory[k][m] < role.memory or load[k][m] < role.load:
                    continue
                memory[k][m] -= role.memory
                load[k][m] -= role.load
                taken.add((i, k, m))
                where[(i, r)] = (k, m)
                if go(n + 1):
                    return True
                memory[k][m] += role.memory
                load[k][m] += role.load
                taken.discard((i, k, m))
            return False

        if not go(0):
            return None
        return tuple(tuple(where[(i, r)] for r in range(len(self.items[i][j].roles))) for i, j in enumerate(choice))


@dataclass(frozen=True)
class Solution:
    status: str  # OPTIMAL, FEASIBLE (stopped at the time limit with a solution), INFEASIBLE or UNKNOWN
    choice: tuple[int, ...] | None  # the option chosen per service
    key: tuple[int, ...] | None
    gap: float | None  # FEASIBLE: (bound - objective) / |bound| of the last stage solved; else None or 0
    seconds: float
    placement: Placement | None = None  # shared devices: where each role of the chosen options runs


def solve(problem: Problem, time_limit: float = 10.0, workers: int = 1) -> Solution:
    """The optimal choice by CP-SAT (one search worker by default: the same answer on every run)."""
    from ortools.sat.python import cp_model  # imported here: the rest of edgec does not need ortools loaded

    t0 = time.perf_counter()
    model = cp_model.CpModel()
    x = [[model.NewBoolVar(f"x{i}_{j}") for j in range(len(opts))] for i, opts in enumerate(problem.items)]
    for row in x:
        model.AddExactlyOne(row)
    y = _placed(model, problem, x) if problem.sharing is not None else None
    if y is None:
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
    placement = None
    if y is not None:
        placement = tuple(tuple(next(km for km, v in y[i][j][r].items() if solver.BooleanValue(v))
                                for r in range(len(problem.items[i][j].roles))) for i, j in enumerate(choice))
    return Solution(status, choice, problem.key(choice), gap, time.perf_counter() - t0, placement)


def _placed(model, problem: Problem, x) -> list:
    """Shared devices: y[i][j][r][(k, m)] places role r of service i's option j on device m of class k
    (exactly one device when the option is chosen, none otherwise); per device, one role of a service at
    most, the bytes within its memory and the loads within the budget."""
    sh = problem.sharing
    y = []
    on: dict[tuple[int, int], list] = {}  # device -> [(role, var)]
    mine: dict[tuple[int, int, int], list] = {}  # (service, class, member) -> vars
    for i, opts in enumerate(problem.items):
        y.append([])
        for j, it in enumerate(opts):
            if sorted(Counter(r.cls for r in it.roles).items()) != [(k, c) for k, c in enumerate(it.counts) if c]:
                raise ValueError(f"service {i} option {j}: its roles do not match its counts {it.counts}")
            per_role = []
            for r, role in enumerate(it.roles):
                vs = {(role.cls, m): model.NewBoolVar(f"y{i}_{j}_{r}_{m}") for m in range(len(sh.memory[role.cls]))}
                model.Add(sum(vs.values()) == x[i][j])
                for (k, m), v in vs.items():
                    on.setdefault((k, m), []).append((role, v))
                    mine.setdefault((i, k, m), []).append(v)
                per_role.append(vs)
            y[-1].append(per_role)
    for vs in mine.values():
        model.AddAtMostOne(vs)
    for (k, m), placed in on.items():
        model.Add(sum(role.memory * v for role, v in placed if role.memory) <= sh.memory[k][m])
        model.Add(sum(role.load * v for role, v in placed if role.load) <= sh.budget)
    return y


def brute_force(problem: Problem) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(the best choice, its key) by trying every combination of options (and, with shared devices, every
    placement of their roles); (None, None) if none fits."""
    best, best_key = None, None
    for choice in itertools.product(*(range(len(opts)) for opts in problem.items)):
        if problem.fits(choice):
            key = problem.key(choice)
            if best_key is None or key > best_key:
                best, best_key = choice, key
    return best, best_key
