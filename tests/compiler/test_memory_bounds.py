"""Planners' memory grows with device classes, not with the device count alone (issue 42, item 7): the
neurosurgeon baseline prices the first two devices of each class only, with the plan and the work count of
pricing every device, and its traced peak on a fleet of few kinds stays far under the O(B D^2) it once took;
the exact pipeline DP's peak is its tables per class, not per device (docs/explanation/fleet-scale.md: Memory).
"""

from __future__ import annotations

import tracemalloc
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgec.compiler.plan.baselines import solve_neurosurgeon
from edgec.compiler.plan.pipeline_dp import solve_pipeline
from edgec.compiler.plan.pipeline_problem import PIPELINE_OBJECTIVES, PipelineProblem, StageChoice
from edgec.compiler.plan.planner import InfeasibleError
from edgec.compiler.plan.stats import recording

MB = 1_000_000


def fleet(kinds: np.ndarray, B: int, seed: int = 0, medium: str = "switched") -> PipelineProblem:
    """A problem whose devices are `kinds[d]` (alike within a kind: same columns, memory and links by kind)."""
    rng = np.random.default_rng(seed)
    Q = int(kinds.max()) + 1
    ms = rng.integers(0, 8, (B, Q)) / 4.0
    mem = rng.integers(2, 50, Q) * MB
    bw = 2.0 ** rng.integers(3, 8, (Q, Q))
    lat = rng.integers(0, 3, (Q, Q)) / 8.0
    return PipelineProblem(
        devices=tuple(f"d{i}" for i in range(kinds.size)), block_ms=ms[:, kinds],
        block_param_bytes=rng.integers(0, 8, B) * MB, block_peak_act_bytes=rng.integers(0, 4, B) * MB,
        cut_bytes=rng.integers(0, 6, B - 1) * 32.0, device_mem_bytes=mem[kinds],
        bandwidth_bytes_per_ms=np.minimum(bw, bw.T)[np.ix_(kinds, kinds)],
        link_latency_ms=np.maximum(lat, lat.T)[np.ix_(kinds, kinds)], medium=medium)


def every_device(problem: PipelineProblem, objective: str):
    """The neurosurgeon baseline by its definition, on every device: every single-device plan and every split
    between two distinct devices that fits memory and has a link, priced by `evaluate`; the least by (key,
    stages), and how many there are."""
    B, D = problem.n_blocks, problem.n_devices
    plans = [(StageChoice(0, B, d),) for d in range(D)]
    plans += [(StageChoice(0, c, a), StageChoice(c, B, b)) for c in range(1, B) for a in range(D) for b in range(D)
              if a != b]
    scored = [(problem.evaluate(p).key(objective), tuple((s.lo, s.hi, s.device) for s in p)) for p in plans
              if problem.fits(p)]
    scored = [x for x in scored if np.isfinite(x[0][0])]
    return (min(scored)[1] if scored else None), len(scored)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 3), min_size=1, max_size=7), st.integers(1, 7), st.integers(0, 2**16),
       st.sampled_from(["switched", "shared"]))
def test_neurosurgeon_on_classes_equals_every_device(kinds, B, seed, medium):
    kinds = np.unique(np.array(kinds), return_inverse=True)[1]  # kinds 0..Q-1, as the fleet builds them
    problem = fleet(kinds, B, seed, medium)
    for objective in PIPELINE_OBJECTIVES:
        want, n = every_device(problem, objective)
        with recording() as rec:
            try:
                (sol,) = solve_neurosurgeon(problem, objective)
            except InfeasibleError:
                assert want is None
                continue
        assert tuple((s.lo, s.hi, s.device) for s in sol.stages) == want
        assert rec["work"]["plans"] == n


def test_neurosurgeon_memory_follows_classes_not_devices():
    """256 devices of 4 kinds, 24 blocks: pricing every ordered pair at every cut held several [B, D, D]
    arrays and a Python tuple per candidate (tens of MB); on the classes' first two devices the tables are
    [B, 8, 8], and what remains of the device count is the problem's own [D, D] link matrices."""
    kinds = np.arange(256) % 4
    problem = fleet(kinds, 24)
    problem = replace(problem, device_mem_bytes=problem.device_mem_bytes * 4)  # splits fit
    D, B = kinds.size, 24
    tracemalloc.start()
    try:
        (sol,) = solve_neurosurgeon(problem, "latency")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_bdd = B * D * D * 8  # a single float64 [B, D, D] table: 12.6 MB
    assert peak < one_bdd / 4, f"neurosurgeon peaked at {peak / MB:.1f} MB on {D} devices of 4 kinds"
    assert sol.stages[0].device < 8  # a class's first devices


def test_neurosurgeon_candidates_are_arrays_not_objects():
    """64 all-distinct devices (64 classes), 35 blocks: the B x 64 x 64 candidates are a few arrays of that
    size (about 10 floats each at the peak), not a Python tuple each (over 50)."""
    kinds = np.arange(64)
    problem = fleet(kinds, 35)
    problem = replace(problem, device_mem_bytes=problem.device_mem_bytes * 4)
    tracemalloc.start()
    try:
        solve_neurosurgeon(problem, "latency")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    per_candidate = peak / (35 * 64 * 64)
    assert per_candidate < 16 * 8, f"{per_candidate:.0f} bytes per candidate"


def test_pipeline_dp_holds_its_tables_not_its_device_subsets():
    """256 devices of 4 kinds, 24 blocks: the exact DP's peak is its tables per class (O(B^2 Q + B Q^2),
    pipeline_dp.py: Size) and its DP tables over counts per class, never subsets of 256 devices; what follows
    the device count is the class test's copies of the problem's [D, D] link matrices. Per device, its stage and
    transfer tables alone were 14 MB here."""
    kinds = np.arange(256) % 4
    B, D = 24, kinds.size
    problem = fleet(kinds, B)
    problem = replace(problem, device_mem_bytes=problem.device_mem_bytes * 4)
    for objective in PIPELINE_OBJECTIVES:
        tracemalloc.start()
        try:
            solve_pipeline(problem, objective, top_k=3, copies=False)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        links = 8 * D * D  # one [D, D] float64 matrix
        assert peak < 2 * MB + 4 * links, f"{objective}: {peak / MB:.1f} MB on {D} devices of 4 kinds"
