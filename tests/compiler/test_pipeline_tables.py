"""pipeline_tables.py: the DPs' stage and transfer tables are per class of interchangeable devices, never per
device (issue 42, item 7), and hold, for every device and every pair of distinct devices, the very numbers
`PipelineProblem` prices them at (bit for bit); the routed runs of a problem with riders (pipeline_routed.py),
whose first device leaves its class, find the plans brute force finds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgec.compiler.plan.pipeline_dp import solve_pipeline
from edgec.compiler.plan.pipeline_problem import PIPELINE_OBJECTIVES
from edgec.compiler.plan.pipeline_riders import Riders
from edgec.compiler.plan.pipeline_tables import StageTables, device_classes
from edgec.compiler.plan.planner import InfeasibleError
from pipeline_reference import brute_force
from test_memory_bounds import fleet
from test_pipeline_dp import problems

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(problems(dyadic=False, max_blocks=9, max_devices=5), st.booleans())
def test_class_tables_hold_every_devices_figures(problem, requests):
    """C[lo, hi, cq[d]] is stage_ms(lo, hi, d) where the stage fits d (inf where not), and T[c, cq[a], cq[b]] is
    transfer_ms(c, a, b) for every a != b with a link (inf without one): the sums bit for bit."""
    B, D = problem.n_blocks, problem.n_devices
    if requests:  # per-request costs alike within a kind (they follow the block_ms column here)
        col = np.asarray(problem.block_ms).sum(axis=0)
        problem = replace(problem, request_in_ms=col / 7.0, request_out_ms=col / 3.0)
    tab = StageTables(problem)
    assert tab.C.shape == (B + 1, B + 1, tab.Q) and tab.T.shape == (B - 1, tab.Q, tab.Q)
    assert tab.Q == np.unique(device_classes(problem)).size and np.array_equal(tab.rep[tab.cq], tab.cls)
    for d in range(D):
        q = tab.cq[d]
        for lo in range(B):
            for hi in range(lo + 1, B + 1):
                fits = problem.stage_memory(lo, hi) <= problem.device_mem_bytes[d]
                want = problem.stage_ms(lo, hi, d) if fits else np.inf
                assert tab.C[lo, hi, q] == want and tab.mem_ok[lo, hi, q] == fits, (lo, hi, d)
    bw = np.asarray(problem.bandwidth_bytes_per_ms)
    for a in range(D):
        for b in range(D):
            for c in range(B - 1):
                if a != b:
                    want = problem.transfer_ms(c, a, b) if bw[a, b] > 0 else np.inf
                    assert tab.T[c, tab.cq[a], tab.cq[b]] == want, (c, a, b)
    for q in range(tab.Q):  # a class of one device has no link to another of its class
        if np.count_nonzero(tab.cq == q) == 1:
            assert np.all(np.isinf(tab.T[:, q, q]))


def test_tables_take_the_classes_bytes_not_the_devices():
    """256 devices of 8 kinds, 24 blocks: the tables are (B+1)^2 x 8 stage entries and B x 8^2 transfers, the
    same bytes as on 8 devices of those kinds, whatever the device count; per device they were 25x to 1000x that."""
    B = 24
    small = StageTables(fleet(np.arange(8), B))
    for D in (64, 256):
        tab = StageTables(fleet(np.arange(D) % 8, B))
        held = sum(x.nbytes for x in (tab.C, tab.mem_ok, tab.T))
        assert tab.Q == 8 and held == sum(x.nbytes for x in (small.C, small.mem_ok, small.T))
        bound = (B + 1) ** 2 * 8 * (8 + 1) + B * 8 * 8 * 8  # float C, bool mem_ok, float T (Cmax is C)
        assert held <= bound, f"{held} bytes of tables on {D} devices of 8 kinds"
        assert tab.Cmax is tab.C


@st.composite
def rider_problems(draw):
    """A small switched problem (devices of a few kinds) with riders: tensors a block computes and later blocks
    read, each crossing the cuts between, beside one chain tensor per cut."""
    problem = draw(problems(dyadic=True, max_blocks=6, max_devices=4))
    B = problem.n_blocks
    if B < 3:
        B = 3
        problem = replace(problem, block_ms=np.resize(problem.block_ms, (3, problem.n_devices)),
                          block_param_bytes=np.resize(problem.block_param_bytes, 3),
                          block_peak_act_bytes=np.resize(problem.block_peak_act_bytes, 3),
                          cut_bytes=np.resize(problem.cut_bytes, 2) if problem.cut_bytes.size else np.full(2, 64))
    R = draw(st.integers(1, 3))
    made = [draw(st.integers(0, B - 2)) for _ in range(R)]
    nbytes = [draw(st.integers(1, 4)) * 32 for _ in range(R)]
    reads = np.zeros((R, B), dtype=bool)
    for r in range(R):
        later = draw(st.lists(st.integers(made[r] + 1, B - 1), min_size=1, max_size=3))
        reads[r, later] = True
    chain = [int(x) for x in problem.cut_bytes]
    items = []
    for c in range(B - 1):
        crossing = [(nbytes[r], r) for r in range(R) if made[r] <= c and reads[r, c + 1:].any()]
        items.append(((chain[c], -1), *crossing))
    items = tuple(items)
    riders = Riders(made=tuple(made), nbytes=tuple(nbytes), reads=reads, items=items)
    sizes = tuple(tuple(nb for nb, _ in cut) for cut in items)
    return replace(problem, medium="switched", riders=riders, cut_tensor_bytes=sizes,
                   cut_bytes=np.array([sum(s) for s in sizes], dtype=np.float64))


@SETTINGS
@given(rider_problems())
def test_routed_runs_find_what_brute_force_finds(problem):
    """Each routed run takes its first device out of its class (pipeline_routed.py): its tables, per class
    of the run, price the plans as `evaluate` prices their best routing of the riders."""
    for objective in PIPELINE_OBJECTIVES:
        # brute force's plans priced at their best routing for this objective (it prices them for latency)
        ref = sorted(problem.evaluate(s.stages, objective).key(objective) for s in brute_force(problem, objective))
        if not ref:
            with pytest.raises(InfeasibleError):
                solve_pipeline(problem, objective)
            continue
        top = solve_pipeline(problem, objective, top_k=3)
        assert [s.key(objective) for s in top] == ref[:3]
