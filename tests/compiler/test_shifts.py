"""`edgec compile --shifts`: the chosen plan's one-layer boundary shifts (DGPAS's adjacent scheduling) as
alternative builds after --keep's, each entry with a `variant` saying what moved; spatial boundaries stay,
no stage empties, every variant fits memory and differs from the plans kept."""

from __future__ import annotations

import json
import re
import os
from dataclasses import replace
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import edgec
from edgec.compiler.cli import cli
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.driver import compile_model
from edgec.compiler.errors import UserError
from edgec.compiler.ingest import load_model
from edgec.compiler.plan.shifts import boundary_shifts
from edgec.compiler.plan_types import Plan, Segment, SpatialGroup, Stage, Tile
from edgec.compiler.progress import LineProgress
from edgec.compiler.units import MiB
from edgec.runtime.manifest.load import load_alternative, load_manifest
from tests.compiler.test_pareto import PROFILES, _cluster
from tests.conftest import conv_chain_model

TINYCONV = Path(os.environ["EDGEC_MODELS_DIR"]) / "tinyconv.onnx"


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    """Three slow devices (test_pareto.py): the throughput-optimal pipeline of tinyconv has three stages."""
    return _cluster(tmp_path_factory.mktemp("three"), PROFILES)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """conv0 conv1 conv2 conv3 flatten fc (layers 0-5) and its cost table on the three devices f, m, s."""
    folder = tmp_path_factory.mktemp("chain")
    onnx.save(conv_chain_model(), folder / "chain.onnx")
    ing = load_model(folder / "chain.onnx")
    cluster = load_cluster(_cluster(folder, PROFILES))
    return ing.graph, build_cost_table(ing.graph, cluster, ing.sha256, model=ing.model)


def _plan(*spans) -> Plan:
    return Plan("pipeline", "throughput", tuple(Stage(d, lo, hi) for d, lo, hi in spans))


def _spans(plan: Plan) -> list[tuple]:
    return [(s.device, s.lo, s.hi) for s in plan.stages]


def _moved_layers(a: Plan, b: Plan) -> set[int]:
    """The layers that run on another device in b than in a."""
    return {i for i, (x, y) in enumerate(zip(a.stage_of_layer(), b.stage_of_layer()))
            if a.stages[x].device != b.stages[y].device}


def test_every_boundary_moves_one_layer_each_way(chain):
    graph, cost = chain
    plan = _plan(("f", 0, 2), ("m", 2, 4), ("s", 4, 6))
    shifts = boundary_shifts(plan, graph, cost)
    assert [_spans(s.plan) for s in shifts] == [
        [("f", 0, 1), ("m", 1, 4), ("s", 4, 6)], [("f", 0, 3), ("m", 3, 4), ("s", 4, 6)],
        [("f", 0, 2), ("m", 2, 3), ("s", 3, 6)], [("f", 0, 2), ("m", 2, 5), ("s", 5, 6)]]
    assert [s.description for s in shifts] == [
        "shift stage 0|1 boundary -1 layer (layer 1 'conv1' to m)",
        "shift stage 0|1 boundary +1 layer (layer 2 'conv2' to f)",
        "shift stage 1|2 boundary -1 layer (layer 3 'conv3' to s)",
        "shift stage 1|2 boundary +1 layer (layer 4 'flatten' to m)"]
    for s, layer in zip(shifts, (1, 2, 3, 4)):
        assert _moved_layers(plan, s.plan) == {layer}  # one layer, across one boundary
        assert s.plan.ensures(graph) and (s.plan.strategy, s.plan.objective) == (plan.strategy, plan.objective)


def test_a_shift_never_empties_a_stage(chain):
    graph, cost = chain
    first_alone = _plan(("f", 0, 1), ("m", 1, 3), ("s", 3, 6))  # stage 0 cannot give its only layer
    assert [s.description for s in boundary_shifts(first_alone, graph, cost)] == [
        "shift stage 0|1 boundary +1 layer (layer 1 'conv1' to f)",
        "shift stage 1|2 boundary -1 layer (layer 2 'conv2' to s)",
        "shift stage 1|2 boundary +1 layer (layer 3 'conv3' to m)"]
    middle_alone = _plan(("f", 0, 2), ("m", 2, 3), ("s", 3, 6))  # stage 1 can only take a layer
    assert [s.description for s in boundary_shifts(middle_alone, graph, cost)] == [
        "shift stage 0|1 boundary -1 layer (layer 1 'conv1' to m)",
        "shift stage 1|2 boundary +1 layer (layer 3 'conv3' to m)"]
    assert boundary_shifts(_plan(("f", 0, 6)), graph, cost) == []  # one stage: no boundary


def test_spatial_boundaries_stay(chain):
    graph, cost = chain
    tiled = Stage("f", 0, 2, SpatialGroup(2, (Segment(0, 2, (Tile("f", 0, 8), Tile("m", 8, 16))),)))
    plan = Plan("hybrid", "latency", (tiled, Stage("m", 2, 4), Stage("s", 4, 6))).ensures(graph)
    shifts = boundary_shifts(plan, graph, cost)
    assert [s.description for s in shifts] == ["shift stage 1|2 boundary -1 layer (layer 3 'conv3' to s)",
                                               "shift stage 1|2 boundary +1 layer (layer 4 'flatten' to m)"]
    assert all(s.plan.stages[0] is tiled for s in shifts)


def test_a_shift_that_does_not_fit_memory_or_was_kept_is_left_out(chain):
    graph, cost = chain
    plan = _plan(("f", 0, 2), ("m", 2, 4), ("s", 4, 6))
    # s holds flatten + fc (81,920 bytes of weights + 16,384 of activations) but not conv3's 2,336 more
    s = cost.cluster.device("s")
    room = 99_500
    small = replace(s, memory_mb=(room / MiB + s.profile.runtime_overhead_mb) / s.profile.usable_memory_fraction)
    assert 81_920 + 16_384 <= small.usable_bytes < 81_920 + 2_336 + 16_384
    tight = replace(cost, cluster=replace(cost.cluster, devices=tuple(small if d.name == "s" else d
                                                                      for d in cost.cluster.devices)))
    described = [x.description for x in boundary_shifts(plan, graph, tight)]
    assert "shift stage 1|2 boundary -1 layer (layer 3 'conv3' to s)" not in described and len(described) == 3

    kept = _plan(("f", 0, 3), ("m", 3, 4), ("s", 4, 6))
    described = [x.description for x in boundary_shifts(plan, graph, cost, kept=[kept])]
    assert "shift stage 0|1 boundary +1 layer (layer 2 'conv2' to f)" not in described and len(described) == 3


def test_a_shift_keeps_the_power_modes(chain):
    graph, cost = chain
    plan = Plan("pipeline", "latency", _plan(("f", 0, 3), ("m", 3, 6)).stages, modes=(("m", "low"),))
    shifts = boundary_shifts(plan, graph, cost)
    assert len(shifts) == 2 and all(s.plan.modes == plan.modes for s in shifts)


@pytest.fixture(scope="module")
def shifted(three, tmp_path_factory) -> tuple[Path, dict, str]:
    """tinyconv compiled as a pipeline for throughput with --keep 50 (more than the frontier has) and
    --shifts, through the CLI (--json)."""
    out = tmp_path_factory.mktemp("shifted") / "build"
    res = CliRunner().invoke(cli, ["compile", str(TINYCONV), "--devices", str(three), "-o", str(out), "--strategy",
                                   "pipeline", "--objective", "throughput", "--keep", "50", "--shifts", "--json"])
    assert res.exit_code == 0, res.output
    return out, json.loads(res.stdout), res.stderr


def test_shifts_are_written_after_keep_and_each_runs_as_the_whole_model(shifted):
    out, summary, stderr = shifted
    main = load_manifest(out / "manifest.json")
    chosen = [(s["device"], s["layers"]) for s in summary["stages"]]
    assert len(chosen) >= 2
    n = sum(1 for a in main.alternatives if a.variant is None)
    kept, shifts = main.alternatives[:n], main.alternatives[n:]
    assert kept and all(a["variant"] is None for a in summary["alternatives"][:n])
    assert summary["alternatives_missing"] == 50 - n  # the shifts do not count as --keep's plans
    assert f"--keep 50: only {n} other plan(s) of the frontier qualify" in stderr
    assert shifts and [a.manifest for a in shifts] == [f"alt-{k}/manifest.json" for k in range(n + 1, n + len(shifts) + 1)]
    for alt, listed in zip(shifts, summary["alternatives"][n:]):
        assert alt.variant.startswith("shift stage ") and listed["variant"] == alt.variant
        assert f"alternative {alt.manifest.split('/')[0]}: {alt.variant}, latency" in stderr  # the progress note
        m = load_alternative(main, alt, check_files=True)
        stages = [(s["device"], [s["lo"], s["hi"]]) for s in json.loads(m.path.read_text())["plan"]["stages"]]
        assert [d for d, _ in stages] == [d for d, _ in chosen]  # same devices, one boundary one layer off
        (was, now), (was_next, now_next) = [(a, b) for (_, a), (_, b) in zip(chosen, stages) if a != b]
        assert abs(was[1] - now[1]) == 1 and now[1] == now_next[0] and was[1] == was_next[0]
        report = edgec.run(m.path, random_inputs=True, verify=True)  # against the whole model in onnxruntime
        assert report["verify"]["passed"], report["verify"]


def test_inspect_and_compile_text_show_the_variant(shifted, three, tmp_path, monkeypatch):
    out, summary, _ = shifted
    variant = summary["alternatives"][-1]["variant"]
    runner = CliRunner()
    res = runner.invoke(cli, ["inspect", str(out / "manifest.json"), "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)["alternatives"]
    assert [a["variant"] for a in shown] == [a["variant"] for a in summary["alternatives"]]
    assert all(a["error"] is None and a["devices"] for a in shown)
    res = runner.invoke(cli, ["inspect", str(out / "manifest.json")])
    assert res.exit_code == 0 and _shown(variant, res.stdout)

    monkeypatch.chdir(tmp_path)  # a short OUTDIR ("b"), whose paths fit the table's column unwrapped
    res = runner.invoke(cli, ["compile", str(TINYCONV), "--devices", str(three), "-o", "b",
                              "--strategy", "pipeline", "--objective", "throughput", "--shifts"])
    assert res.exit_code == 0, res.output
    assert _shown(variant, res.stdout) and "alt-1/manifest.json" in res.stdout  # without --keep, shifts start at alt-1


def _shown(text: str, table: str) -> bool:
    """`text` in a table's cell, which may wrap at its spaces onto further lines (tables fit 100 columns)."""
    return re.search(r"\s+(?:.*\n\s*)?".join(map(re.escape, text.split())), table) is not None


def test_shifts_of_a_one_stage_plan_write_nothing_and_say_so(three, tmp_path):
    notes: list[str] = []
    res = compile_model(TINYCONV, three, tmp_path / "build", strategy="single", shifts=True,
                        progress=LineProgress(notes.append))
    assert res.alternatives == () and res.alternatives_missing == 0
    assert json.loads((tmp_path / "build" / "manifest.json").read_text())["alternatives"] == []
    assert any(line.startswith("edgec: --shifts: no boundary shift qualifies") for line in notes)
    with pytest.raises(UserError, match="shifts 'yes': expected True or False"):
        edgec.compile(TINYCONV, three, tmp_path / "other", shifts="yes")
