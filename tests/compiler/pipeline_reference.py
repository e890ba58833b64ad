"""The pipeline planners' reference: brute-force enumeration (shared by the DP and baseline tests)."""

from __future__ import annotations

import itertools

from edgec.compiler.plan.pipeline_problem import solution_sort_key
from edgec.compiler.plan.pipeline_problem import PipelineProblem, PipelineSolution, StageChoice


def brute_force(problem: PipelineProblem, objective: str, max_stages: int | None = None) -> list[PipelineSolution]:
    """Every split into contiguous stages x every injective device assignment that fits, sorted."""
    B, D = problem.n_blocks, problem.n_devices
    out = []
    for s in range(1, min(B, D, max_stages or D) + 1):
        for cuts in itertools.combinations(range(1, B), s - 1):
            bounds = (0, *cuts, B)
            for devs in itertools.permutations(range(D), s):
                stages = tuple(StageChoice(bounds[i], bounds[i + 1], devs[i]) for i in range(s))
                if problem.fits(stages):
                    out.append(problem.evaluate(stages))
    return sorted(out, key=lambda sol: solution_sort_key(sol, objective))


def brute_force_layers(graph, cost, objective: str, cuts: tuple[int, ...]) -> list[tuple[tuple, tuple]]:
    """Every split of the layers at `cuts` x every injective device assignment that fits, priced from the
    layer graph and the cost table alone, as (key, ((lo, hi, device name), ...)), best first.

    Independent of the planner's PipelineProblem: each activation is one message per stage boundary it
    crosses (forwarded stage to stage from its producer's stage to its last consumer's), priced with
    `cost.transfer_ms`; key = (latency, bottleneck) or (bottleneck, latency) as in `PipelineSolution.key`.
    """
    n, names = len(graph.layers), cost.devices
    spans = [(graph.producer[t], max(users), graph.tensors[t].nbytes)
             for t, users in graph.consumers.items() if t in graph.producer]
    out = []
    for s in range(1, min(len(cuts) + 1, len(names)) + 1):
        for chosen in itertools.combinations(cuts, s - 1):
            bounds = (0, *chosen, n)
            for devs in itertools.permutations(range(len(names)), s):
                stages = [(bounds[i], bounds[i + 1], devs[i]) for i in range(s)]
                if all(_stage_memory(graph, lo, hi) <= cost.cluster.devices[d].usable_bytes for lo, hi, d in stages):
                    out.append((_key(graph, cost, objective, stages, spans), tuple((lo, hi, names[d]) for lo, hi, d in stages)))
    return sorted(out)


def _stage_memory(graph, lo: int, hi: int) -> int:
    return sum(graph.layers[i].param_bytes for i in range(lo, hi)) + max(graph.footprint_bytes[lo:hi])


def _key(graph, cost, objective, stages, spans) -> tuple[float, float]:
    names = cost.devices
    compute = [float(cost.layer_ms[lo:hi, d].sum()) for lo, hi, d in stages]
    # the runtime's per-request cost: the first stage's device takes the input, the last's gives the output
    compute[0] += cost.cluster.devices[stages[0][2]].runtime.request_ms / 2.0
    compute[-1] += cost.cluster.devices[stages[-1][2]].runtime.request_ms / 2.0
    transfers = []
    for (_, c, a), (_, _, b) in zip(stages, stages[1:]):
        transfers.append(sum(cost.transfer_ms(nb, names[a], names[b]) for p, last, nb in spans if p < c <= last))
    link = (sum(transfers) if cost.cluster.medium == "shared" else max(transfers)) if transfers else 0.0
    latency, bottleneck = sum(compute) + sum(transfers), max(max(compute), link)
    return (latency, bottleneck) if objective == "latency" else (bottleneck, latency)


def brute_force_energy(problem: PipelineProblem, cols, goal) -> list[tuple[float, float, float, tuple]]:
    """Every split into contiguous stages x every assignment of columns (device, mode) with at most one
    column per device, that fits memory, as (objective, latency, energy, stages), best first; priced
    independently of the DP: per used device busy power over its compute and idle power over the rest of
    the span (the latency, with the per-request costs), per cut its bytes x (sender tx + receiver rx)."""
    B, K = problem.n_blocks, problem.n_devices
    out = []
    for s in range(1, min(B, K) + 1):
        for cuts in itertools.combinations(range(1, B), s - 1):
            bounds = (0, *cuts, B)
            for cols_ in itertools.permutations(range(K), s):
                if len({int(cols.device[k]) for k in cols_}) < s:
                    continue
                stages = tuple(StageChoice(bounds[i], bounds[i + 1], cols_[i]) for i in range(s))
                if not problem.fits(stages) or not all(
                        problem.bandwidth_bytes_per_ms[a.device, b.device] > 0 for a, b in zip(stages, stages[1:])):
                    continue
                compute = [float(problem.block_ms[st.lo:st.hi, st.device].sum()) for st in stages]
                transfers = [problem.transfer_ms(a.hi - 1, a.device, b.device) for a, b in zip(stages, stages[1:])]
                span = (cols.request_in_ms[stages[0].device] + sum(compute) + sum(transfers)
                        + cols.request_out_ms[stages[-1].device])
                energy = sum(cols.busy_w[st.device] * c + cols.idle_w[st.device] * (span - c)
                             for st, c in zip(stages, compute))
                energy += sum(problem.cut_bytes[a.hi - 1] * (cols.tx_nj[a.device] + cols.rx_nj[b.device]) / 1e6
                              for a, b in zip(stages, stages[1:]))
                out.append((goal.score(span, energy), span, energy, stages))
    return sorted(out, key=lambda x: x[:3])
