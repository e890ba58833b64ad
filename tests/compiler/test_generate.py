"""compile --generate: cache pairs recognised (or refused in one line), phases pinned and priced, caches kept on
their stage and counted in memory at --max-context, the per-token figures, and the strategies that apply."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from edgec.compiler.api import compile as compile_api
from edgec.compiler.errors import UserError
from edgec.compiler.ingest.phases import GenerateOptions, load_phases, priced_past
from edgec.compiler.ingest.state import find_state
from tests.matrix import quick_only
from edgec import models

ROOT = Path(__file__).resolve().parents[2]
TINYLM = models.ensure("tinylm")  # built if missing, as every zoo model


def _lm(past: list[str], present: list[str], out_dims=None, out_type=TensorProto.FLOAT, extra=()) -> onnx.ModelProto:
    """A one-layer decoder-like graph: each cache input concatenated with the new tokens' projection along
    its past axis gives the cache output; logits from the embedding."""
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [16, 8], np.random.default_rng(0).random(128).astype(np.float32))
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8], np.random.default_rng(1).random(64).astype(np.float32))
    head = helper.make_tensor("head", TensorProto.FLOAT, [8, 16], np.random.default_rng(2).random(128).astype(np.float32))
    shape = helper.make_tensor("shape", TensorProto.INT64, [4], [1, -1, 2, 4])
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["x"]),
             helper.make_node("MatMul", ["x", "w"], ["kv"]),
             helper.make_node("Reshape", ["kv", "shape"], ["kv4"]),
             helper.make_node("Transpose", ["kv4"], ["new"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["x", "head"], ["logits"])]
    nodes += [helper.make_node("Concat", [a, "new"], [b], axis=2) for a, b in zip(past, present)]
    nodes += [helper.make_node("Identity", ["new"], [e]) for e in extra]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])]
    inputs += [helper.make_tensor_value_info(a, TensorProto.FLOAT, ["batch", 2, "past", 4]) for a in past]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 16])]
    outputs += [helper.make_tensor_value_info(b, out_type, out_dims or ["batch", 2, "total", 4]) for b in present]
    outputs += [helper.make_tensor_value_info(e, TensorProto.FLOAT, ["batch", 2, "seq", 4]) for e in extra]
    graph = helper.make_graph(nodes, "lm", inputs, outputs, [emb, w, head, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("past, present", [
    (["past_key_values.0.key", "past_key_values.0.value"], ["present.0.key", "present.0.value"]),
    (["past_key.0", "past_value.0"], ["present_key.0", "present_value.0"]),
    (["cache_k_0", "cache_v_0"], ["cache_k_out_0", "cache_v_out_0"]),
])
def test_cache_pairs_are_recognised_under_common_names(past, present):
    pairs = find_state(_lm(past, present), {}, "lm.onnx")
    assert [(p.input, p.output, p.axis, p.dtype) for p in pairs] == [(a, b, 2, "float32") for a, b in zip(past, present)]


def test_explicit_state_names_a_pair_the_names_do_not_tell():
    pairs = find_state(_lm(["mem_a"], ["mem_b"]), {"mem_a": "mem_b"}, "lm.onnx")
    assert [(p.input, p.output) for p in pairs] == [("mem_a", "mem_b")]
    with pytest.raises(UserError, match="no cache inputs found"):
        find_state(_lm(["mem_a"], ["mem_b"]), {}, "lm.onnx")
    with pytest.raises(UserError, match="'nope' is not an input"):
        find_state(_lm(["mem_a"], ["mem_b"]), {"nope": "mem_b"}, "lm.onnx")


@pytest.mark.parametrize("model, expected", [
    (_lm(["past_key.0", "past_value.0"], ["present_key.0", "present_valu.0"]),
     "input 'past_value.0' looks like a cache but no output match it"),
    (_lm(["past_key.0"], ["present_key.0"], extra=["present_key.1"]), "output 'present_key.1' looks like a cache but no input"),
    (_lm(["past_key.0"], ["present_key.0"], out_type=TensorProto.FLOAT16), "'past_key.0' -> 'present_key.0': dtypes differ"),
    (_lm(["past_key.0"], ["present_key.0"], out_dims=["batch", 3, "total", 4]), "dimension 1 differs (2 and 3)"),
    (_lm(["past_key.0"], ["present_key.0"], out_dims=["batch", 2, "total"]), "ranks differ"),
])
def test_a_cache_without_partner_or_a_pair_that_disagrees_is_one_line_exit_2(tmp_path, model, expected):
    path = tmp_path / "lm.onnx"
    onnx.save(model, path)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump({"devices": [{"name": "a", "profile": "rpi5"}]}))
    proc = subprocess.run([sys.executable, "-m", "edgec.compiler", "compile", str(path), "--devices", str(cluster),
                           "-o", str(tmp_path / "out"), "--generate", "--max-context", "16", "--prompt-len", "4"],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"edgec: {path}: ") and expected in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_the_small_model_compiles_and_its_state_stays_on_one_stage(tmp_path):
    path = tmp_path / "lm.onnx"
    onnx.save(_lm(["cache_k_0"], ["cache_k_out_0"]), path)
    summary = compile_api(path, _cluster(tmp_path, 2), tmp_path / "out", generate=True, max_context=16, prompt_len=4)
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    holders = [f["id"] for f in manifest["fragments"] if f.get("state")]
    assert len(holders) == 1 and manifest["version"] == 2
    assert summary["generate"]["priced_past"] == (4 + 16 - 1) // 2


def _cluster(tmp_path: Path, n: int, memory_mb: float | None = None, profiles=("rpi5",)) -> Path:
    devices = [{"name": f"d{i}", "profile": profiles[i % len(profiles)],
                **({"memory_mb": memory_mb} if memory_mb else {})} for i in range(n)]
    path = tmp_path / f"c{n}.yaml"
    path.write_text(yaml.safe_dump({"devices": devices,
                                    "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}}))
    return path


def test_phases_pin_prefill_and_decode_and_agree_on_layers():
    opts = GenerateOptions(max_context=128, prompt_len=16)
    phases = load_phases(TINYLM, opts)
    assert priced_past(opts) == phases.priced_past == 71
    dec, pre = phases.decode.graph, phases.prefill.graph
    assert dec.tensors["past_key_values.0.key"].shape == (1, 2, 71, 64)
    assert pre.tensors["past_key_values.0.key"].shape == (1, 2, 0, 64)
    assert pre.tensors["logits"].shape == (1, 16, 16384) and dec.tensors["logits"].shape == (1, 1, 16384)
    assert phases.varying["logits"] == (False, True, False)
    for lo, hi in dec.unsplit:  # no stage boundary inside a cache's layers
        assert not any(lo < c <= hi for c in dec.pipeline_cuts)
    # nothing that grows with the context crosses a cut but the mask every layer reads (4 bytes a token):
    # not the caches, nor the caches repeated for grouped-query heads, nor the attention scores
    assert {"present.0.key", "past_key_values.0.key"} <= phases.grows
    crossing = {t for c in dec.pipeline_cuts for t in dec.live_across(c)}
    assert crossing & phases.grows == {"mask.bias"} and {"rope.cos", "rope.sin", "mask.bias"} <= dec.riders
    blocks = [hi - lo for lo, hi in dec.pipeline_blocks if lo > 2 and hi < 198]
    assert len(dec.pipeline_cuts) > 8 and max(blocks) < 47  # cuts between every two decoder layers


def test_per_token_figures_and_json_keys(tmp_path):
    summary = compile_api(TINYLM, _cluster(tmp_path, 3, profiles=("rpi5", "rpi4")), tmp_path / "out",
                          strategy="even", generate=True, max_context=128, prompt_len=16)
    assert summary["predicted_tpot_ms"] == summary["predicted_latency_ms"]
    assert summary["predicted_tokens_per_s"] == summary["predicted_throughput_ips"]
    assert summary["predicted_tokens_per_s"] > 1000 / summary["predicted_tpot_ms"]  # 3 stages, sequences in flight
    assert summary["predicted_ttft_ms"] > 0 and summary["generate"]["token_ms"] > 0  # last stage -> first: a link
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert manifest["predicted"]["tpot_ms"] == summary["predicted_tpot_ms"]
    assert {i["name"] for i in manifest["inputs"]} == {"input_ids", "attention_mask", "position_ids"}
    assert [o["name"] for o in manifest["outputs"]] == ["logits"]
    assert manifest["generate"]["phases"] == {"prefill": {"seq": 16, "past": 0}, "decode": {"seq": 1, "past": 71}}


def test_caches_at_max_context_count_in_memory(tmp_path):
    """tinylm's weights (~46 MB) fit one device with 220 MB usable (400 MB, rpi5's 0.75 and 80 MB overhead);
    its caches at 64K context (8 pairs x 32 MB, past and present: 512 MB) do not, and over four devices, one
    layer's caches (128 MB) each, they do."""
    one = compile_api(TINYLM, _cluster(tmp_path, 1, memory_mb=400), tmp_path / "a", generate=True, prompt_len=16,
                      max_context=32)
    assert len(one["stages"]) == 1
    with pytest.raises(UserError, match="needs"):
        compile_api(TINYLM, _cluster(tmp_path, 1, memory_mb=400), tmp_path / "b", generate=True, prompt_len=16,
                    max_context=65536)
    four = compile_api(TINYLM, _cluster(tmp_path, 4, memory_mb=400), tmp_path / "c", generate=True, prompt_len=16,
                       max_context=65536)
    assert len(four["stages"]) == 4
    assert all(d["memory_mb"] <= d["memory_available_mb"] for d in four["devices"])


@pytest.mark.parametrize("strategy", ["spatial", "hybrid", "bbgrap", "edgeflow", "deepthings"])
def test_strategies_that_split_layers_refuse_generate_in_one_line(tmp_path, strategy):
    with pytest.raises(UserError, match=f"--strategy {strategy} does not apply to --generate"):
        compile_api(TINYLM, _cluster(tmp_path, 2), tmp_path / "out", strategy=strategy, generate=True,
                    max_context=64, prompt_len=8)
    assert not (tmp_path / "out").exists()


def test_auto_runs_only_the_strategies_that_apply(tmp_path):
    summary = compile_api(TINYLM, _cluster(tmp_path, 2, profiles=("rpi5", "rpi4")), tmp_path / "out", generate=True,
                          max_context=64, prompt_len=8, objective="throughput")
    ran = {c["strategy"] for c in summary["candidates"]}
    assert "pipeline" in ran and not ran & {"spatial", "hybrid", "bbgrap", "edgeflow", "deepthings"}
    best = {c["strategy"]: c["throughput_ips"] for c in summary["candidates"] if c["feasible"]}
    assert summary["predicted_tokens_per_s"] >= max(best.values()) - 1e-9


def test_generate_options_are_checked():
    with pytest.raises(UserError, match="1 <= prompt-len < max-context"):
        GenerateOptions(max_context=8, prompt_len=8).check()
    with pytest.raises(UserError, match="go with --generate"):
        compile_api(TINYLM, "c.yaml", "out", max_context=8)


def test_fallbacks_of_a_generative_build_are_generative_builds(tmp_path):
    summary = compile_api(TINYLM, _cluster(tmp_path, 2, profiles=("rpi5", "rpi4")), tmp_path / "out", generate=True,
                          max_context=64, prompt_len=8, objective="throughput", fallbacks=True)
    for fb in summary["fallbacks"]:
        manifest = json.loads(Path(fb["manifest"]).read_text())
        assert manifest["version"] == 2 and manifest["generate"]["max_context"] == 64
        assert sum(len(f.get("state", [])) for f in manifest["fragments"]) == 8


def test_edgec_run_refuses_a_generative_build_in_one_line(tmp_path):
    compile_api(TINYLM, _cluster(tmp_path, 1), tmp_path / "out", generate=True, max_context=32, prompt_len=4)
    proc = subprocess.run([sys.executable, "-m", "edgec.compiler", "run", str(tmp_path / "out"), "--random-inputs"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "a generative build" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("objective", quick_only(["latency", "throughput"], {"latency"}))
def test_the_dp_per_first_device_is_exact_with_caches_and_the_tokens_way_back(tmp_path, objective):
    """Brute force over every split and device assignment, each priced by the problem of its first device
    (the token returns to it), finds nothing better than the DP; a plan's price holds the token's transfer,
    and the riders (rotary tables, mask) as evaluate and the emitter route them: on this network a message
    costs 2 ms, so a plan priced with the riders forwarded stage to stage is priced 3 messages per link high."""
    import math

    from edgec.compiler.cluster import load_cluster
    from edgec.compiler.driver import _price
    from edgec.compiler.plan.pipeline_coarse import solve_chain
    from edgec.compiler.cost import evaluate
    from edgec.compiler.plan.pipeline_problem import first_device_problems, pipeline_problem, to_plan
    from pipeline_reference import brute_force

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"devices": [{"name": "a", "profile": "rpi5", "memory_mb": 400},
                                                {"name": "b", "profile": "rpi4"}, {"name": "c", "profile": "rpi5"}],
                                    "network": {"bandwidth_mbps": 50, "latency_ms": 2, "medium": "switched"}}))
    phases = load_phases(TINYLM, GenerateOptions(max_context=8192, prompt_len=32))
    cost = _price(phases.decode, phases, load_cluster(path))
    problem = pipeline_problem(phases.decode.graph, cost)
    assert problem.block_param_bytes.sum() > sum(layer.param_bytes for layer in phases.decode.graph.layers)
    subs = first_device_problems(problem, cost)
    dp = min(solve_chain(sub, objective, top_k=1)[0].key(objective) for sub in subs)
    every = [s for sub in subs for s in brute_force(sub, objective) if math.isfinite(s.latency_ms)]
    assert dp == pytest.approx(min(s.key(objective) for s in every), rel=1e-12)
    split = min((s for s in every if len(s.stages) > 1), key=lambda s: s.key(objective))
    first, last = (problem.devices[split.stages[i].device] for i in (0, -1))
    token = cost.generate.token_ms(cost, last, first)
    assert token > 2  # the link's 2 ms latency and 8 bytes
    assert split.latency_ms == pytest.approx(problem.evaluate(split.stages).latency_ms + token)
    # the price is evaluate's (what the emitter sends), for the best plan, and the bottleneck for the best 3-stage
    # plans whose third stage reads the riders (the first stage sends them straight there, not through the
    # second); their latency is a lower bound (the riders' arrival at the third stage is assumed not to be late)
    graph, riders = phases.decode.graph, problem.riders
    assert riders is not None and riders.ready(frozenset(range(len(riders.nbytes)))) > 1
    best = min(every, key=lambda s: s.key(objective))
    pred = evaluate(to_plan(best, "pipeline", objective, graph, problem), graph, cost)
    assert (pred.latency_ms, pred.bottleneck_ms) == pytest.approx((best.latency_ms, best.bottleneck_ms), rel=1e-12)
    reading = [s for s in every if len(s.stages) == 3 and riders.reads[:, s.stages[2].lo:s.stages[2].hi].any()]
    for sol in sorted(reading, key=lambda s: s.key(objective))[:3]:
        pred = evaluate(to_plan(sol, "pipeline", objective, graph, problem), graph, cost)
        assert pred.bottleneck_ms == pytest.approx(sol.bottleneck_ms, rel=1e-12)
        assert pred.latency_ms >= sol.latency_ms - 1e-9


def test_the_dp_price_of_a_generative_plan_never_exceeds_its_evaluation(tmp_path):
    """The DP's price of a plan (its best routing of the riders, their arrival assumed not late) is a bound of
    `evaluate`'s, which the planner's search relies on (pipeline.py _plan_generative); on bench_generate's
    cluster (1 ms a message), over plans of 2 to 5 stages whose first stage computes the riders and where no
    other tensor skips a stage (a residual around a stage of a norm alone: priced forwarded, as in every build)."""
    from edgec.compiler.cluster import load_cluster
    from edgec.compiler.cost import evaluate
    from edgec.compiler.cost.evaluate import crossing_tensors
    from edgec.compiler.driver import _price
    from edgec.compiler.plan.pipeline_problem import StageChoice, first_device_problems, pipeline_problem, to_plan

    kinds = ["rpi5", "rpi5", "rpi4", "rpi4", "phone"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"devices": [{"name": f"{k}-{i}", "profile": k} for i, k in enumerate(kinds)],
                                    "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}}))
    phases = load_phases(TINYLM, GenerateOptions(max_context=512, prompt_len=64))
    graph, cost = phases.decode.graph, _price(phases.decode, phases, load_cluster(path))
    problem = pipeline_problem(graph, cost)
    subs, B, ready = first_device_problems(problem, cost), problem.n_blocks, problem.riders.ready(frozenset(range(3)))
    rng = np.random.default_rng(0)
    below = tried = 0
    while tried < 40:
        n = int(rng.integers(2, 6))
        cuts = sorted(rng.choice(np.arange(ready, B), n - 1, replace=False).tolist())
        devs = rng.permutation(5)[:n].tolist()
        bounds = [0, *cuts, B]
        stages = tuple(StageChoice(bounds[i], bounds[i + 1], devs[i]) for i in range(n))
        plan = to_plan(subs[devs[0]].evaluate(stages), "pipeline", "latency", graph, problem)
        if any(b > a + 1 and t not in graph.riders for t, a, b in crossing_tensors(plan, graph)):
            continue
        tried += 1
        for objective in ("latency", "throughput"):
            sol = subs[devs[0]].evaluate(stages, objective)
            pred = evaluate(to_plan(sol, "pipeline", objective, graph, problem), graph, cost)
            assert sol.bottleneck_ms <= pred.bottleneck_ms * (1 + 1e-12)
            assert sol.latency_ms <= pred.latency_ms * (1 + 1e-12)
            below += sol.bottleneck_ms < pred.bottleneck_ms * (1 - 1e-9)
    assert below < 40  # a bound that is mostly the price itself


def test_quota_bursts_shorten_one_sequence_and_the_dp_says_it_is_no_bound(tmp_path):
    """Devices profiled under a CPU quota with a burst (cpu_quota.burst_ms): one sequence's steps run their
    first burst_ms of CPU per device at full speed (cost/quota_burst.py), so the TPOT is below the same
    devices' without a burst, the throughput the same; and the generative planner, whose DP prices the steps
    at the share, reports its latency plans as not exact, saying why."""
    base = yaml.safe_load((Path(__file__).resolve().parents[2] / "profiles" / "rpi5.yaml").read_text())
    summaries = {}
    for burst in (None, 3.5):
        prof = dict(base, cpu_quota={"cores": 0.35, "period_us": 5000, "source": "cgroup v1", "read": True,
                                     **({"burst_ms": burst} if burst else {})})
        (tmp_path / f"q{burst}.yaml").write_text(yaml.safe_dump(prof))
        cluster = tmp_path / f"c{burst}.yaml"
        cluster.write_text(yaml.safe_dump({"devices": [{"name": f"d{i}", "profile": f"q{burst}.yaml", "threads": 1}
                                                       for i in range(3)],
                                           "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}}))
        summaries[burst] = compile_api(TINYLM, cluster, tmp_path / f"out{burst}", strategy="pipeline", generate=True,
                                       max_context=128, prompt_len=16, objective="latency")
    slow, fast = summaries[None], summaries[3.5]
    assert fast["predicted_tpot_ms"] < slow["predicted_tpot_ms"]
    (plan,) = [p for p in fast["planning"] if p["strategy"] == "pipeline"]
    assert plan["detail"]["exact"] is False and "burst" in plan["detail"]["inexact"]
    (plan,) = [p for p in slow["planning"] if p["strategy"] == "pipeline"]
    assert plan["detail"]["exact"] is True
