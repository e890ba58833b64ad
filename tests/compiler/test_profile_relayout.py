"""A profile's boundary_ms_per_mb and crop_ms_per_mb: what cutting a conv chain into tile fragments costs per MB
(onnxruntime's layout conversions around a fragment's ends and around a Slice inside it).  The schema and the
Figures carry both like weight_gbps; `edgec profile` writes the first (4 / memory_gbps where onnxruntime
converts, compiler/profile/bench.py), the second a profile may give.  Every timing here is synthetic."""

from __future__ import annotations

import copy
import platform
from pathlib import Path

import pytest
import yaml

from edgec.compiler.cluster import load_cluster, validate_profile_dict
from edgec.compiler.errors import UserError
from edgec.compiler.profile import bench, measure
from edgec.compiler.profile.bench import Bench
from edgec.compiler.profile.load import CpuTimes, LoadSample
from edgec.compiler.profile.timing import QUICK, Series

FIGURES = {"op_overhead_us": 5, "gflops": {"conv": 70, "depthwise_conv": 20, "gemm": 60, "other": 30},
           "memory_gbps": 12}
PROFILE = {"name": "me", "memory_mb": 4096, "usable_memory_fraction": 0.8, "runtime_overhead_mb": 90,
           **copy.deepcopy(FIGURES), "power_w": {"idle": 2.0, "busy": 6.0}, "sources": ["made up for a test"],
           "threads": {1: copy.deepcopy(FIGURES), 2: copy.deepcopy(FIGURES)},
           "modes": {"slow": {"power_w": {"idle": 1.0, "busy": 3.0}, "sources": ["made up"]}}}
KEYS = ("boundary_ms_per_mb", "crop_ms_per_mb")


def _with(**places) -> dict:
    """PROFILE with values set at '/'-separated places."""
    doc = copy.deepcopy(PROFILE)
    for place, value in places.items():
        *head, last = place.split("/")
        node = doc
        for k in head:
            node = node[int(k) if k.isdigit() else k]
        node[last] = value
    return doc


# --------------------------------------------------------------------------------------------------
# Schema and Figures


def test_a_profile_without_them_loads_with_none_everywhere():
    p = validate_profile_dict(copy.deepcopy(PROFILE), "board.yaml")
    for key in KEYS:
        assert getattr(p, key) is None
        assert getattr(p.figures(), key) is None and getattr(p.figures(1), key) is None
        assert getattr(p.mode_figures("slow"), key) is None


def test_top_level_threads_entries_and_modes_carry_them():
    doc = _with(boundary_ms_per_mb=0.11, crop_ms_per_mb=0.13, **{
        "threads/1/boundary_ms_per_mb": 0.09, "threads/1/crop_ms_per_mb": 0,  # 0: a runtime that converts nothing
        "modes/slow/boundary_ms_per_mb": 0.2})
    p = validate_profile_dict(doc, "board.yaml")
    assert (p.boundary_ms_per_mb, p.crop_ms_per_mb) == (0.11, 0.13)
    assert (p.figures().boundary_ms_per_mb, p.figures().crop_ms_per_mb) == (0.11, 0.13)
    assert (p.figures(1).boundary_ms_per_mb, p.figures(1).crop_ms_per_mb) == (0.09, 0.0)
    # a thread count that did not measure them does not price them
    assert (p.figures(2).boundary_ms_per_mb, p.figures(2).crop_ms_per_mb) == (None, None)
    slow = p.mode_figures("slow")
    assert (slow.boundary_ms_per_mb, slow.crop_ms_per_mb) == (0.2, 0.13)  # the mode's own, else the top level's


@pytest.mark.parametrize("place, value, message", [
    ("boundary_ms_per_mb", -0.01, "boundary_ms_per_mb must not be negative, got -0.01"),
    ("crop_ms_per_mb", "0.1", "crop_ms_per_mb must be a number, got str '0.1'"),
    ("threads/2/crop_ms_per_mb", -1, "threads.2.crop_ms_per_mb must not be negative, got -1"),
    ("threads/1/boundary_ms_per_mb", True, "threads.1.boundary_ms_per_mb must be a number, got bool True"),
    ("modes/slow/boundary_ms_per_mb", -2.5, "modes['slow'].boundary_ms_per_mb must not be negative, got -2.5"),
    ("modes/slow/crop_ms_per_mb", [0.1], "modes['slow'].crop_ms_per_mb must be a number, got list [0.1]"),
    ("crop_ms_per_mb", float("nan"), "crop_ms_per_mb must be finite, got nan"),
])
def test_a_bad_value_is_one_line_naming_the_file_and_the_key(place, value, message):
    with pytest.raises(UserError) as ei:
        validate_profile_dict(_with(**{place: value}), "board.yaml")
    assert str(ei.value) == f"board.yaml: {message}" and ei.value.path == "board.yaml"


def test_a_device_gets_the_figures_of_its_worker_thread_count(tmp_path):
    doc = _with(boundary_ms_per_mb=0.11, crop_ms_per_mb=0.13,
                **{"threads/1/boundary_ms_per_mb": 0.07, "threads/1/crop_ms_per_mb": 0.08})
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "c.yaml").write_text(
        "devices:\n  - {name: one, profile: board.yaml, threads: 1}\n  - {name: all, profile: board.yaml}\n"
        "network: {bandwidth_mbps: 100, latency_ms: 1}\n")
    cluster = load_cluster(tmp_path / "c.yaml")
    one, every = cluster.device("one").figures, cluster.device("all").figures
    assert (one.boundary_ms_per_mb, one.crop_ms_per_mb) == (0.07, 0.08)
    assert (every.boundary_ms_per_mb, every.crop_ms_per_mb) == (0.11, 0.13)


# --------------------------------------------------------------------------------------------------
# What edgec profile writes


def test_a_boundary_is_two_conversions_at_memory_speed_where_the_runtime_converts():
    assert bench.boundary_ms_per_mb(40.0, True) == pytest.approx(0.1)  # 2 x (read + write) of 1 MB at 40 GB/s
    assert bench.boundary_ms_per_mb(40.0, False) == 0.0


def _avx2() -> bool:
    try:
        return platform.machine() in ("x86_64", "AMD64") and " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_blocked_layout_reads_the_graph_onnxruntime_optimises():
    blocked = bench.blocked_layout(1)
    assert isinstance(blocked, bool)
    if _avx2():  # onnxruntime's NCHWc kernels are x86 ones (AVX2 and up)
        assert blocked


class _Probe:
    def __init__(self):
        self.jiffies = 0

    def sample(self) -> LoadSample:
        self.jiffies += 100
        return LoadSample((0.1, 0.1, 0.1), CpuTimes(0, self.jiffies, 0, 2))

    def wait(self, seconds: float) -> None:
        pass


def _scripted(times_s: dict[str, float]):
    """Makes Benches whose timer answers every round of a job with times_s[its name] (1 ms for the rest)."""
    def make(threads, quick, policy, probe, strict, say):
        def timer(data, feeds, n, pol, opt):
            (name,) = [j.name for j in b.jobs if j.data is data]
            return Series(times_s.get(name, 1e-3), 0.01, 7, 0.01, True)
        b = Bench(threads, quick, policy, probe, strict, say, timer=timer)
        return b
    return make


@pytest.mark.parametrize("blocked", [True, False])
def test_measure_figures_writes_the_boundary_from_memory_gbps(monkeypatch, blocked):
    monkeypatch.setattr(bench, "blocked_layout", lambda threads: blocked)
    lines: list[str] = []
    b = _scripted({})(1, True, QUICK, _Probe(), False, lines.append)
    fig = bench.measure_figures(b)
    assert fig["boundary_ms_per_mb"] == bench.sig(4.0 / fig["memory_gbps"] if blocked else 0.0)
    assert "crop_ms_per_mb" not in fig  # not measured: a profile may give it
    (said,) = [s for s in lines if "fragment boundary" in s]
    assert f"blocked layout: {'yes' if blocked else 'no'}" in said


def test_the_profile_says_how_the_boundary_figure_was_made(monkeypatch):
    monkeypatch.setattr(measure, "Bench", _scripted({}))
    p = measure.measure_host(threads=1, quick=True, probe=_Probe(), runtime_costs=False, progress=lambda _: None)
    assert p["boundary_ms_per_mb"] == p["threads"][1]["boundary_ms_per_mb"] >= 0
    assert "crop_ms_per_mb" not in p and "crop_ms_per_mb" not in p["threads"][1]
    assert sum(s.startswith(("boundary_ms_per_mb: ", "crop_ms_per_mb: ")) for s in p["sources"]) == 1
    loaded = validate_profile_dict(p, "host.yaml")
    assert (loaded.boundary_ms_per_mb, loaded.figures(1).crop_ms_per_mb) == (p["boundary_ms_per_mb"], None)
