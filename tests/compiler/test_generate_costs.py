"""What a generative step costs the runtime beyond its compute: its hand-offs with the coordinator (the token's
inputs in at the first stage, the token id out at the last, never the caches, never the logits), and how they
bound a device profiled under a CPU quota (compiler/cost/cpu_bounds.py request_costs, quota_periods).

Hand-made profiles with the runtime's costs, so every expected number is worked out here; and one measured
under a CPU quota on a busy machine, the case where the caches counted as hand-offs dominated the prediction."""

from __future__ import annotations

import pytest
import yaml

from edgec import models
from edgec.compiler.api import compile as compile_api
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import TOKEN_BYTES, evaluate
from edgec.compiler.cost.cpu_bounds import request_costs
from edgec.compiler.driver import _price
from edgec.compiler.ingest.phases import GenerateOptions, load_phases
from edgec.compiler.plan.choose import plan_model

TINYLM = models.ensure("tinylm")  # built if missing, as every zoo model
QUOTA = 0.35
# message_ms, message_ms_per_mb, request_ms: round figures, so that each expected number is easy to follow
RUNTIME = {"message_ms": 0.4, "message_ms_per_mb": 2.0, "request_ms": 1.0}
FIG = {"op_overhead_us": 10.0, "gflops": {"conv": 2.0, "depthwise_conv": 1.0, "gemm": 2.0, "other": 1.0},
       "memory_gbps": 10.0}
# `edgec profile --threads 1 --quick` inside a 0.25-core testbed host (tests/bench/fidelity_hetero_cluster.py
# profile_in_host) while other jobs kept the machine busy (its figures, 2026-11-29): its request_ms (2.22 ms) is
# time, stretched by the quota and the load.
MEASURED = {"op_overhead_us": 3.3, "gflops": {"conv": 49.8, "depthwise_conv": 22.5, "gemm": 48.9, "other": 16.9},
            "memory_gbps": 6.48, "weight_gbps": 6.65, "gemm_weight_gbps": 4.9,
            "runtime": {"message_ms": 0.176, "message_ms_per_mb": 9.16, "request_ms": 2.22, "run_ms": 0.178,
                        "request_cpu_ms": 0.484, "message_cpu_ms_per_mb": 1.65}}


def _cluster(tmp_path, figures: dict, quota: float | None, n: int = 4):
    prof = {"name": "q", "memory_mb": 4096, "usable_memory_fraction": 0.75, "runtime_overhead_mb": 50, **figures,
            **({"cpu_quota": {"cores": quota, "period_us": 5000, "source": "cgroup v1"}} if quota else {})}
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(prof))
    doc = {"devices": [{"name": f"d{i}", "profile": "q.yaml", "threads": 1} for i in range(n)],
           "network": {"bandwidth_mbps": 1000, "latency_ms": 0}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path / "c.yaml"


def _four_stages(tmp_path, figures=None, quota=QUOTA, max_context=48, prompt_len=16):
    phases = load_phases(TINYLM, GenerateOptions(max_context=max_context, prompt_len=prompt_len))
    cost = _price(phases.decode, phases, load_cluster(_cluster(tmp_path, figures or {**FIG, "runtime": RUNTIME},
                                                               quota)))
    chosen, _ = plan_model(phases.decode.graph, cost, "equal-layers", "throughput")
    assert [s.device for s in chosen.plan.stages] == ["d0", "d1", "d2", "d3"]
    return phases, cost, chosen.plan


def test_a_step_hands_the_coordinator_its_token_inputs_and_takes_the_token_id_only(tmp_path):
    """Every stage reads its layers' caches and writes them, which are model inputs and outputs of the step's
    graph; none of them leaves its device, and of the logits only the token id does. So the first stage takes
    the step's inputs and the last gives the token, and no other stage has a hand-off at all."""
    phases, cost, plan = _four_stages(tmp_path)
    graph = phases.decode.graph
    # input_ids [1, 1] and position_ids [1, 1] int64, attention_mask [1, past + 1] int64 at the priced past 31
    step_in = 8 + 8 + (phases.priced_past + 1) * 8
    assert step_in == 272
    half = RUNTIME["request_ms"] / 2
    per_byte = RUNTIME["message_ms_per_mb"] / 1e6
    r_in, r_out = request_costs(plan, graph, cost)
    assert r_in == {0: pytest.approx(half + 272 * per_byte)}  # 0.500544 ms
    assert r_out == {3: pytest.approx(half + TOKEN_BYTES * per_byte)}  # 0.500016 ms, not the logits' 65536 bytes
    assert request_costs(plan, graph, cost, cpu=True) == (r_in, r_out)  # no CPU figures: the time figures stand in
    assert cost.network.io_bytes == (272, TOKEN_BYTES)  # what the pipeline DP charges the first and last stage
    # the prefill: the prompt's 16 ids, positions and mask in, the first token's id out
    gen = cost.generate
    assert request_costs(plan, gen.prefill_graph, gen.prefill) == (
        {0: pytest.approx(half + 3 * 16 * 8 * per_byte)}, {3: pytest.approx(half + TOKEN_BYTES * per_byte)})
    pred = evaluate(plan, graph, cost)
    assert pred.coordinator_ms == pytest.approx(1.00056)  # the two halves; not eight, with the caches' bytes


def test_a_quota_bounds_each_stage_by_its_compute_and_its_own_messages(tmp_path):
    """Under a 0.35-core quota a device's period is at least its compute (already at the quota's pace) plus, over
    the quota, half of each message with an end there and half of its hand-offs with the coordinator. Worked
    out message by message: a message of n bytes costs 0.4 + 2 n / 10^6 ms of the runtime's work, half each end."""
    phases, cost, plan = _four_stages(tmp_path)
    pred = evaluate(plan, phases.decode.graph, cost)
    work = {d: 0.0 for d in ("d0", "d1", "d2", "d3")}
    for tr in pred.transfers:
        for end in (tr.src, tr.dst):
            work[end] += (0.4 + 2 * tr.nbytes / 1e6) / 2
    work["d0"] += (0.5 + 272 * 2 / 1e6) / 2  # half the request's input hand-off on the device, half on the host
    work["d3"] += (0.5 + TOKEN_BYTES * 2 / 1e6) / 2
    token = pred.generation["token_ms"]  # the last stage's device is held until the token id is sent
    for d, w in work.items():
        bound = pred.busy_ms[d] + w / QUOTA
        assert pred.period_ms[d] == pytest.approx(max(pred.busy_ms[d], bound) + (token if d == "d3" else 0.0))
    # d1 and d2 take no model input and give no output: nothing of a request is theirs
    assert pred.period_ms["d1"] == pytest.approx(pred.busy_ms["d1"] + work["d1"] / QUOTA)
    assert pred.bottleneck_ms == pytest.approx(max(pred.period_ms.values()))


def test_a_measured_quota_profile_prices_the_step_not_the_caches(tmp_path):
    """Regression: on a profile measured under a 0.25-core quota on a busy machine, the 4-stage build was bound by
    the coordinator at 11.85 ms a token (84 tokens/s): every stage paid a request in and out, with its caches'
    bytes and the logits'. The coordinator does two hand-offs a step; the prefill's out is the token id too."""
    cluster = _cluster(tmp_path, MEASURED, 0.25)
    s = compile_api(TINYLM, cluster, tmp_path / "out", strategy="equal-layers", objective="throughput",
                    generate=True, max_context=48, prompt_len=16)
    assert len(s["stages"]) == 4
    phases, cost, plan = _four_stages(tmp_path, MEASURED, 0.25)
    pred = evaluate(plan, phases.decode.graph, cost)
    half, per_byte = 2.22 / 2, 9.16 / 1e6
    assert pred.coordinator_ms == pytest.approx(half + 272 * per_byte + half + TOKEN_BYTES * per_byte)  # 2.2226
    assert s["predicted_tokens_per_s"] == pytest.approx(pred.throughput_ips, rel=1e-4)
    assert s["predicted_tokens_per_s"] > 150  # 180.6: the last stage's compute and messages under its quota
    # TTFT: the prefill's logits (16 x 16384 float32, 1 MiB at 9.16 ms/MB: 9.6 ms) never leave the last stage
    prefill = evaluate(plan, phases.prefill.graph, cost.generate.prefill)
    assert prefill.coordinator_ms == pytest.approx(half + 3 * 16 * 8 * per_byte + half + TOKEN_BYTES * per_byte)
