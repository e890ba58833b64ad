"""Devices sharing a host stream their weights side by side: where the profile measured shared_weight_gbps,
a tile whose segment another device of its host also tiles pays its layers' weights at that rate
(CostTable.shared_weight_ms), in predict_stage, in the fragments' predicted_ms, and in the spatial search's
step model; so does a pipeline stage's period while inputs stream, when another device of its host works
in the plan; a device alone on its host, or without the figure, pays as before. `edgec profile`
measures the figure with co-runner processes, and a co-runner that fails is a warning (an error with
--strict), with nothing left running."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import onnxruntime as ort
import pytest
import yaml
from click.testing import CliRunner

from edgec.compiler.cli import cli
from edgec.compiler.cluster import ClusterModel, DeviceSpec, load_profile, validate_profile_dict
from edgec.compiler.cluster.cluster import HostSpec
from edgec.compiler.cluster.profile import profile_path
from edgec.compiler.cost import build_cost_table, evaluate, simulate_manifest
from edgec.compiler.cost.table import weight_ms
from edgec.compiler.cost.stage_timeline import predict_stage
from edgec.compiler.cost.tile_steps import StepModel
from edgec.compiler.cost.tiles import SegmentCost, host_mates
from edgec.compiler.errors import UserError
from edgec.runtime.errors import InputError
from edgec.compiler.plan_types import Plan, Stage
from edgec.runtime.profile import measure, shared
from edgec.runtime.profile.bench import DRAM_ROUNDS
from edgec.runtime.profile.timing import QUICK
from tests.compiler.profile_scripted import script_timings
from tests.compiler.test_profile_stability import ScriptedProbe
from edgec.runtime.manifest.load import load_manifest
from tests.compiler.test_tile_copy import SIZE, chain, emit, plan_of, rows_stage

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
WEIGHT_GBPS = 0.2  # the shipped profiles measured no weight_gbps: these tests give them one
SHARED_GBPS = {"rpi5": 0.05, "rpi4": 0.04}  # slow enough that the chain's small weights cost visibly


def cluster(kinds, shared_gbps: dict[str, float], hosts: tuple) -> ClusterModel:
    """Devices of `kinds`, device i on host hosts[i] (None: its own machine), their profiles with
    shared_weight_gbps from `shared_gbps` (absent: not measured)."""
    devs = []
    for i, (k, h) in enumerate(zip(kinds, hosts)):
        prof = dataclasses.replace(load_profile(k), weight_gbps=WEIGHT_GBPS, shared_weight_gbps=shared_gbps.get(k))
        devs.append(DeviceSpec(f"{k}-{i}", prof, prof.memory_mb, None, threads=1, host=h))
    names = {h for h in hosts if h is not None}
    return ClusterModel(tuple(devs), 100.0, 0.2, "switched", {}, "test", hosts={h: HostSpec(2) for h in names})


def test_the_shared_rate_prices_each_layers_weights_again_on_a_device_with_a_host(tmp_path):
    graph = chain(tmp_path).graph
    cost = build_cost_table(graph, cluster(("rpi5", "rpi4"), SHARED_GBPS, ("m", None)))
    for i, layer in enumerate(graph.layers):
        alone = weight_ms(layer, cost.cluster.devices[0].figures)
        want = max(0.0, layer.read_param_bytes / (SHARED_GBPS["rpi5"] * 1e6) - alone) if alone else 0.0
        assert cost.shared_weight_ms[i, 0] == want
        assert cost.shared_weight_ms[i, 1] == 0.0  # no host: nothing shares its memory
    assert cost.shared_weight_ms[:, 0].sum() > 0
    # without the figure, nothing
    plain = build_cost_table(graph, cluster(("rpi5", "rpi4"), {}, ("m", "m")))
    assert not plain.shared_weight_ms.any()


def test_host_mates_are_distinct_devices_of_one_host(tmp_path):
    cost = build_cost_table(chain(tmp_path).graph, cluster(("rpi5", "rpi5", "rpi4"), SHARED_GBPS, ("m", "m", "n")))
    assert host_mates(cost, [0, 1, 2]) == {0, 1}
    assert host_mates(cost, [0, 0, 2]) == set()  # one device's two tiles run one after the other
    assert host_mates(cost, [1, 2]) == set()


def _stage(tmp_path, hosts, splits=(8, 8, 3)):
    ing = chain(tmp_path)
    kinds = ("rpi5", "rpi4")
    shared_cost = build_cost_table(ing.graph, cluster(kinds, SHARED_GBPS, hosts), ing.sha256)
    free_cost = build_cost_table(ing.graph, cluster(kinds, {}, hosts), ing.sha256)
    return ing, rows_stage(ing.graph, list(shared_cost.devices), splits), shared_cost, free_cost


def test_tiles_of_one_host_pay_the_shared_rate_and_the_fragments_carry_it(tmp_path):
    ing, stage, cost, free = _stage(tmp_path, ("m", "m"))
    before, after = predict_stage(stage, ing.graph, free), predict_stage(stage, ing.graph, cost)
    for (j, n), ms in after["tile_ms"].items():
        seg = stage.spatial.segments[j]
        extra = float(cost.shared_weight_ms[seg.lo:seg.hi, n].sum())
        assert extra > 0
        assert ms == before["tile_ms"][j, n] + extra, (j, n)
    assert after["latency_ms"] > before["latency_ms"]

    # the emitted tile fragments carry it, and simulate (which replays them) agrees with the prediction
    _, pred, manifest = emit(ing, cost.cluster, plan_of(ing.graph, stage), tmp_path / "out")
    frag_ms = {f["id"]: f["predicted_ms"] for f in manifest["fragments"]}
    for (j, n), ms in after["tile_ms"].items():
        assert frag_ms[f"f0s{j}t{n}"] == round(ms, 4)
    sim = simulate_manifest(load_manifest(tmp_path / "out" / "manifest.json"))
    assert sim["latency_ms"] == pytest.approx(pred.latency_ms, rel=1e-4)


def test_tiles_on_machines_of_their_own_pay_as_before(tmp_path):
    for hosts in ((None, None), ("m", "n")):
        (tmp_path / str(hosts[0])).mkdir()
        ing, stage, cost, free = _stage(tmp_path / str(hosts[0]), hosts)
        assert predict_stage(stage, ing.graph, cost)["tile_ms"] == predict_stage(stage, ing.graph, free)["tile_ms"]


def test_the_step_model_charges_it_as_predict_stage_and_only_for_busy_mates(tmp_path):
    """Bit for bit predict_stage's tile times where both devices compute; a device computing alone pays
    nothing for a mate that has no rows."""
    splits = (5, 11, 9)
    ing, stage, cost, free = _stage(tmp_path, ("m", "m"), splits)
    info = predict_stage(stage, ing.graph, cost)
    model = StepModel(cost, [0, 1])
    holders = [(0, 0, SIZE)]
    zeros = (0.0,) * len(holders)
    for j, seg in enumerate(stage.spatial.segments):
        cx = model.context(SegmentCost.build(ing.graph, cost, seg.lo, seg.hi, 2), holders)
        zeros = (0.0,) * len(holders)
        part = (0, splits[j], SIZE)
        done, sent = [], zeros
        for n in range(2):
            r, c, sent, _ = model.term(cx, n, part[n], part[n + 1], sent, 0.0)
            done.append((n, r, c))
            assert c + cx.mate_ms[n] == info["tile_ms"][j, n], (j, n)
        assert model.finish(cx, done, sent) == max(
            max(r, sent[cx.sender[p]] if cx.sender[p] >= 0 else 0.0) + c + cx.mate_ms[p] for p, r, c in done)
        # every row on device 0: its mate computes nothing, so nothing is added
        r0, c0, sent0, _ = model.term(cx, 0, 0, SIZE, zeros, 0.0)
        assert model.score(cx, (0, SIZE, SIZE)) == max(r0, sent0[cx.sender[0]] if cx.sender[0] >= 0 else 0.0) + c0
        holders = [(0, 0, splits[j]), (1, splits[j], SIZE)]


def test_a_profile_reads_the_figure_and_refuses_a_bad_one():
    doc = {"name": "x", "memory_mb": 1024, "usable_memory_fraction": 0.8, "runtime_overhead_mb": 100,
           "op_overhead_us": 5, "gflops": {"conv": 10, "depthwise_conv": 5, "gemm": 10, "other": 2},
           "memory_gbps": 5, "weight_gbps": 4, "shared_weight_gbps": 2.5}
    assert validate_profile_dict(doc, "x.yaml").shared_weight_gbps == 2.5
    assert validate_profile_dict({k: v for k, v in doc.items() if k != "shared_weight_gbps"},
                                 "x.yaml").shared_weight_gbps is None
    for bad in (0, -1, "fast"):
        with pytest.raises(UserError) as ei:
            validate_profile_dict({**doc, "shared_weight_gbps": bad}, "x.yaml")
        assert str(ei.value).startswith("x.yaml: ") and "shared_weight_gbps" in str(ei.value)
        assert "\n" not in str(ei.value)
    entry = {"runs": 9, "median_ms": 2.7, "spread": 0.05, "stable": True, "paired_ratio": 0.58, "pairs": 42,
             "contended_pairs": 9, "later_pairs": 24}
    measured = {**doc, "measurement": {"threads": {1: {"shared_weight_gbps": entry}}}}
    timing = validate_profile_dict(measured, "x.yaml").measurement["threads"][1]["shared_weight_gbps"]
    assert (timing["pairs"], timing["contended_pairs"], timing["later_pairs"]) == (42, 9, 24)
    old = {**doc, "measurement": {"threads": {1: {"shared_weight_gbps": {**entry, "later_paired_ratio": 0.55}}}}}
    assert validate_profile_dict(old, "x.yaml").shared_weight_gbps == 2.5  # a profile written before 2026-11-27
    for key, bad in (("pairs", 1.5), ("pairs", -1), ("paired_ratio", 0), ("later_pairs", 2.5), ("later_pairs", -3),
                     ("later_paired_ratio", -0.5), ("contended_pairs", -1), ("contended_pairs", 0.5)):
        with pytest.raises(UserError) as ei:
            validate_profile_dict({**doc, "measurement": {"threads": {1: {"shared_weight_gbps": {**entry, key: bad}}}}},
                                  "x.yaml")
        assert str(ei.value).startswith("x.yaml: ") and key in str(ei.value) and "\n" not in str(ei.value)


def _co_runners() -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "edgec-profile-shared-" in line]


# Through measure_host: on scripted timings (profile_scripted.py: co-runner processes real, what their rounds
# time scripted) in the README's test command, and timed for real in the slow set (on a busy machine a co-runner
# may be off the CPU in every round, and the figure is then rightly not written).
MODES = ["scripted", pytest.param("measured", marks=pytest.mark.slow)]


def _quick_profile(monkeypatch, mode: str) -> dict:
    if mode == "scripted":
        script_timings(monkeypatch)
        return measure.measure_host(threads=1, quick=True, runtime_costs=False, probe=ScriptedProbe(0.0))
    return measure.measure_host(threads=1, quick=True, runtime_costs=False)


@pytest.mark.parametrize("mode", MODES)
def test_the_quick_profile_measures_it_and_leaves_no_co_runner(monkeypatch, mode):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: nothing shares it")
    p = _quick_profile(monkeypatch, mode)
    assert p["shared_weight_gbps"] > 0
    timing = p["measurement"]["threads"][1]["shared_weight_gbps"]
    assert timing["runs"] >= 3 and timing["median_ms"] > 0
    # weight_gbps' figure times the ratio of rates the figure is at, to the figures' 3 digits (over the later sets'
    # pairs too, where too few of the micro-benchmarks' contended)
    assert 0 < timing["pairs"] <= timing["rounds"] and timing["paired_ratio"] > 0
    assert 0 <= timing["contended_pairs"] <= timing["pairs"] + timing.get("later_pairs", 0)
    assert p["shared_weight_gbps"] == pytest.approx(p["weight_gbps"] * timing["paired_ratio"], rel=0.02)
    assert any(s.startswith("shared_weight_gbps: ") for s in p["sources"])
    assert validate_profile_dict(p, "quick.yaml").shared_weight_gbps == p["shared_weight_gbps"]
    assert _co_runners() == []


def test_a_co_runner_that_fails_is_a_warning_and_an_error_with_strict(monkeypatch):
    monkeypatch.setattr(shared, "_CO_RUNNER", "import sys; sys.exit('no onnxruntime here')")
    monkeypatch.setattr(measure.host, "all_cores", lambda cpu: 2)
    script_timings(monkeypatch)  # the other timings: nothing of them is tested here
    p = measure.measure_host(threads=1, quick=True, runtime_costs=False, probe=ScriptedProbe(0.0))
    assert "shared_weight_gbps" not in p and "shared_weight_gbps" not in p["measurement"]["threads"][1]
    assert any(w.startswith("shared_weight_gbps not written: a co-runner process exited (1): no onnxruntime here")
               for w in p["measurement"]["warnings"])
    with pytest.raises(InputError) as ei:  # --strict: the same failure refuses (measure_host's step alone)
        with measure._co_runners(1, True, True, lambda s: None, [], []):
            pass
    assert "shared_weight_gbps" in str(ei.value) and "no onnxruntime here" in str(ei.value)
    assert _co_runners() == []


def _two_on_one_host(tmp_path: Path, gbps) -> Path:
    doc = yaml.safe_load(profile_path("rpi5", None).read_text())
    doc["weight_gbps"], doc["shared_weight_gbps"] = WEIGHT_GBPS, gbps
    prof = tmp_path / "rpi5-shared.yaml"
    prof.write_text(yaml.safe_dump(doc))
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({
        "devices": [{"name": "a", "profile": str(prof), "threads": 1, "host": "m"},
                    {"name": "b", "profile": str(prof), "threads": 1, "host": "m"}],
        "hosts": {"m": {"cores": 2}},
        "network": {"bandwidth_mbps": 1000, "latency_ms": 0.1, "medium": "switched"}}))
    return path


def test_a_spatial_plan_priced_with_it_runs_and_verifies(tmp_path):
    """End to end: two devices on one host, a profile with the figure, a spatial plan whose tiles are priced
    above the same plan's without it; `edgec run --verify` reproduces the whole model's outputs."""
    runner = CliRunner()
    model = MODELS / "tinyconv.onnx"
    built = {}
    for tag, gbps in (("slow", 0.01), ("fast", 1000.0)):
        folder = tmp_path / tag
        folder.mkdir()
        res = runner.invoke(cli, ["compile", str(model), "--devices", str(_two_on_one_host(folder, gbps)),
                                  "-o", str(folder / "out"), "--strategy", "spatial", "--json"], prog_name="edgec")
        assert res.exit_code == 0, res.output
        built[tag] = json.loads((folder / "out" / "manifest.json").read_text())
    tiles = {tag: {f["id"]: f["predicted_ms"] for f in m["fragments"] if "t" in f["id"].split("s")[-1]}
             for tag, m in built.items()}
    common = set(tiles["slow"]) & set(tiles["fast"])
    assert common and all(tiles["slow"][f] > tiles["fast"][f] for f in common)
    res = runner.invoke(cli, ["run", str(tmp_path / "slow" / "out" / "manifest.json"), "--random-inputs", "--seed", "3",
                              "--verify", "--json"], prog_name="edgec")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["verify"]["passed"]


def test_a_bad_figure_is_one_line_exit_2_and_no_build(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["compile", str(MODELS / "tinyconv.onnx"), "--devices",
                                   str(_two_on_one_host(tmp_path, -1)), "-o", str(out)], prog_name="edgec")
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and "rpi5-shared.yaml" in res.stderr and "shared_weight_gbps" in res.stderr
    assert "Traceback" not in res.output and not out.exists()


def _pipeline(tmp_path, hosts, gbps=SHARED_GBPS):
    ing = chain(tmp_path)
    graph = ing.graph
    cost = build_cost_table(graph, cluster(("rpi5", "rpi4"), gbps, hosts), ing.sha256)
    cut = len(graph.layers) // 2
    plan = Plan("manual", "throughput", (Stage(cost.devices[0], 0, cut), Stage(cost.devices[1], cut, len(graph.layers))))
    return graph, cost, plan.ensures(graph), cut


def test_streaming_pipeline_stages_of_one_host_pay_the_shared_rate_in_their_period(tmp_path):
    """Inputs streaming, both stages work at once: each stage's period, and its host's work, carry its weights'
    streaming beside the other; a lone request's latency, and the fragments it sets, do not."""
    graph, cost, plan, cut = _pipeline(tmp_path, ("m", "m"))
    free = build_cost_table(graph, cluster(("rpi5", "rpi4"), {}, ("m", "m")))
    with_, without = evaluate(plan, graph, cost), evaluate(plan, graph, free)
    extra = (cost.shared_weights(0, cut, 0), cost.shared_weights(cut, len(graph.layers), 1))
    assert all(e > 0 for e in extra)
    for d, e in zip(cost.devices, extra):
        assert with_.period_ms[d] == pytest.approx(without.period_ms[d] + e, rel=1e-12)
        assert with_.busy_ms[d] == without.busy_ms[d]  # energy counts the lone request's compute
    # the machine's work per input grows by both stages' extra (1-thread workers on its 2 cores)
    assert with_.host_ms["m"] == pytest.approx(without.host_ms["m"] + sum(extra) / 2, rel=1e-12)
    assert with_.latency_ms == without.latency_ms and with_.stage_ms == without.stage_ms
    assert with_.bottleneck_ms > without.bottleneck_ms


def test_streaming_pipeline_stages_on_machines_of_their_own_pay_as_before(tmp_path):
    for hosts in ((None, None), ("m", "n")):
        (tmp_path / str(hosts[1])).mkdir()
        graph, cost, plan, _ = _pipeline(tmp_path / str(hosts[1]), hosts)
        free = build_cost_table(graph, cluster(("rpi5", "rpi4"), {}, hosts))
        assert evaluate(plan, graph, cost).period_ms == evaluate(plan, graph, free).period_ms


def test_rounds_with_a_co_runner_off_the_cpu_do_not_count(monkeypatch):
    """A co-runner that did not run during a round (its CPU time did not move) leaves that round out; when no
    round had one beside it, the figure is not written (a warning; an error with --strict)."""
    script_timings(monkeypatch, co_runners_on_cpu=False)
    monkeypatch.setattr(shared.CoRunners, "_ran_s", lambda self: 0.0)
    monkeypatch.setattr(measure.host, "all_cores", lambda cpu: 2)
    p = measure.measure_host(threads=1, quick=True, runtime_costs=False, probe=ScriptedProbe(0.0))
    rounds = p["measurement"]["threads"][1]["shared_weight_gbps"]["rounds"]
    assert "shared_weight_gbps" not in p and rounds == QUICK.rounds * DRAM_ROUNDS
    assert (f"shared_weight_gbps not written: a co-runner was off the CPU in every one of its {rounds} rounds"
            in p["measurement"]["warnings"])
    assert any(w.startswith("1 thread, shared_weight_gbps: ")
               and w.endswith(f"{rounds} of {rounds} rounds with a co-runner off the CPU, not counted)")
               for w in p["measurement"]["warnings"])
    idle = types.SimpleNamespace(rounds=rounds, idle_rounds=rounds)  # --strict: measure_host's step alone
    with pytest.raises(InputError, match=f"^shared_weight_gbps not written: a co-runner was off the CPU in every one "
                                        f"of its {rounds} rounds; profile on a quiet machine"):
        measure._shared_weights(25.0, idle, True, lambda s: None, [], [])
    assert _co_runners() == []


def test_co_runners_run_only_when_resumed_and_stop_with_the_profile():
    """Paused, a co-runner takes no CPU; resumed, it runs (waited for: on a busy machine it may take a while to
    get a CPU); paused again, it stops taking CPU; closed, it is gone."""
    with shared.CoRunners(1, True) as co:
        before = co._ran_s()
        time.sleep(0.3)
        assert co._ran_s() - before < 0.05
        co._send(b"g")
        deadline = time.monotonic() + 60
        while co._ran_s() - before < 0.05 and time.monotonic() < deadline:
            time.sleep(0.01)
        co._send(b"p")
        assert co._ran_s() - before >= 0.05
        time.sleep(0.1)  # the run under way when it read the pause
        paused = co._ran_s()
        time.sleep(0.3)
        assert co._ran_s() - paused < 0.05
        procs = list(co.procs)
    assert all(p.poll() is not None for p in procs) and _co_runners() == []


@pytest.mark.slow
def test_co_runners_run_only_in_its_rounds_and_stop_with_the_profile():
    """Paused, a co-runner takes no CPU; resumed for a round, it takes a CPU; closed, it is gone.  Slow: a round
    lasts milliseconds, within which a co-runner on a busy machine may not get a CPU (then the round rightly
    counts it off the CPU)."""
    with shared.CoRunners(1, True) as co:
        before = co._ran_s()
        time.sleep(0.3)
        assert co._ran_s() - before < 0.05
        series = co.timer(co.data, co.feeds, 1, QUICK, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        assert series.median_s > 0 and co.rounds == 1 and co.idle_rounds == 0 and co.on_cpu == [True]
        paused = co._ran_s()
        time.sleep(0.3)
        assert co._ran_s() - paused < 0.05
        procs = list(co.procs)
    assert all(p.poll() is not None for p in procs) and _co_runners() == []


def test_co_runners_of_a_profile_that_is_killed_stop_too():
    """A profile killed outright (no clean-up runs) closes its co-runners' stdin with its death: they end, paused
    or running."""
    script = ("import os, sys, signal\n"
              "from edgec.runtime.profile import shared\n"
              "co = shared.CoRunners(2, True)\n"
              "co._send(b'g')\n"  # one running, as in a round, when the profile dies
              "print(' '.join(str(p.pid) for p in co.procs), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in res.stdout.split()]
    assert len(pids) == 2 and res.returncode == -9

    def alive(pid: int) -> bool:  # an exited process nobody has reaped yet (a zombie) counts as ended
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids) and _co_runners() == []


def _bench_pairs(co: shared.CoRunners, solo_s: float, shared_s: float, solo_stable: bool = True, off: bool = False):
    """A Bench (2 passes) timing weight_gbps at `solo_s` and the co-runners' job at `shared_s`, scripted (`off`:
    every shared round with a co-runner off the CPU); returns it and the shared figure's formula's value."""
    from tests.compiler.test_profile_timing import QuietProbe, rnd
    from edgec.runtime.profile.bench import Bench
    from edgec.runtime.profile.kernels import WEIGHTS
    from edgec.runtime.profile.timing import Policy

    b = Bench(1, True, Policy(rounds=2, retries=0), QuietProbe(0.0), False, lambda s: None,
              timer=lambda *a: rnd(solo_s, stable=solo_stable))
    b.add(WEIGHTS, b"w", {}, per_pass=DRAM_ROUNDS)
    formula = co.add_to(b)
    co.time_model = lambda *a: rnd(shared_s)  # CoRunners(0): no co-runner to be off the CPU
    times = b.run()
    if off:
        co.on_cpu = [False] * len(co.on_cpu)
    return b, formula(times)


def test_too_few_contended_pairs_get_more_sets_and_the_contended_pairs_of_every_set_make_the_figure():
    """The micro-benchmarks' pairs streamed at 0.95 of the rate alone (an uncontended phase): `later` times as
    many pairs again, each a weight_gbps round alone then one beside the co-runners, LATER_GAP_S apart, until the
    contended pairs over every set are NEED of the micro-benchmarks' or LATER_SETS were taken; the figure is at
    their median, else at every pair's median with a warning. Pairs enough of which contended get no more."""
    from tests.compiler.test_profile_timing import rnd

    pairs = 2 * DRAM_ROUNDS  # the scripted Bench's: 4 of them contended are enough
    with shared.CoRunners(0, True) as co:  # the first later set contends: no gap, no second set
        b, first = _bench_pairs(co, 1.0, 1.05)
        gb = co.nbytes / 1e9
        assert first == pytest.approx(gb / 1.05) and (co.contended, co.enough) == (0, False)
        calls = []
        b.timer = lambda *a: (calls.append("alone"), rnd(1.0))[1]
        co.time_model = lambda *a: (calls.append("beside"), rnd(2.0))[1]
        assert co.later(lambda s: None, sleep=lambda s: pytest.fail("slept")) == pytest.approx(gb / 2.0)
        assert calls == ["alone", "beside"] * pairs
        entry = b.entries[shared.NAME]
        assert (entry["pairs"], entry["contended_pairs"], entry["later_pairs"]) == (pairs, pairs, pairs)
        assert entry["paired_ratio"] == co.paired_ratio == 0.5

    with shared.CoRunners(0, True) as co:  # 2 of a set contend, then 2 of the next: enough over both sets
        b, first = _bench_pairs(co, 1.0, 1.05)
        co.quick, sleeps, said = False, [], []
        times = iter([2.0, 2.2] + [1.0] * (pairs - 2) + [1.9, 2.1] + [1.0] * (pairs - 2))
        co.time_model = lambda *a: rnd(next(times))
        assert co.later(said.append, sleep=sleeps.append) == pytest.approx(gb / 2.05)  # median of 1.9 2.0 2.1 2.2
        assert next(times, None) is None and sleeps == [shared.LATER_GAP_S]
        assert said[0] == f"  shared_weight_gbps: 0 of its {pairs} pairs contended for memory, 4 wanted; {pairs} more " \
                          f"pairs (1 of at most {shared.LATER_SETS})"
        assert (b.entries[shared.NAME]["contended_pairs"], b.entries[shared.NAME]["later_pairs"]) == (4, 2 * pairs)

    with shared.CoRunners(0, True) as co:  # a later round with a co-runner off the CPU is not paired
        b, first = _bench_pairs(co, 1.0, 1.05)
        first_set = [1.5, 1.6, 3.0, 3.0, 3.0, 1.55] + [1.0] * (pairs - 6)
        times = iter(first_set + [1.5] + [1.0] * (pairs - 1))
        off = iter([False, False, True, True, True, False] + [False] * (2 * pairs - 6))
        co.time_model = lambda *a: rnd(next(times))
        real = co.timer

        def timer(*a):
            series = real(*a)
            co.on_cpu[-1] = not next(off)  # as the co-runner check marks a round with a co-runner off the CPU
            return series
        co.timer = timer
        # the rounds at 3.0 are not paired, so the first set gives 3 contended pairs of the 4 wanted and a second
        # set is taken; its 1.5 makes 4: the median of 1.5 1.5 1.55 1.6 (counted, the 3.0s would have made 2.3)
        assert co.later(lambda s: None, sleep=lambda s: None) == pytest.approx(gb / 1.525)
        assert next(times, None) is None and (co.counted, co.contended) == (3 * pairs - 3, 4)
        assert b.entries[shared.NAME]["later_pairs"] == 2 * pairs - 3

    with shared.CoRunners(0, True) as co:  # no set contends: LATER_SETS of them, every pair's median, a warning
        b, first = _bench_pairs(co, 1.0, 1.05)
        co.quick, sleeps = False, []
        later = [1.02, 1.1, 1.01, 1.03, 1.04]
        times = iter([t for t in later for _ in range(pairs)])
        co.time_model = lambda *a: rnd(next(times))
        co.later = lambda say, _later=co.later: _later(say, sleep=sleeps.append)
        details = []
        # 12 pairs each at 1.01 1.02 1.03 1.04 1.05 1.1: the median is (1.03 + 1.04) / 2
        assert measure._shared_weights(first, co, True, lambda s: None, details, []) == pytest.approx(gb / 1.035, rel=5e-3)
        assert next(times, None) is None and shared.LATER_SETS == 5 and sleeps == [shared.LATER_GAP_S] * 4
        entry = b.entries[shared.NAME]
        assert (entry["pairs"], entry["contended_pairs"], entry["later_pairs"]) == (pairs, 0, 5 * pairs)
        assert details == [f"shared_weight_gbps: 0 of its {6 * pairs} pairs contended for memory (rate ratio 0.966 "
                           "over all); a machine whose cores share a memory path may give a lower figure when "
                           "profiled again"]

    with shared.CoRunners(0, True) as co:  # contended: the figure stands, nothing more is timed
        b, first = _bench_pairs(co, 1.0, 1.8)
        co.timer = b.timer = lambda *a: pytest.fail("timed a second set")
        assert co.later(lambda s: None) is None and "later_pairs" not in b.entries[shared.NAME]
        assert first == pytest.approx(gb / 1.8) and b.entries[shared.NAME]["contended_pairs"] == pairs

    with shared.CoRunners(0, True) as co:  # rounds that did not settle still count
        b, first = _bench_pairs(co, 1.0, 1.8, solo_stable=False)
        assert first == pytest.approx(gb / 1.8) and b.entries[shared.NAME]["pairs"] == pairs

    with shared.CoRunners(0, True) as co:  # no pair (a co-runner off the CPU in every round): the shared rounds'
        b, first = _bench_pairs(co, 1.0, 1.8, off=True)  # own figure, and no second set
        assert first == pytest.approx(gb / 1.8) and b.entries[shared.NAME]["pairs"] == 0
        assert co.later(lambda s: None) is None


@pytest.mark.parametrize("mode", MODES)
def test_a_quick_profile_whose_pairs_did_not_contend_takes_more_sets(monkeypatch, mode):
    """End to end with co-runner processes: no pair counted as contending (UNCONTENDED 0), the profile takes
    LATER_SETS more sets after the other timings (no gap: quick), writes them, and the figure is weight_gbps times
    every pair's median ratio, with a warning."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: nothing shares it")
    monkeypatch.setattr(shared, "UNCONTENDED", 0.0)
    p = _quick_profile(monkeypatch, mode)
    timing = p["measurement"]["threads"][1]["shared_weight_gbps"]
    assert 0 < timing["later_pairs"] <= shared.LATER_SETS * timing["rounds"] and timing["contended_pairs"] == 0
    assert 0 < timing["pairs"] <= timing["rounds"] and timing["paired_ratio"] > 0
    assert p["shared_weight_gbps"] == pytest.approx(p["weight_gbps"] * timing["paired_ratio"], rel=0.02)
    assert any(w.startswith(f"shared_weight_gbps: 0 of its {timing['pairs'] + timing['later_pairs']} pairs contended")
               for w in p["measurement"]["warnings"])
    assert validate_profile_dict(p, "quick.yaml").shared_weight_gbps == p["shared_weight_gbps"]
    assert _co_runners() == []
