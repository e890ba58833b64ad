"""The pipeline planner for `--objective energy`: the least energy per request under a latency SLA, exact.

The problem is the pipeline planner's (pipeline_problem.py `PipelineProblem`: contiguous stages of the block
chain, each on its own device) whose columns are operating points: a column is a device in one of its
power modes (`EnergyColumns.device`; without modes, one column per device), and a plan uses at most
one column of each device. Energy per request is cost/energy.py's, with the span the plan's latency L:

    E = sum over stages s on column k:  busy_w[k] c_s + idle_w[k] (L - c_s)  + radio
      = sum_s c_s (busy_w - idle_w)[k]  +  radio  +  L x P(M)

where c_s is the stage's compute, radio the cuts' bytes x (tx of the sender + rx of the receiver), M the
columns the plan uses and P(M) the sum of their idle power. L is additive too: the stages' compute, the
transfers, plus the runtime's per-request cost (request_in of the first stage's device, request_out of
the last's, as `evaluate` charges them to a pipeline plan). Only the product L x P(M) couples the
stages, and P(M) is known once M is: the DP's state (blocks done j, columns used m, last column a)
already holds m. A label is (L, E0) with E0 = the additive part; at the end E = E0 + L x P(m). Every
completion adds the same dL >= 0, dE0 >= 0 (busy_w >= idle_w: the profile schema checks it) and the same
growth of m to two labels of one state, and E = E0 + L x P(m') and the objective

    hard SLA X:  E, subject to L <= X          soft (Dora's QoE):  E + lambda x max(0, L - X)

are non-decreasing in L and in E0, so a label that another label of its state matches or beats in both
L and E0 can be dropped: the Pareto set of each state is exact. Bounds only prune: a label whose L plus
the least compute of the blocks left already exceeds X (hard), or whose objective with that least
remainder cannot beat the best plan found so far (the best single-device plan, to start with).

Peak memory, K columns in Q classes of alike columns (pipeline_tables.py `column_classes`: the i-th modes of
alike devices) and B blocks: the stage and transfer tables per class, O(B^2 Q + B Q^2) (pipeline_tables.py
`StageTables`; a cut's radio energy is priced per transition from the two columns' figures, never tabled),
and the Pareto labels of every (block, column mask, last column) state the bounds keep. The masks are sets of
columns with alike devices taken in index order: for a fleet of a few kinds with one mode each, at most
prod(n_c + 1) masks; for many distinct devices, up to 2^K. The labels held at once (kept, and pending for
later blocks) are capped by `LABEL_BUDGET`: beyond it the DP refuses (`LabelBudgetExceeded`, an
InfeasibleError naming the budget, the states and the columns) instead of growing without limit, so the
labels take O(LABEL_BUDGET) memory, about half a gigabyte at most (fleet-scale.md: Memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..cost import CostTable
from ..cost.energy import device_mj, link_mj
from ..graph import LayerGraph
from ..plan_types import Plan, Stage
from .pipeline_dp import infeasible_message, memory_feasible
from .pipeline_problem import PipelineProblem, StageChoice, pipeline_problem
from .pipeline_tables import StageTables, column_classes, device_classes
from .planner import EnergyGoal, InfeasibleError, PlanOptions
from .stats import count as count_work

__all__ = ["energy_frontier", "EnergyColumns", "EnergySolution", "solve_energy", "energy_of", "plan_pipeline_energy",
           "device_columns", "LABEL_BUDGET", "LabelBudgetExceeded"]

# The most labels the energy DP holds at once (those its states keep and those pending for later blocks): at
# 200 to 330 bytes a label with its back pointer and its share of the states' keys (traced on the frontier DP,
# SqueezeNet on 4 and 6 all-distinct devices), about half a gigabyte.
LABEL_BUDGET = 2_000_000


class LabelBudgetExceeded(InfeasibleError):
    """The energy DP would hold more than LABEL_BUDGET labels (the message says how many states it had)."""


@dataclass(frozen=True, eq=False)
class EnergyColumns:
    """Per column of the problem (arrays of length K): the physical device it runs on (an index; two
    columns of one device are two modes of it), its power (W), its radio energy (nJ per byte sent /
    received) and the runtime's per-request cost on it (ms, network.py request_in_ms / request_out_ms)."""

    device: np.ndarray
    idle_w: np.ndarray
    busy_w: np.ndarray
    tx_nj: np.ndarray
    rx_nj: np.ndarray
    request_in_ms: np.ndarray
    request_out_ms: np.ndarray


@dataclass(frozen=True)
class EnergySolution:
    stages: tuple[StageChoice, ...]  # device = column
    latency_ms: float
    energy_mj: float
    objective: float


@dataclass(frozen=True)
class _Column:
    device: int  # index in the cluster
    mode: str  # the profile's operating point
    cost: CostTable  # priced in that mode


def _columns(cost: CostTable) -> list[_Column]:
    """Every (device, power mode) operating point, devices in cluster order, each device's top level first.

    A column is priced by a cost table with its device in its mode, one per mode name with every device that
    has it there (a device's figures do not depend on the others' modes): a few tables of O(L D), not one per
    column (O(K L D): 160 tables on 256 devices of 8 kinds, most of the DP's memory and time)."""
    devices = cost.cluster.devices
    tops = [d.mode or d.profile.top_mode for d in devices]
    priced: dict[str, CostTable] = {}

    def in_mode(m: str) -> CostTable:
        if m not in priced:
            priced[m] = cost.with_modes({d.name: m for d, top in zip(devices, tops) if m != top
                                         and m in d.profile.mode_names})
        return priced[m]

    out = []
    for i, (d, top) in enumerate(zip(devices, tops)):
        out.append(_Column(i, top, cost))
        out.extend(_Column(i, m, in_mode(m)) for m in d.profile.mode_names if m != top)
    return out


def _column_problem(base: PipelineProblem, cost: CostTable, graph: LayerGraph, columns: list[_Column]) -> PipelineProblem:
    """The pipeline problem whose devices are the columns (two columns of one device have no link: a plan
    never uses both)."""
    if len(columns) == len(cost.devices):
        return base
    idx = np.array([c.device for c in columns])
    blocks = graph.pipeline_blocks
    block_ms = np.stack([np.array([c.cost.layer_ms[lo:hi, c.device].sum() for lo, hi in blocks]) for c in columns], axis=1)
    bw = base.bandwidth_bytes_per_ms[np.ix_(idx, idx)].copy()
    bw[idx[:, None] == idx[None, :]] = 0.0
    bw[np.arange(len(idx)), np.arange(len(idx))] = 1.0
    # every per-device array follows the columns (PipelineProblem refuses one that does not); a column's
    # traits are its device's in that mode, so two alike devices' columns of one mode stay interchangeable
    return replace(base, devices=tuple(f"{cost.devices[c.device]}@{c.mode}" for c in columns), block_ms=block_ms,
                   device_mem_bytes=base.device_mem_bytes[idx], bandwidth_bytes_per_ms=bw,
                   link_latency_ms=base.link_latency_ms[np.ix_(idx, idx)], request_in_ms=None, request_out_ms=None,
                   traits=tuple(c.cost.cluster.devices[c.device].traits for c in columns))


def device_columns(cost: CostTable, columns: list[_Column] | None = None) -> EnergyColumns:
    """The energy figures of each column (default: one per device of the cost table). A device without
    `power_w` cannot be priced: InfeasibleError names it (the energy objective needs every figure)."""
    columns = columns or [_Column(i, "", cost) for i in range(len(cost.devices))]
    devs = [c.cost.cluster.devices[c.device] for c in columns]
    unknown = sorted({d.name for d in devs if not d.power.known})
    if unknown:
        raise InfeasibleError(f"the energy objective needs power_w (idle and busy) in every device's profile; "
                              f"{', '.join(unknown)} ha{'s' if len(unknown) == 1 else 've'} none")
    net = cost.network
    power = [d.power for d in devs]
    return EnergyColumns(
        device=np.array([c.device for c in columns]),
        idle_w=np.array([p.idle_w for p in power], dtype=np.float64),
        busy_w=np.array([p.busy_w for p in power], dtype=np.float64),
        tx_nj=np.array([p.tx_nj_per_byte or 0.0 for p in power], dtype=np.float64),
        rx_nj=np.array([p.rx_nj_per_byte or 0.0 for p in power], dtype=np.float64),
        request_in_ms=np.array([net.request_in_ms(d.name) for d in devs], dtype=np.float64),
        request_out_ms=np.array([net.request_out_ms(d.name) for d in devs], dtype=np.float64),
    )


def plan_pipeline_energy(graph: LayerGraph, cost: CostTable, options: PlanOptions) -> list[Plan]:
    """The pipeline plan of least energy per request under options.energy (`solve_energy`), each device in
    the power mode the plan chooses for it (in the plan's `modes` when one is not its top level's). When a hard SLA
    is out of reach, the InfeasibleError says the least latency a pipeline plan has."""
    goal = options.energy
    if goal is None:
        raise ValueError("the energy objective needs an SLA (--sla-ms)")
    base = pipeline_problem(graph, cost)
    columns = _columns(cost)
    cols = device_columns(cost, columns)
    problem = _column_problem(base, cost, graph, columns)
    try:
        sol = solve_energy(problem, cols, goal, device_classes(base))
    except LabelBudgetExceeded:
        raise
    except InfeasibleError as exc:
        if not memory_feasible(base, None):
            raise
        fastest = [energy_of(problem, cols, s.stages)[0] for s in _fastest(problem, cols)]
        if not fastest:  # the timing DP found none within its label budget: the reason stands alone
            raise
        raise InfeasibleError(f"{exc}: the fastest pipeline plan takes {min(fastest):.3f} ms") from None
    blocks = graph.pipeline_blocks
    stages = tuple(Stage(cost.devices[columns[s.device].device], blocks[s.lo][0], blocks[s.hi - 1][1])
                   for s in sol.stages)
    modes = tuple((cost.devices[columns[s.device].device], columns[s.device].mode) for s in sol.stages
                  if columns[s.device].cost is not cost)
    if modes:
        return [Plan("pipeline", "energy", stages, modes).ensures(graph)]
    return [Plan("pipeline", "energy", stages).ensures(graph)]


def _fastest(problem: PipelineProblem, cols: EnergyColumns):
    """The least-latency placement of the columns' problem, one column per device: the energy DP with no
    energy at all and a soft SLA of 0 ms at 1 mJ per ms minimises latency exactly."""
    zeros = np.zeros(problem.n_devices)
    timing = EnergyColumns(cols.device, zeros, zeros, zeros, zeros, cols.request_in_ms, cols.request_out_ms)
    try:
        return [solve_energy(problem, timing, EnergyGoal(0.0, soft=True, lam=1.0))]
    except InfeasibleError:
        return []


def energy_of(problem: PipelineProblem, cols: EnergyColumns, stages: tuple[StageChoice, ...]) -> tuple[float, float]:
    """(latency, energy) of a placement under the model of the module docstring, summed the direct way
    (per device: busy and idle power over the span; per cut: bytes x radio energy); what the brute-force
    reference checks the DP against."""
    compute = [float(problem.block_ms[s.lo:s.hi, s.device].sum()) for s in stages]
    transfers = [problem.transfer_ms(a.hi - 1, a.device, b.device) for a, b in zip(stages, stages[1:])]
    latency = (float(cols.request_in_ms[stages[0].device]) + sum(compute) + sum(transfers)
               + float(cols.request_out_ms[stages[-1].device]))
    energy = 0.0
    for s, c in zip(stages, compute):
        busy, idle = device_mj(cols.busy_w[s.device], cols.idle_w[s.device], c, latency)
        energy += busy + idle
    for a, b in zip(stages, stages[1:]):
        energy += link_mj(problem.cut_bytes[a.hi - 1], cols.tx_nj[a.device], cols.rx_nj[b.device])
    return latency, float(energy)


def solve_energy(problem: PipelineProblem, cols: EnergyColumns, goal: EnergyGoal,
                 alike: np.ndarray | None = None) -> EnergySolution:
    """The placement of least energy under `goal` (exact; module docstring). Raises InfeasibleError when
    nothing fits memory or, with a hard SLA, when no placement meets it (the message gives the least
    latency of the placements that fit). With `alike` (per device, the lowest index of the devices
    interchangeable with it: pipeline_tables.py `device_classes` of the devices' problem), alike devices are
    taken in index order, which drops relabelled copies of plans (equal cost) from the search."""
    # the per-request costs are idle time, not compute: the columns carry them, the tables do not
    problem = replace(problem, request_in_ms=None, request_out_ms=None)
    dp = _EnergyDP(problem, column_tables(problem, cols), cols, goal, alike)
    best = dp.run()
    if best is None:
        if not memory_feasible(problem, None):
            raise InfeasibleError(infeasible_message(problem))
        raise InfeasibleError(f"no pipeline placement is predicted within the SLA of {goal.sla_ms:g} ms")
    return best


def column_tables(problem: PipelineProblem, cols: EnergyColumns) -> StageTables:
    """The stage and transfer tables of the columns' problem per class of alike columns (`column_classes`)."""
    return StageTables(problem, classes=column_classes(problem, cols.device), device=cols.device)


class _EnergyDP:
    """The label DP of the module docstring. States are (blocks done, column mask, last column): column
    masks, not device masks, so that P(m) is known; a device's other columns are excluded by its bit."""

    def __init__(self, problem: PipelineProblem, tab: StageTables, cols: EnergyColumns, goal: EnergyGoal,
                 alike: np.ndarray | None = None):
        self.p, self.tab, self.cols, self.goal = problem, tab, cols, goal
        self.B, self.K = tab.B, tab.D
        self.cq = tab.cq  # [column]: its class in the tables
        self.bit = [1 << int(d) for d in cols.device]
        # [column]: the devices alike to its device and before it, which a canonical plan has used already
        dev = [int(d) for d in cols.device]
        self.before = [0 if alike is None else sum(1 << e for e in range(d) if alike[e] == alike[d]) for d in dev]
        self.dyn = np.asarray(cols.busy_w, dtype=np.float64) - np.asarray(cols.idle_w, dtype=np.float64)
        # a cut's radio energy, link_mj(cut bytes, tx of the sender, rx of the receiver), priced per transition
        self.cut = np.asarray(problem.cut_bytes, dtype=np.float64)
        self.tx, self.rx = np.asarray(cols.tx_nj, dtype=np.float64), np.asarray(cols.rx_nj, dtype=np.float64)
        self.held = 0  # labels kept in states or pending, against LABEL_BUDGET
        self.rest = tab.lat_rest  # least compute of blocks j.. (each on its fastest column)
        self.least_out = float(np.min(cols.request_out_ms))
        self.best: EnergySolution | None = None
        self.best_obj = math.inf
        self.states: list[dict] = [dict() for _ in range(self.B + 1)]

    def objective(self, latency: float, energy: float) -> float:
        g = self.goal
        if g.soft:
            return energy + g.lam * max(0.0, latency - g.sla_ms)
        return energy if latency <= g.sla_ms else math.inf

    def _idle(self, mask: int) -> float:
        return float(sum(self.cols.idle_w[k] for k in range(self.K) if mask >> k & 1))

    def _devices(self, mask: int) -> int:
        return sum(self.bit[k] for k in range(self.K) if mask >> k & 1)

    def run(self) -> EnergySolution | None:
        self._seed()
        B, K = self.B, self.K
        pending: list[dict] = [dict() for _ in range(B + 1)]
        for b in range(K):
            if self.before[b] == 0:
                self._push(pending, 0, None, np.array([float(self.cols.request_in_ms[b])]), np.zeros(1), b, 0)
        labels = 0
        for h in range(1, B + 1):
            for key, parts in pending[h].items():
                L = np.concatenate([x[0] for x in parts])
                E = np.concatenate([x[1] for x in parts])
                back = [bk for x in parts for bk in x[2]]
                keep = _pareto(L, E)
                labels += L.size
                self.held += len(keep) - L.size
                self.states[h][key] = (L[keep], E[keep], [back[i] for i in keep])
            pending[h] = {}
            if h == B:
                break
            T, cq, cut = self.tab.T[h - 1], self.cq, self.cut[h - 1]
            for (mask, a), (L, E, _) in self.states[h].items():
                used = self._devices(mask)
                for b in range(K):
                    t = float(T[cq[a], cq[b]])  # a != b: a column is used once
                    if used & self.bit[b] or used & self.before[b] != self.before[b] or not math.isfinite(t):
                        continue
                    radio = float(link_mj(cut, self.tx[a], self.rx[b]))
                    self._push(pending, h, (h, mask, a), L + t, E + radio, b, mask)
        count_work("labels", labels)
        self._finish()
        return self.best

    def _seed(self) -> None:
        """The best single-column placement bounds the search from the start."""
        for k in range(self.K):
            if math.isfinite(self.tab.C[0, self.B, self.cq[k]]):
                stages = (StageChoice(0, self.B, k),)
                lat, energy = energy_of(self.p, self.cols, stages)
                obj = self.objective(lat, energy)
                if obj < self.best_obj:
                    self.best_obj, self.best = obj, EnergySolution(stages, lat, energy, obj)

    def _push(self, pending, j: int, src, L: np.ndarray, E: np.ndarray, b: int, mask: int) -> None:
        """Labels (L, E0) of state `src` (at block j) extended by a stage [j, h) on column b, for every h."""
        nmask = mask | (1 << b)
        idle = self._idle(nmask)
        C = self.tab.C[j, j + 1:, self.cq[b]]  # [h - j - 1]
        for off in np.flatnonzero(np.isfinite(C)):
            h = j + 1 + int(off)
            c = float(C[off])
            L2, E2 = L + c, E + c * self.dyn[b]
            idx = np.flatnonzero(self._hopeful(L2, E2, idle, h))
            if idx.size:
                self._hold(idx.size, j)
                pending[h].setdefault((nmask, b), []).append((L2[idx], E2[idx], [(src, int(i), j) for i in idx]))

    def _hold(self, n: int, j: int) -> None:
        """Count n more labels held; over LABEL_BUDGET, refuse in one line (module docstring: Peak memory)."""
        self.held += n
        if self.held > LABEL_BUDGET:
            states = sum(len(x) for x in self.states)
            raise LabelBudgetExceeded(
                f"the energy DP would hold more than {LABEL_BUDGET:,} labels ({states:,} states of column masks over "
                f"{self.K} columns (devices x power modes) by block {j} of {self.B}); its state grows with the "
                f"distinct devices and modes: use fewer, or another objective")

    def _hopeful(self, L: np.ndarray, E: np.ndarray, idle: float, h: int) -> np.ndarray:
        """Labels that may still lead to a plan better than the best so far (and, hard, meet the SLA):
        the blocks left take at least `rest[h]`, the last device's output at least `least_out`, and
        E0 and P(m) only grow."""
        g = self.goal
        least = L + self.rest[h] + self.least_out
        lower = E + idle * least
        if g.soft:
            return lower + g.lam * np.maximum(0.0, least - g.sla_ms) < self.best_obj
        return (lower < self.best_obj) & (least <= g.sla_ms)

    def _finish(self) -> None:
        final = None
        for (mask, a), (L, E, _) in self.states[self.B].items():
            idle = self._idle(mask)
            lat = L + float(self.cols.request_out_ms[a])
            for i in range(lat.size):
                energy = float(E[i] + idle * lat[i])
                obj = self.objective(float(lat[i]), energy)
                if obj < self.best_obj:
                    self.best_obj, final = obj, ((self.B, mask, a), i, float(lat[i]), energy)
        if final is not None:
            key, i, lat, energy = final
            self.best = EnergySolution(self._stages(key, i), lat, energy, self.best_obj)

    def _stages(self, key, i: int) -> tuple[StageChoice, ...]:
        out = []
        while key is not None:
            h, _, b = key
            src, i, lo = self.states[h][key[1:]][2][i]
            out.append(StageChoice(lo, h, b))
            key = src
        return tuple(out[::-1])


def _pareto(L: np.ndarray, E: np.ndarray) -> list[int]:
    """Indices of the labels that no other label matches or beats in both L and E (of equal labels,
    the first)."""
    order = np.lexsort((E, L))
    keep, best_e = [], math.inf
    for i in order.tolist():
        if E[i] < best_e:
            keep.append(i)
            best_e = float(E[i])
    return keep


def energy_frontier(graph: LayerGraph, cost: CostTable, goal: EnergyGoal) -> list[Plan]:
    """The pipeline placements (each device in one of its power modes) of the energy DP's frontier:
    none beaten in both latency and energy by another, and, under a hard SLA, each within it. Empty
    when no placement fits or meets the SLA; InfeasibleError when a device has no power figures."""
    base = pipeline_problem(graph, cost)
    columns = _columns(cost)
    cols = device_columns(cost, columns)
    problem = replace(_column_problem(base, cost, graph, columns), request_in_ms=None, request_out_ms=None)
    dp = _FrontierDP(problem, column_tables(problem, cols), cols, goal)
    dp.run()
    labels = dp.final_labels()
    if not labels:
        return []
    lat = np.array([x[0] for x in labels])
    energy = np.array([x[1] for x in labels])
    blocks = graph.pipeline_blocks
    plans = []
    for i in _pareto(lat, energy):
        choices = dp._stages(labels[i][2], labels[i][3])
        stages = tuple(Stage(cost.devices[columns[s.device].device], blocks[s.lo][0], blocks[s.hi - 1][1])
                       for s in choices)
        modes = tuple((cost.devices[columns[s.device].device], columns[s.device].mode) for s in choices
                      if columns[s.device].cost is not cost)
        plan = Plan("pipeline", "energy", stages, modes)
        plans.append(plan.ensures(graph))
    return plans


class _FrontierDP(_EnergyDP):
    """The energy DP with only the hard SLA pruning its labels: the bound on the best plan so far would
    drop labels that lose on energy but win on latency, which the frontier wants. Each state's (L, E0)
    Pareto set is exact for the final (latency, energy) of that state (pipeline_energy.py docstring), so
    the final labels of all states hold the whole frontier."""

    def _hopeful(self, L: np.ndarray, E: np.ndarray, idle: float, h: int) -> np.ndarray:
        if self.goal.soft:
            return np.ones(L.shape, dtype=bool)
        return L + self.rest[h] + self.least_out <= self.goal.sla_ms

    def _finish(self) -> None:
        """Nothing to choose: final_labels() reads every state."""

    def final_labels(self) -> list[tuple[float, float, tuple, int]]:
        """(latency, energy, DP key, label index) of every complete placement kept (within a hard SLA)."""
        out = []
        for (mask, a), (L, E, _) in self.states[self.B].items():
            idle = self._idle(mask)
            lat = L + float(self.cols.request_out_ms[a])
            for i in range(lat.size):
                latency = float(lat[i])
                if self.goal.soft or latency <= self.goal.sla_ms:
                    out.append((latency, float(E[i] + idle * latency), (self.B, mask, a), i))
        return out
