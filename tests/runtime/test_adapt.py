"""`edgec run --adapt`: measured figures re-cost the plans a build kept (compile --keep / --shifts) and the run
switches, between requests and losing none, to the best; `--emulate --slow` slows a device mid-run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgec
from edgec.compiler.cli import cli
from edgec.runtime.coordinator.adapt import WINDOW, Adapter, Measured, Option, busiest_ms
from edgec.runtime.front.api import parse_slow
from edgec.runtime.errors import InputError
from edgec.runtime.manifest.load import load_alternative, load_manifest
from edgec.runtime.wire.protocol import parse
from edgec.runtime.manifest.replay import Drift, replay
from edgec.runtime.wire.transport import BadMessage, pack
from tests.compiler.test_pareto import PROFILES, _cluster

TINYCONV = Path(os.environ["EDGEC_MODELS_DIR"]) / "tinyconv.onnx"


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    """tinyconv on three slow devices (ms-scale fragments), a three-stage pipeline for throughput, with every
    other frontier plan kept and the boundary shifts."""
    folder = tmp_path_factory.mktemp("adapt")
    cluster = _cluster(folder, PROFILES)
    out = folder / "build"
    res = CliRunner().invoke(cli, ["compile", str(TINYCONV), "--devices", str(cluster), "-o", str(out), "--strategy",
                                   "pipeline", "--objective", "throughput", "--keep", "50", "--shifts"])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def options(build) -> list[Option]:
    main = load_manifest(build / "manifest.json")
    return [Option(main, "manifest.json")] + [Option(load_alternative(main, a), a.manifest) for a in main.alternatives]


def _measure(adapter: Adapter, slow: dict[str, float], requests: int) -> None:
    """Feed the adapter requests whose fragment runs took slow[device] x their prediction (1 elsewhere) and
    whose transfers took exactly their prediction."""
    m = adapter.current.manifest
    frags = {f.id: f.predicted_ms * slow.get(f.device, 1.0) for f in m.fragments.values()}
    _, links = adapter.measured._predictions(m)
    for _ in range(requests):
        adapter.observe(m, frags, dict(links))


def test_measured_figures_are_the_median_run_factor_and_the_fastest_link_factor(options):
    m = options[0].manifest
    measured = Measured(window=3)
    frags = list(m.fragments.values())
    _, links = measured._predictions(m)
    key = next(iter(links))
    for factor, link in ((1.0, 5.0), (3.0, 1.5), (3.0, 2.0), (3.0, 9.0)):  # the first falls out of the window
        measured.add(m, {f.id: f.predicted_ms * factor for f in frags}, {key: links[key] * link})
    drift = measured.drift()
    assert {d: round(v, 9) for d, v in drift.compute.items()} == {f.device: 3.0 for f in frags}
    assert drift.transfer == {key[:2]: pytest.approx(1.5)}


def test_no_drift_no_decision(options):
    adapter = Adapter(list(options), objective="latency")
    _measure(adapter, {}, WINDOW + 3)
    assert adapter.decide(WINDOW + 3) is None and adapter.decisions == []


def test_a_slowed_device_switches_to_the_best_plan_re_costed_by_brute_force(options):
    main = options[0].manifest
    busiest = max(main.device_names, key=lambda d: sum(f.predicted_ms for f in main.device_fragments(d)))
    for objective in ("latency", "throughput"):
        adapter = Adapter(list(options), objective=objective)
        _measure(adapter, {busiest: 3.0}, WINDOW - 1)
        assert adapter.decide(WINDOW - 1) is None  # not a full window yet
        _measure(adapter, {busiest: 3.0}, 1)
        chosen = adapter.decide(WINDOW)
        drift = Drift({d: (3.0 if d == busiest else 1.0) for d in main.device_names if main.device_fragments(d)})
        if objective == "latency":
            brute = {o.label: replay(o.manifest, drift).latency_ms for o in options}
        else:  # period: 1 / predicted throughput, scaled as the busiest resource's time
            brute = {o.label: 1000.0 / o.manifest.predicted["throughput_ips"] * busiest_ms(replay(o.manifest, drift))
                     / busiest_ms(replay(o.manifest)) for o in options}
        best = min(brute, key=brute.get)
        decision = adapter.decisions[-1]
        assert decision.recosted_ms == pytest.approx(brute)
        assert f"compute of {busiest} at 3.00x" in decision.reason
        assert brute[best] < brute["manifest.json"] * 0.9, "the test needs a plan worth switching to"
        assert chosen is not None and chosen.label == best == adapter.current.label
        # the figures are now what the plan in use assumes: the same drift decides nothing again
        _measure(adapter, {busiest: 3.0}, WINDOW)
        assert adapter.decide(2 * WINDOW) is None and len(adapter.decisions) == 1


def test_a_change_within_the_margin_is_decided_but_not_switched(options):
    adapter = Adapter(list(options), objective="latency", margin=10.0)  # nothing can beat it by 1000%
    main = options[0].manifest
    _measure(adapter, {d: 3.0 for d in main.device_names}, WINDOW)
    assert adapter.decide(WINDOW) is None
    assert adapter.decisions[-1].best == adapter.decisions[-1].current == "manifest.json"


def test_forget_drops_the_warm_up(options):
    adapter = Adapter(list(options))
    _measure(adapter, {d: 5.0 for d in options[0].manifest.device_names}, WINDOW)
    adapter.forget()
    _measure(adapter, {}, WINDOW)
    assert adapter.decide(WINDOW) is None


def _slowed_run(build, options, inflight):
    """A device slowed 3x from timed request 8 of 30 on, under emulation, with --adapt: (the run's report, its
    one switch of plan, the brute-force re-costing of every option)."""
    main = options[0].manifest
    busiest = max(main.device_names, key=lambda d: sum(f.predicted_ms for f in main.device_fragments(d)))
    report = edgec.run(build, random_inputs=True, verify=True, emulate=True, dilate=3.0, repeat=30, inflight=inflight,
                       adapt=True, adapt_threshold=0.5, adapt_for="latency", slow={busiest: (8, 3.0)})
    assert report["verify"]["passed"] and report["verify"]["requests_checked"] == 31
    assert report["completed"] == 30 and report["lost"] == 0
    switched = [a for a in report["adaptations"] if a["to"] != a["from"]]
    assert len(switched) == 1, report["adaptations"]
    drift = Drift({d: (3.0 if d == busiest else 1.0) for d in main.device_names})
    return report, switched[0], {o.label: replay(o.manifest, drift).latency_ms for o in options}


@pytest.mark.parametrize("inflight", [1, 3])
def test_run_adapts_to_a_device_slowed_mid_run_and_loses_nothing(build, options, inflight):
    """The whole loop under emulation: the run switches once, within WINDOW + 2 requests (+ those in flight,
    which finish on the old plan), to the plan the brute-force re-costing says, every output verified and in
    order."""
    _, a, brute = _slowed_run(build, options, inflight)
    assert a["to"] == min(brute, key=brute.get)
    assert 8 <= a["switched_at"] <= 8 + WINDOW + 2 + inflight


@pytest.mark.slow  # a wall-clock bound: a busy machine overruns the emulation's padding
def test_after_the_switch_requests_take_about_the_new_plans_time(build, options):
    report, a, brute = _slowed_run(build, options, 1)
    after = report["latencies_ms"][a["switched_at"] + 1:]
    assert sorted(after)[len(after) // 2] < brute[a["to"]] * 1.5  # a loose bound: the host is shared


def test_bad_adapt_and_slow_options_are_one_line_exit_2(build, tmp_path):
    run = CliRunner()
    bare = tmp_path / "bare"
    res = CliRunner().invoke(cli, ["compile", str(TINYCONV), "--devices", str(_cluster(tmp_path, PROFILES)), "-o",
                                   str(bare)])
    assert res.exit_code == 0, res.output
    cases = [
        ([str(build), "--random-inputs", "--slow", "f=3@2"], "--slow emulates a device slowing down: it needs --emulate"),
        ([str(build), "--random-inputs", "--emulate", "--slow", "nope=3"], "has no device 'nope'"),
        ([str(build), "--random-inputs", "--emulate", "--slow", "f=three"], "expected NAME=FACTOR or NAME=FACTOR@REQUEST"),
        ([str(build), "--random-inputs", "--emulate", "--slow", "f=0"], "factor 0.0, expected"),
        ([str(build), "--random-inputs", "--emulate", "--slow", "f=2@-1"], "expected a timed request's index"),
        ([str(build), "--random-inputs", "--adapt", "--adapt-threshold", "0"], "--adapt-threshold 0.0"),
        ([str(bare), "--random-inputs", "--adapt"], "kept none; compile with --keep N, --shifts and/or --fallbacks"),
    ]
    for args, message in cases:
        res = run.invoke(cli, ["run", *args])
        assert res.exit_code == 2, (args, res.output)
        assert res.stderr.count("\n") == 1 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_parse_slow():
    assert parse_slow(["a=3@50", "b=0.5"]) == {"a": (50, 3.0), "b": (0, 0.5)}
    with pytest.raises(InputError, match="given twice"):
        parse_slow(["a=3", "a=2"])


def test_run_messages_carry_a_checked_slow_down():
    class Frame:
        def __init__(self, data: bytes):
            self.buffer = memoryview(data)

    assert parse([Frame(pack({"t": "run", "req": 3, "slow": 3.0}))], {"run"})[0]["slow"] == 3.0
    for bad in ({"t": "run", "req": 3}, {"t": "run", "req": 3, "slow": 0.0}, {"t": "run", "req": 3, "slow": float("nan")}):
        with pytest.raises(BadMessage):
            parse([Frame(pack(bad))], {"run"})


def test_the_json_lists_no_adaptations_without_adapt(build):
    report = edgec.run(build, random_inputs=True, repeat=2)
    assert report["adaptations"] == []
    json.dumps(report)


def test_fallbacks_are_plans_to_adapt_to(tmp_path):
    """A fallback is the plan for the cluster without one device: when that device is slow rather than gone."""
    from edgec.runtime.coordinator.adapt import kept_plans as _adapter

    out = tmp_path / "build"
    res = CliRunner().invoke(cli, ["compile", str(TINYCONV), "--devices", str(_cluster(tmp_path, PROFILES)), "-o",
                                   str(out), "--strategy", "pipeline", "--objective", "throughput", "--fallbacks"])
    assert res.exit_code == 0, res.output
    m = load_manifest(out / "manifest.json")
    labels = [o.label for o in _adapter(m, 0.25, None).options]
    assert labels[0] == "manifest.json" and labels[1:] == [fb.manifest for fb in m.fallbacks if fb.manifest]
    assert len(labels) > 1


def test_a_device_lost_after_an_adaptation_still_fails_over(tmp_path, monkeypatch):
    """--adapt may have switched to a kept plan; the fallback without a lost device runs on devices that are
    all still there whichever plan was in use, so the run fails over from it (it used to crash looking for an
    earlier failover)."""
    from types import SimpleNamespace

    from edgec.runtime.coordinator.liveness import DeviceLost
    from edgec.runtime.coordinator.failover import FailoverPool

    out = tmp_path / "build"
    res = CliRunner().invoke(cli, ["compile", str(TINYCONV), "--devices", str(_cluster(tmp_path, PROFILES)), "-o",
                                   str(out), "--strategy", "pipeline", "--objective", "throughput", "--fallbacks",
                                   "--keep", "50"])
    assert res.exit_code == 0, res.output
    main = load_manifest(out / "manifest.json")
    fallbacks = {fb.without: fb for fb in main.fallbacks if fb.manifest}
    alt = next(m for m in (load_alternative(main, a) for a in main.alternatives)
               if any(d in fallbacks for d in m.device_names if m.steps.get(d)))
    lost = next(d for d in alt.device_names if alt.steps.get(d) and d in fallbacks)
    fc = FailoverPool(main)
    opened = []
    monkeypatch.setattr(fc, "_open", lambda manifest, addresses: opened.append(manifest) or SimpleNamespace(manifest=manifest))
    fc.cluster = SimpleNamespace(manifest=alt, timeout=1.0, close=lambda grace: None, device_report=lambda: {})
    fc._switch(DeviceLost(lost, f"device {lost} is gone"), pending=2)
    assert [m.path for m in opened] == [(out / fallbacks[lost].manifest).absolute()]
    assert fc.failovers == [{"device": lost, "at_request": 0, "plan": str(opened[0].path)}]
    with pytest.raises(DeviceLost, match="already switched to the fallback plan"):  # one failover per run
        fc._switch(DeviceLost(lost, "again"), pending=0)
