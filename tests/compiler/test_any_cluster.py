"""No cluster built from the shipped profiles ends a compile in an internal error (issue 37).

Hypothesis draws clusters of 1-6 devices with replacement from every profile under profiles/ (so alike
devices and power modes occur together), with random `memory_mb` overrides, `threads` 1/2, a `hosts:`
machine that some devices share, a per-link override, a switched or a shared medium; and crosses them
with every strategy and every objective (latency, throughput, energy under an SLA, `--pareto`, `--keep`)
on the small models of models/. Each compile must end in a plan (exit 0) or a one-line refusal (exit 2):
never exit 3, never a traceback. Every build it writes (the alternatives of `--keep` too) must pass the
runtime's manifest parser, and a sample of them, one per strategy, runs with `--verify` on local workers
(split equals whole).

Derandomised and bounded for README's test command; the slow set draws many more.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import edgec
from edgec.compiler.cli import cli
from edgec.compiler.cluster.profile import available_profiles
from edgec.compiler.plan.registry import STRATEGIES
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.manifest.types import OBJECTIVES


MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
PROFILES = sorted(available_profiles())
assert len(PROFILES) >= 8, PROFILES  # every shipped profile
SMALL = ("tinyconv", "tinychain", "tinytransformer", "squeezenet")
GOALS = (*OBJECTIVES, "pareto", "keep")  # every objective, then --pareto and --keep
_verified: set[str] = set()  # the strategies a build has been run with --verify for, in this session


@st.composite
def clusters(draw) -> dict:
    n = draw(st.integers(1, 6))
    shared = draw(st.booleans())
    # devices drawn with replacement from a palette of 1-3 profiles, so that alike devices are common
    palette = draw(st.lists(st.sampled_from(PROFILES), min_size=1, max_size=3, unique=True))
    devices = []
    for i in range(n):
        doc = {"name": f"dev{i}", "profile": draw(st.sampled_from(palette))}
        if draw(st.integers(0, 3)) == 0:  # mostly enough memory to plan, sometimes too little
            doc["memory_mb"] = draw(st.sampled_from([96, 512, 1536, 2048, 4096]))
        if draw(st.booleans()):
            doc["threads"] = draw(st.sampled_from([1, 2]))
        if shared and draw(st.booleans()):
            doc["host"] = "box"
        devices.append(doc)
    network = {"bandwidth_mbps": draw(st.sampled_from([5, 100, 1000])),
               "latency_ms": draw(st.sampled_from([0, 0.5, 4])),
               "medium": draw(st.sampled_from(["switched", "shared"]))}
    if n > 1 and draw(st.booleans()):
        a, b = draw(st.permutations(range(n)))[:2]
        network["links"] = [{"a": f"dev{a}", "b": f"dev{b}", "bandwidth_mbps": draw(st.sampled_from([1, 50, 2000])),
                             "latency_ms": draw(st.sampled_from([0, 10]))}]
    doc = {"devices": devices, "network": network}
    if any("host" in d for d in devices):
        doc["hosts"] = {"box": {"cores": draw(st.sampled_from([1, 2, 4])), "coordinator": draw(st.booleans())}}
    return doc


# issue 37's cluster: power modes (the Jetson's) beside alike devices (the phones)
MIXED = {"devices": [{"name": "laptop", "profile": "laptop"}, {"name": "orin", "profile": "jetson-orin-nano-cuda"},
                     {"name": "phone-a", "profile": "phone"}, {"name": "phone-b", "profile": "phone"}],
         "network": {"bandwidth_mbps": 200, "latency_ms": 1}}


def _objective_args(objective: str, sla_ms: float) -> list[str]:
    if objective == "energy":
        return ["--objective", "energy", "--sla-ms", f"{sla_ms:g}"]
    if objective == "pareto":
        return ["--pareto"]
    if objective == "keep":
        return ["--keep", "2"]
    return ["--objective", objective]


def _check_compile(tmp: Path, cluster: dict, model: str, strategy: str, objective: str, sla_ms: float) -> None:
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster))
    out = tmp / "build"
    args = ["compile", str(MODELS / f"{model}.onnx"), "--devices", str(path), "-o", str(out), "--strategy", strategy,
            "--json", *_objective_args(objective, sla_ms)]
    res = CliRunner().invoke(cli, args, prog_name="edgec")
    context = f"edgec {' '.join(args)}\n{yaml.safe_dump(cluster)}"
    assert res.exit_code in (0, 2), f"exit {res.exit_code}: {res.output}\n{context}"
    assert "Traceback" not in res.stderr, context
    if res.exit_code == 2:
        errors = [line for line in res.stderr.splitlines() if line.startswith("edgec: ") and ": " in line[7:]]
        assert res.stdout == "" and errors and errors[-1] == res.stderr.rstrip("\n").splitlines()[-1], context
        assert not out.exists(), f"a refused compile left {out} behind\n{context}"
        return
    summary = json.loads(res.stdout)
    builds = [out] + sorted(p for p in out.glob("alt-*") if p.is_dir())
    for build in builds:
        load_manifest(build / "manifest.json")  # the runtime's own parser accepts what the compiler wrote
    if strategy not in _verified:
        _verified.add(strategy)
        report = edgec.run(out, random_inputs=True, verify=True, timeout=60)
        assert report["verify"]["passed"], (report["verify"], context)
    assert summary["strategy"] in STRATEGIES, context


@given(cluster=clusters(), model=st.sampled_from(SMALL), strategy=st.sampled_from(STRATEGIES),
       objective=st.sampled_from(GOALS), sla_ms=st.sampled_from([2.0, 20.0, 500.0]))
@example(cluster=MIXED, model="tinychain", strategy="pipeline", objective="energy", sla_ms=20.0)
@example(cluster=MIXED, model="squeezenet", strategy="auto", objective="pareto", sla_ms=20.0)
@settings(derandomize=True, max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_any_cluster_compiles_or_refuses_in_one_line(tmp_path_factory, cluster, model, strategy, objective, sla_ms):
    _check_compile(tmp_path_factory.mktemp("any"), cluster, model, strategy, objective, sla_ms)


@pytest.mark.slow
@given(cluster=clusters(), model=st.sampled_from(SMALL), strategy=st.sampled_from(STRATEGIES),
       objective=st.sampled_from(GOALS), sla_ms=st.sampled_from([2.0, 20.0, 500.0]))
@settings(derandomize=True, max_examples=600, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_any_cluster_compiles_or_refuses_in_one_line_long(tmp_path_factory, cluster, model, strategy, objective,
                                                          sla_ms):
    _check_compile(tmp_path_factory.mktemp("any"), cluster, model, strategy, objective, sla_ms)
