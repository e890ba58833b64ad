"""The profile schema's new optional fields (threads, op_ms_per_melem, efficiency, measurement): a bad value
is one line and exit 2 through `edgec compile`; a real quick profile is accepted end to end."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from edgec import models
from edgec.compiler.cli import cli
from edgec.compiler.cluster import load_profile, validate_profile_dict
from tests.compiler.profile_scripted import script_runtime_costs, script_timings

ROOT = Path(__file__).resolve().parents[2]
FIGURES = {
    "op_overhead_us": 5.0,
    "gflops": {"conv": 70.0, "depthwise_conv": 20.0, "gemm": 60.0, "other": 30.0},
    "memory_gbps": 12.0,
    "op_ms_per_melem": {"LRN": 25.0, "Softmax": 0.5, "Resize:linear": 1.4},
    "efficiency": {"conv": [[1792, 0.6], [7168, 0.9], [401408, 1.0]], "gemm": [[8192, 0.5], [524288, 1.0]]},
}
TIMING = {"runs": 9, "median_ms": 13.1, "spread": 0.04, "stable": True, "loadavg_1m": 0.3, "other_cpus": 0.02}
GOOD = {
    "name": "me", "memory_mb": 4096, "usable_memory_fraction": 0.8, "runtime_overhead_mb": 90,
    **copy.deepcopy(FIGURES),
    "threads": {1: copy.deepcopy(FIGURES), 2: copy.deepcopy(FIGURES)},
    "measurement": {
        "max_spread": 0.1, "window": 7, "max_seconds": 1.5,
        "load": {"cpus": 2, "busy_rule": "...", "verdict": "quiet",
                 "before": {"seconds": 0.5, "other_cpus": 0.01, "loadavg": [0.1, 0.2, 0.3]},
                 "during": {"seconds": 20.0, "other_cpus": None, "loadavg": None}},
        "threads": {1: {"gflops.conv": dict(TIMING)}},
        "warnings": [],
    },
}


def test_good_profile_loads_with_per_thread_figures(tmp_path):
    p = validate_profile_dict(copy.deepcopy(GOOD), "me.yaml")
    assert sorted(p.threads) == [1, 2] and p.threads[1].gflops["conv"] == 70.0
    assert p.op_ms_per_melem["Resize:linear"] == 1.4
    assert p.efficiency["conv"] == ((1792, 0.6), (7168, 0.9), (401408, 1.0))
    # which figures a worker gets: its own count; else the largest below; else the smallest
    fast = copy.deepcopy(GOOD)
    fast["threads"] = {1: copy.deepcopy(FIGURES), 4: {**copy.deepcopy(FIGURES), "memory_gbps": 40.0}}
    q = validate_profile_dict(fast, "me.yaml")
    assert q.figures(4).memory_gbps == 40.0 and q.figures(8).memory_gbps == 40.0
    assert q.figures(2).memory_gbps == 12.0 and q.figures(None).memory_gbps == 12.0
    old = {k: v for k, v in GOOD.items() if k not in ("threads", "measurement", "op_ms_per_melem", "efficiency")}
    r = validate_profile_dict(copy.deepcopy(old), "old.yaml")  # a profile of before: still valid, same figures
    assert r.threads == {} and r.figures(1).gflops == r.gflops and r.op_ms_per_melem == {} and r.efficiency == {}


def bad(path: str, value):
    """GOOD with the value at a dotted path replaced (None: the key removed)."""
    doc = copy.deepcopy(GOOD)
    *head, last = path.split("/")
    node = doc
    for k in head:
        node = node[int(k) if k.isdigit() else k]
    key = int(last) if last.isdigit() else last
    if value is None:
        del node[key]
    else:
        node[key] = value
    return doc


CASES = [
    (bad("threads", {0: FIGURES}), "threads: keys must be thread counts, integers 1 to 4096, got int 0"),
    (bad("threads", {"two": FIGURES}), "threads: keys must be thread counts, integers 1 to 4096, got str 'two'"),
    (bad("threads", {True: FIGURES}), "got bool True"),
    (bad("threads", {}), "threads must be a non-empty mapping of thread counts"),
    (bad("threads", [1, 2]), "threads must be a non-empty mapping of thread counts, got list"),
    (bad("threads/1/gflops", None), "missing required key 'gflops' in threads.1"),
    (bad("threads/2/gflops/conv", 0), "threads.2.gflops.conv must be positive, got 0"),
    (bad("threads/2/memory_gbps", "fast"), "threads.2.memory_gbps must be a number, got str 'fast'"),
    (bad("threads/1/colour", 3), "unknown key 'colour' in threads.1"),
    (bad("op_ms_per_melem/LRN", -1), "op_ms_per_melem['LRN'] must be positive, got -1"),
    (bad("threads/1/op_ms_per_melem", {"not an op": 1.0}), "threads.1.op_ms_per_melem: keys must be operator types (e.g. LRN, or Resize:linear"),
    (bad("efficiency/conv", [[7168, 0.9], [1792, 0.6]]), "efficiency.conv: output sizes must increase"),
    (bad("efficiency/conv_positions", [[49, 0.9], [7, 0.6]]), "efficiency.conv_positions: output sizes must increase"),
    (bad("threads/1/efficiency/conv_positions", [[7, 0]]), "threads.1.efficiency.conv_positions[0] fraction must be"),
    (bad("efficiency/gemm", [[8192, 5.0]]), "efficiency.gemm[0] fraction must be at most 4, got 5.0"),
    (bad("efficiency/gemm", [[8192]]), "efficiency.gemm[0] must be an [output size, fraction] pair"),
    (bad("efficiency/gemm", []), "efficiency.gemm must be a non-empty list"),
    (bad("threads/2/efficiency", {"lstm": [[1, 1.0]]}), "unknown key 'lstm' in threads.2.efficiency"),
    (bad("threads/2/efficiency/conv/0", [0, 0.5]), "threads.2.efficiency.conv[0] output size must be positive"),
    (bad("measurement/load/verdict", "meh"), "measurement.load.verdict must be one of quiet, busy, unknown"),
    (bad("measurement/threads/1/gflops.conv/runs", 0), "measurement.threads.1['gflops.conv'].runs must be a positive"),
    (bad("measurement/threads/1/gflops.conv/stable", "yes"), "stable must be true or false"),
    (bad("measurement/load/before/loadavg", [1.0]), "measurement.load.before.loadavg must be [1 min, 5 min, 15 min]"),
    (bad("measurement/extra", 1), "unknown key 'extra' in measurement"),
]


SHA = "ab" * 32
ACCEL = {**copy.deepcopy(GOOD), "providers": ["OpenVINOExecutionProvider", "CPUExecutionProvider"],
         "layers": {SHA: {"conv": 1.0, "relu": 0.1, "fc": 0.5}},
         "cpu": {**copy.deepcopy(FIGURES), "threads": {1: copy.deepcopy(FIGURES)}},
         "cpu_nodes": {SHA: ["relu"]}}


def bad_accel(path: str, value):
    """ACCEL (a profile measured with OpenVINO, with `cpu:` and `cpu_nodes:`) with the value at a path replaced."""
    doc = copy.deepcopy(ACCEL)
    *head, last = path.split("/")
    node = doc
    for k in head:
        node = node[int(k) if k.isdigit() else k]
    if value is None:
        del node[int(last) if last.isdigit() else last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return doc


def test_a_profile_with_cpu_figures_and_cpu_nodes_loads():
    p = validate_profile_dict(copy.deepcopy(ACCEL), "ov.yaml")
    assert p.cpu_nodes == {SHA: frozenset({"relu"})} and p.cpu.figures(1).gflops["conv"] == 70.0
    assert p.cpu.figures(None).memory_gbps == 12.0


CASES += [
    (bad_accel("cpu_nodes", {"abc": ["relu"]}), "cpu_nodes: keys must be model sha256s (64 lowercase hex digits)"),
    (bad_accel(f"cpu_nodes/{SHA}", "relu"), f"cpu_nodes['{SHA}'] must be a list of node names"),
    (bad_accel(f"cpu_nodes/{SHA}", ["relu", "relu"]), "cpu_nodes.abababababab...: 'relu' is listed twice"),
    (bad_accel(f"cpu_nodes/{SHA}", ["softmax"]), "cpu_nodes.abababababab...: 'softmax' is not a node of the profile's"),
    (bad_accel("providers", None), "cpu: the CPU provider's figures and nodes beside an accelerator, but 'providers' "
                                   "lists none (CPUExecutionProvider)"),
    (bad_accel("cpu/gflops/conv", -1), "cpu.gflops.conv must be positive, got -1"),
    (bad_accel("cpu/threads/1/memory_gbps", "x"), "cpu.threads.1.memory_gbps must be a number, got str 'x'"),
    (bad_accel("cpu/threads/1/threads", {1: FIGURES}), "unknown key 'threads' in cpu.threads.1"),
]


@pytest.mark.parametrize("doc, needle", CASES, ids=[c[1][:40] for c in CASES])
def test_bad_profile_is_one_line_exit_2_through_compile(tmp_path, doc, needle):
    prof = tmp_path / "me.yaml"
    prof.write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "c.yaml").write_text("devices: [{name: me, profile: me.yaml}]\n")
    res = CliRunner().invoke(cli, ["compile", str(models.ensure("tinychain")), "--devices", str(tmp_path / "c.yaml"),
                                   "-o", str(tmp_path / "out")], prog_name="edgec")
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    line = res.stderr.strip()
    assert line.startswith(f"edgec: {prof}: ") and needle in line, line
    assert not (tmp_path / "out").exists()


def edgec(*args, cwd):
    return subprocess.run([sys.executable, "-m", "edgec.compiler", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_quick_profile_through_the_cli_is_accepted_by_compile(tmp_path, monkeypatch):
    """`edgec profile --quick` (in process, its timings scripted: profile_scripted.py) writes a profile (warnings
    about load allowed) that `edgec compile` uses."""
    script_timings(monkeypatch)
    script_runtime_costs(monkeypatch)
    out_yaml = tmp_path / "host.yaml"
    res = CliRunner().invoke(cli, ["profile", "--quick", "--threads", "1", "-o", str(out_yaml)], prog_name="edgec")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == str(out_yaml) and "Traceback" not in res.output
    loaded = load_profile(str(out_yaml))
    assert list(loaded.threads) == [1] and loaded.op_ms_per_melem and set(loaded.efficiency) == {"conv_positions", "depthwise_conv", "gemm"}
    (tmp_path / "c.yaml").write_text("devices: [{name: me, profile: host.yaml}]\n")
    out = CliRunner().invoke(cli, ["compile", str(models.ensure("tinychain")), "--devices", str(tmp_path / "c.yaml"),
                                   "-o", str(tmp_path / "build"), "--json"], prog_name="edgec")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["predicted_latency_ms"] > 0


@pytest.mark.slow
def test_quick_profile_end_to_end_is_accepted_by_compile(tmp_path):
    """`edgec profile --quick` writes a profile (warnings about load allowed) that `edgec compile` uses.  Slow:
    its micro-benchmarks time this machine (20 s on a busy one)."""
    prof = edgec("profile", "--quick", "--threads", "1", "-o", "host.yaml", cwd=tmp_path)
    assert prof.returncode == 0, prof.stderr
    assert prof.stdout.strip() == "host.yaml" and "Traceback" not in prof.stderr
    loaded = load_profile(str(tmp_path / "host.yaml"))
    assert list(loaded.threads) == [1] and loaded.op_ms_per_melem and set(loaded.efficiency) == {"conv_positions", "depthwise_conv", "gemm"}
    (tmp_path / "c.yaml").write_text("devices: [{name: me, profile: host.yaml}]\n")
    out = edgec("compile", models.ensure("tinychain"), "--devices", "c.yaml", "-o", "build", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["predicted_latency_ms"] > 0


@pytest.mark.parametrize("value", ["0", "1,x", "1,,2", "100000", "-1"])
def test_bad_threads_list_is_a_usage_error(value):
    res = CliRunner().invoke(cli, ["profile", "-o", "p.yaml", "--threads", value], prog_name="edgec")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    assert "--threads" in res.stderr and "comma-separated list of thread counts" in res.stderr
