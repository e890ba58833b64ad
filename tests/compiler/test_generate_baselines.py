"""The baselines of generative builds as planners on the same cost table: ring-memory (exo: contiguous stages in
proportion to free memory, devices in cluster order) and equal-layers; on decoders and on ordinary models."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings

from edgec.compiler.api import compile as compile_api
from edgec.compiler.errors import UserError
from edgec.compiler.plan.baselines import nearest_boundaries, solve_ring_memory
from edgec.compiler.plan.pipeline_dp import solve_pipeline
from edgec.compiler.plan.pipeline_problem import PipelineProblem
from edgec.compiler.plan.planner import InfeasibleError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_baselines import problems  # noqa: E402
from tests.matrix import quick_only
from edgec import models

ROOT = Path(__file__).resolve().parents[2]
TINYLM = models.ensure("tinylm")  # built if missing, as every zoo model
MB = 1_000_000


def _problem(params_mb: list[int], mem_mb: list[int]) -> PipelineProblem:
    B, D = len(params_mb), len(mem_mb)
    return PipelineProblem(
        devices=tuple(f"d{i}" for i in range(D)), block_ms=np.ones((B, D)),
        block_param_bytes=np.array(params_mb) * MB, block_peak_act_bytes=np.zeros(B, dtype=np.int64),
        cut_bytes=np.full(B - 1, 100.0), device_mem_bytes=np.array(mem_mb) * MB,
        bandwidth_bytes_per_ms=np.full((D, D), 1000.0), link_latency_ms=np.zeros((D, D)))


def test_ring_memory_gives_each_device_its_share_of_memory_in_cluster_order():
    # 8 equal blocks; free memory 1:3 -> 2 and 6 blocks; 3:1 -> 6 and 2
    for mem, want in (([100, 300], [(0, 2, 0), (2, 8, 1)]), ([300, 100], [(0, 6, 0), (6, 8, 1)])):
        sol = solve_ring_memory(_problem([10] * 8, mem))[0]
        assert [(s.lo, s.hi, s.device) for s in sol.stages] == want


def test_ring_memory_refuses_a_stage_that_does_not_fit():
    with pytest.raises(InfeasibleError, match="ring-memory over 2 devices does not fit: stage 1"):
        solve_ring_memory(_problem([10, 10, 10, 60], [100, 50]))


def test_nearest_boundaries_keep_a_block_per_stage():
    assert nearest_boundaries(np.array([1.0, 1, 1, 100]), [1.0, 2.0, 3.0]) == [0, 1, 2, 3, 4]
    assert nearest_boundaries(np.array([5.0, 1, 1, 1]), [4.0]) == [0, 1, 4]


@settings(max_examples=60, deadline=None)
@given(problems())
def test_ring_memory_is_never_better_than_the_dp(problem):
    try:
        ring = solve_ring_memory(problem, "throughput")[0]
    except InfeasibleError:
        return
    best = solve_pipeline(problem, "throughput", top_k=1)[0]
    assert best.bottleneck_ms <= ring.bottleneck_ms + 1e-9


def _cluster(tmp_path: Path, kinds, memory=None) -> Path:
    devices = [{"name": f"{k}-{i}", "profile": k, **({"memory_mb": memory[i]} if memory else {})}
               for i, k in enumerate(kinds)]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"devices": devices,
                                    "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}}))
    return path


HETERO = ["rpi5", "rpi5", "rpi4", "rpi4", "phone"]  # bench_generate's heterogeneous cluster


@pytest.mark.parametrize("kinds, context", [(["rpi5", "rpi4", "rpi5", "rpi4"], (256, 16)), (HETERO, (512, 64))])
@pytest.mark.parametrize("objective", quick_only(["latency", "throughput"], {"throughput"}))
def test_baselines_of_a_generative_build_are_priced_like_the_dp_and_never_beat_it(tmp_path, objective, kinds, context):
    """On bench_generate's cluster at 100 Mbps and 1 ms a message, equal-layers sends the riders (rotary tables,
    mask) from its first stage straight to each stage that reads them: the DP, which priced them forwarded
    stage to stage (3 messages more per link), once chose a plan of 237 tokens/s beside its 319."""
    cluster = _cluster(tmp_path, kinds)
    out = {}
    for strategy in ("pipeline", "ring-memory", "equal-layers"):
        out[strategy] = compile_api(TINYLM, cluster, tmp_path / strategy, strategy=strategy, objective=objective,
                                    generate=True, max_context=context[0], prompt_len=context[1])
    assert [s["device"] for s in out["equal-layers"]["stages"]] == [f"{k}-{i}" for i, k in enumerate(kinds)]
    # the decoder's 4 layers, one per device: each stage holds one layer's caches
    layers = [st["layers"][1] - st["layers"][0] for st in out["equal-layers"]["stages"]]
    assert max(layers) - min(layers) <= 50
    key = "predicted_tpot_ms" if objective == "latency" else "predicted_tokens_per_s"
    sign = 1 if objective == "latency" else -1
    for strategy in ("ring-memory", "equal-layers"):
        assert sign * out["pipeline"][key] <= sign * out[strategy][key] + 1e-9
        assert out[strategy]["strategy"] == strategy and out[strategy]["predicted_ttft_ms"] > 0


def test_ring_memory_follows_free_memory_on_a_decoder(tmp_path):
    """The device with four times the free memory takes most of the layers."""
    summary = compile_api(TINYLM, _cluster(tmp_path, ["rpi5", "rpi5"], memory=[400, 1200]), tmp_path / "out",
                          strategy="ring-memory", generate=True, max_context=256, prompt_len=16)
    first, second = (st["layers"][1] - st["layers"][0] for st in summary["stages"])
    assert second > 2 * first


def test_the_baselines_plan_ordinary_models_too(tmp_path):
    model = models.ensure("tinychain")
    cluster = _cluster(tmp_path, ["rpi5", "rpi4"])
    for strategy in ("ring-memory", "equal-layers"):
        summary = compile_api(model, cluster, tmp_path / strategy, strategy=strategy)
        assert summary["strategy"] == strategy and len(summary["stages"]) == 2
        assert "predicted_tokens_per_s" not in summary
    auto = compile_api(model, cluster, tmp_path / "auto")
    assert not {c["strategy"] for c in auto["candidates"]} & {"ring-memory", "equal-layers"}


def test_a_baseline_that_does_not_fit_is_one_line(tmp_path):
    """ResNet-50's second half holds most of its 102 MB of weights: too much for a device with 70 MB usable,
    where the pipeline planner puts the whole model on the other device."""
    model = models.ensure("resnet50")
    cluster = _cluster(tmp_path, ["rpi5", "rpi5"], memory=[1000, 200])
    with pytest.raises(UserError, match="equal-layers over 2 devices does not fit: stage 1"):
        compile_api(model, cluster, tmp_path / "out", strategy="equal-layers")
    assert not (tmp_path / "out").exists()
    assert compile_api(model, cluster, tmp_path / "ok", strategy="pipeline")["strategy"] == "pipeline"
