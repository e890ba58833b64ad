"""`edgec compile --keep N`: the best N other plans of the Pareto frontier, each a complete build of its own in
OUTDIR/alt-<k>/, named by the main manifest's `alternatives` (sha256, strategy, predictions), listed by --json
and `edgec inspect`, run by the runtime like any build; all written or none; without --keep nothing changes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgec
from edgec.compiler.cli import cli
from edgec.compiler.driver import build_alternatives, compile_model
from edgec.compiler.plan.choose import _key
from edgec.compiler.emit import output
from edgec.compiler.errors import UserError
from edgec.compiler.plan.frontier import plan_key
from edgec.compiler.plan.planner import EnergyGoal, PlanOptions
from edgec.runtime.errors import InputError
from edgec.runtime.manifest.load import load_fallback, load_manifest, parse_manifest
from tests.compiler.test_pareto import PROFILES, TINY, _cluster


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    """Three devices with a real latency / throughput / energy trade-off (see test_pareto.py)."""
    return _cluster(tmp_path_factory.mktemp("three"), PROFILES)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def stages(manifest: dict) -> list:
    return [(s["device"], [s["lo"], s["hi"]]) for s in manifest["plan"]["stages"]]


def test_keep_writes_the_next_best_plans_as_builds_the_runtime_runs(three, tmp_path):
    out = tmp_path / "build"
    res = compile_model(TINY, three, out, keep=2)
    data = json.loads((out / "manifest.json").read_text())
    entries = data["alternatives"]
    assert [e["manifest"] for e in entries] == ["alt-1/manifest.json", "alt-2/manifest.json"]
    expected = {"manifest.json", *(f["file"] for f in data["fragments"])}
    plans = [stages(data)]
    for entry in entries:
        text = (out / entry["manifest"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(text).hexdigest()
        sub = json.loads(text)
        assert entry["strategy"] == sub["plan"]["strategy"]
        assert entry["predicted"] == {k: sub["predicted"][k] for k in ("latency_ms", "throughput_ips", "energy_mj")}
        assert "alternatives" not in sub and "fallbacks" not in sub
        plans.append(stages(sub))
        folder = entry["manifest"].split("/")[0]
        expected |= {f"{folder}/manifest.json", *(f"{folder}/{f['file']}" for f in sub["fragments"])}
    assert set(snapshot(out)) == expected  # each alternative is a complete build folder, nothing else
    assert len({json.dumps(p) for p in plans}) == 3, plans  # three different plans

    # the frontier's plans other than the chosen one, best first by the objective's own order
    front = compile_model(TINY, three, tmp_path / "p", pareto=True).pareto
    best = sorted((p for p in front if plan_key(p.plan) != plan_key(res.chosen.plan)), key=lambda p: _key(p, "latency"))
    assert [(e["predicted"]["latency_ms"], e["predicted"]["throughput_ips"]) for e in entries] == \
        [(round(p.latency_ms, 4), round(p.throughput_ips, 4)) for p in best[:2]]
    assert res.chosen.prediction.latency_ms <= best[0].latency_ms

    for entry in entries:
        path = out / entry["manifest"]
        load_manifest(path)  # every fragment file present with its sha256
        report = edgec.run(path, random_inputs=True, verify=True)
        assert report["verify"]["passed"], report["verify"]


def test_a_huge_keep_writes_what_the_frontier_has_and_says_so(three, tmp_path):
    others = len(compile_model(TINY, three, tmp_path / "p", pareto=True).pareto) - 1
    summary = edgec.compile(TINY, three, tmp_path / "build", keep=50)
    assert 2 <= len(summary["alternatives"]) == others
    assert summary["alternatives_missing"] == 50 - others
    assert sorted(p.name for p in (tmp_path / "build").iterdir() if p.is_dir()) == \
        [f"alt-{k}" for k in range(1, others + 1)]
    res = CliRunner().invoke(cli, ["compile", str(TINY), "--devices", str(three), "-o", str(tmp_path / "cli"),
                                   "--keep", "50"], prog_name="edgec")
    assert res.exit_code == 0, res.output
    assert f"--keep 50: only {others} other plan(s) of the frontier qualify (within any hard SLA); wrote those" in res.stderr
    assert f"--keep: {50 - others} fewer alternative(s) than asked" in res.stdout


def test_energy_alternatives_are_least_energy_first_and_within_a_hard_sla(three, tmp_path):
    res = compile_model(TINY, three, tmp_path / "build", objective="energy",
                        options=PlanOptions(energy=EnergyGoal(100.0)), keep=50)
    predicted = [b.info["predicted"] for b in res.alternatives]
    assert len(predicted) >= 3 and res.alternatives_missing == 50 - len(predicted)
    energies = [p["energy_mj"] for p in predicted]
    assert energies == sorted(energies) and res.chosen.prediction.energy_mj <= energies[0]

    # the same frontier under a tighter SLA: the plans beyond it are no alternatives
    front = compile_model(TINY, three, tmp_path / "p", objective="energy", options=PlanOptions(energy=EnergyGoal(100.0)),
                          pareto=True).pareto
    tight = EnergyGoal(10.0)
    beyond = [p for p in front if p.latency_ms > tight.sla_ms and plan_key(p.plan) != plan_key(res.chosen.plan)]
    assert beyond  # the test needs plans that the SLA leaves out
    builds = build_alternatives(res.ingested, res.cluster, res.cost, res.chosen, res.candidates, front, 50, "energy",
                                PlanOptions(energy=tight), tmp_path / "tight")
    within = sorted((p for p in front if p.latency_ms <= tight.sla_ms and plan_key(p.plan) != plan_key(res.chosen.plan)),
                    key=lambda p: p.energy_mj)
    assert [b.info["predicted"]["latency_ms"] for b in builds] == [round(p.latency_ms, 4) for p in within]
    assert within


def test_alternatives_record_the_power_modes_they_need(tmp_path):
    cluster = tmp_path / "cluster.yaml"  # shipped profiles: the Orin has power modes
    cluster.write_text("devices:\n  - {name: laptop, profile: laptop}\n  - {name: orin, profile: jetson-orin-nano-cuda}\n"
                       "  - {name: phone-a, profile: phone}\nnetwork: {bandwidth_mbps: 200, latency_ms: 1, medium: shared}\n")
    options = PlanOptions(energy=EnergyGoal(50.0))
    res = compile_model(TINY, cluster, tmp_path / "build", objective="energy", options=options, keep=50)
    front = compile_model(TINY, cluster, tmp_path / "p", objective="energy", options=options, pareto=True).pareto
    modes = []
    for b in res.alternatives:
        pred = b.info["predicted"]
        [point] = [p for p in front if (round(p.latency_ms, 4), round(p.energy_mj, 4)) ==
                   (pred["latency_ms"], pred["energy_mj"])]
        recorded = {d["name"]: d["mode"] for d in b.manifest["devices"] if d.get("mode")}
        assert dict(point.plan.modes).items() <= recorded.items(), (recorded, point.plan)
        modes.append(recorded.get("orin"))
    assert len(set(modes)) >= 2, modes  # alternatives that differ only in the Orin's power mode


def test_rebuild_over_a_build_with_alternatives_is_accepted_and_identical(three, tmp_path):
    out = tmp_path / "build"
    edgec.compile(TINY, three, out, keep=2)
    first = snapshot(out)
    edgec.compile(TINY, three, out, keep=2)  # over the earlier build, alternative folders included: allowed
    assert snapshot(out) == first

    (out / "alt-2" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="'alt-2/notes.txt' which is not part of the earlier edgec build"):
        edgec.compile(TINY, three, out, keep=2)
    (out / "alt-2" / "notes.txt").unlink()
    (out / "alt-9").mkdir()  # a folder the manifest does not name is the user's
    with pytest.raises(UserError, match="'alt-9'"):
        edgec.compile(TINY, three, out, keep=2)
    (out / "alt-9").rmdir()
    assert snapshot(out) == first  # the refused compiles changed nothing

    edgec.compile(TINY, three, out, keep=1)  # fewer alternatives: the old alt-2 goes
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["alt-1"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary or old folder left


def test_a_failure_while_writing_an_alternative_leaves_nothing(three, tmp_path, monkeypatch):
    out = tmp_path / "build"
    real = output._write_build

    def failing(folder, final, manifest, frags):
        if folder.name == "alt-2":
            raise OSError(28, "No space left on device")
        real(folder, final, manifest, frags)

    monkeypatch.setattr(output, "_write_build", failing)
    with pytest.raises(UserError, match="cannot write the build: No space left on device"):
        edgec.compile(TINY, three, out, keep=2)
    assert not list(tmp_path.iterdir())  # neither OUTDIR nor a temporary folder

    monkeypatch.setattr(output, "_write_build", real)
    edgec.compile(TINY, three, out)
    before = snapshot(out)
    monkeypatch.setattr(output, "_write_build", failing)
    with pytest.raises(UserError, match="No space left on device"):
        edgec.compile(TINY, three, out, keep=2)
    assert snapshot(out) == before  # the earlier build stands, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["build"]


def test_without_keep_the_build_is_unchanged(three, tmp_path):
    plain = edgec.compile(TINY, three, tmp_path / "a")
    kept = edgec.compile(TINY, three, tmp_path / "b", keep=1)
    assert plain["alternatives"] == [] and plain["alternatives_missing"] == 0 and len(kept["alternatives"]) == 1
    a, b = snapshot(tmp_path / "a"), snapshot(tmp_path / "b")
    assert "alternatives" not in json.loads(a["manifest.json"]) and not [p for p in (tmp_path / "a").iterdir() if p.is_dir()]
    main = json.loads(b.pop("manifest.json"))
    del main["alternatives"]
    assert output.manifest_text(main).encode() == a.pop("manifest.json")
    assert {k: v for k, v in b.items() if not k.startswith("alt-1/")} == a  # the same fragments, byte for byte


def test_fallbacks_and_keep_together(three, tmp_path):
    out = tmp_path / "build"
    summary = edgec.compile(TINY, three, out, keep=1, fallbacks=True)
    main = load_manifest(out / "manifest.json")
    assert [a.manifest for a in main.alternatives] == ["alt-1/manifest.json"]
    assert main.fallbacks and all(fb.manifest for fb in main.fallbacks)
    for fb in main.fallbacks:
        load_fallback(main, fb)
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == sorted(["alt-1", *(f"fallback-{fb.without}" for fb in main.fallbacks)])
    assert summary["alternatives"][0]["manifest"] == str(out / "alt-1" / "manifest.json")
    first = snapshot(out)
    edgec.compile(TINY, three, out, keep=1, fallbacks=True)
    assert snapshot(out) == first


def test_cli_json_inspect_and_bad_keep(three, tmp_path):
    out = tmp_path / "build"
    runner = CliRunner()
    res = runner.invoke(cli, ["compile", str(TINY), "--devices", str(three), "-o", str(out), "--keep", "0"],
                        prog_name="edgec")
    assert res.exit_code == 2 and not out.exists()
    assert "--keep" in res.stderr and "0 is not in the range x>=1" in res.stderr
    with pytest.raises(UserError, match="keep 0: expected a positive integer"):
        edgec.compile(TINY, three, out, keep=0)

    res = runner.invoke(cli, ["compile", str(TINY), "--devices", str(three), "-o", str(out), "--keep", "2", "--json"])
    assert res.exit_code == 0, res.output
    listed = json.loads(res.stdout)["alternatives"]
    assert [a["manifest"] for a in listed] == [str(out / f"alt-{k}" / "manifest.json") for k in (1, 2)]
    assert all(a["predicted_latency_ms"] > 0 and a["devices"] for a in listed)

    res = runner.invoke(cli, ["inspect", str(out / "manifest.json"), "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)["alternatives"]
    assert [(a["manifest"], a["strategy"], a["devices"], a["error"]) for a in shown] == \
        [(f"alt-{k}/manifest.json", a["strategy"], a["devices"], None) for k, a in zip((1, 2), listed)]
    res = runner.invoke(cli, ["inspect", str(out / "manifest.json")])
    assert res.exit_code == 0 and "alternative plans" in res.stdout and "alt-2/manifest.json" in res.stdout

    changed = out / "alt-1" / "manifest.json"  # changed after compiling: shown as broken
    changed.write_text(changed.read_text().replace('"latency_ms"', '"latency_ms" ', 1))
    res = runner.invoke(cli, ["inspect", str(out / "manifest.json"), "--json"])
    assert res.exit_code == 0, res.output
    broken = json.loads(res.stdout)["alternatives"][0]
    assert "sha256 mismatch" in broken["error"] and "devices" not in broken


GOOD = {"manifest": "alt-1/manifest.json", "sha256": "a" * 64, "strategy": "pipeline",
        "predicted": {"latency_ms": 1.0, "throughput_ips": 2.0, "energy_mj": None}}


@pytest.mark.parametrize("entries, problem", [
    ("alt-1", "alternatives: expected a list"),
    ([GOOD | {"manifest": "../alt-1/manifest.json"}], "is not a path inside the build folder"),
    ([GOOD | {"sha256": "xyz"}], "alternatives[0].sha256: expected 64 hexadecimal digits"),
    ([{k: v for k, v in GOOD.items() if k != "strategy"}], "alternatives[0]: missing key 'strategy'"),
    ([GOOD | {"predicted": {"latency_ms": 1.0, "throughput_ips": 2.0}}], "missing key 'energy_mj'"),
    ([GOOD | {"predicted": GOOD["predicted"] | {"latency_ms": -1}}], "latency_ms: expected a finite number >= 0"),
    ([GOOD, GOOD], "alternatives: two entries name 'alt-1/manifest.json'"),
])
def test_bad_alternative_entries_are_refused(three, tmp_path, entries, problem):
    edgec.compile(TINY, three, tmp_path / "build")
    data = json.loads((tmp_path / "build" / "manifest.json").read_text())
    assert parse_manifest(data | {"alternatives": [GOOD]}, tmp_path / "m.json").alternatives[0].predicted == \
        GOOD["predicted"]
    with pytest.raises(InputError) as err:
        parse_manifest(data | {"alternatives": entries}, tmp_path / "m.json")
    assert problem in str(err.value)
