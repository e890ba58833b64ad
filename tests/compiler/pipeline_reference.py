"""The pipeline planners' reference: brute-force enumeration (shared by the DP and baseline tests)."""

from __future__ import annotations

import itertools

from edgec.compiler.plan.pipeline import solution_sort_key
from edgec.compiler.plan.pipeline import PipelineProblem, PipelineSolution, StageChoice


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
