"""A profile's layout_conversions: whether onnxruntime converts a conv chain's activations into and out of its
blocked layout at a fragment's ends and around a crop inside it (the cost model prices each conversion at
memory_gbps: test_tile_relayout.py).  `edgec profile` reads it from the graph onnxruntime optimises.  Every
timing here is synthetic."""

from __future__ import annotations

import copy
import platform
from pathlib import Path

import pytest

from edgec.compiler.cluster import validate_profile_dict
from edgec.compiler.errors import UserError
from edgec.runtime.profile import kernels, measure
from edgec.runtime.profile.load import CpuTimes, LoadSample
from edgec.runtime.profile.timing import Series
from tests.compiler.profile_scripted import script_timings

FIGURES = {"op_overhead_us": 5, "gflops": {"conv": 70, "depthwise_conv": 20, "gemm": 60, "other": 30},
           "memory_gbps": 12}
PROFILE = {"name": "me", "memory_mb": 4096, "usable_memory_fraction": 0.8, "runtime_overhead_mb": 90,
           **copy.deepcopy(FIGURES), "power_w": {"idle": 2.0, "busy": 6.0}, "sources": ["made up for a test"],
           "threads": {1: copy.deepcopy(FIGURES), 2: copy.deepcopy(FIGURES)},
           "modes": {"slow": {"power_w": {"idle": 1.0, "busy": 3.0}, "sources": ["made up"]}}}


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
# Schema


def test_layout_conversions_is_a_top_level_yes_or_no_default_no():
    assert validate_profile_dict(copy.deepcopy(PROFILE), "board.yaml").layout_conversions is False
    assert validate_profile_dict(_with(layout_conversions=True), "board.yaml").layout_conversions is True


@pytest.mark.parametrize("place, value, message", [
    ("layout_conversions", "yes", "layout_conversions must be true or false, got 'yes'"),
    ("layout_conversions", 1, "layout_conversions must be true or false, got 1"),
    ("threads/1/layout_conversions", True, "unknown key 'layout_conversions' in threads.1 (allowed: "),
])
def test_a_bad_value_is_one_line_naming_the_file_and_the_key(place, value, message):
    with pytest.raises(UserError) as ei:
        validate_profile_dict(_with(**{place: value}), "board.yaml")
    assert str(ei.value).startswith(f"board.yaml: {message}") and ei.value.path == "board.yaml"
    assert "\n" not in str(ei.value)


# --------------------------------------------------------------------------------------------------
# What edgec profile writes


def _avx2() -> bool:
    try:
        return platform.machine() in ("x86_64", "AMD64") and " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_blocked_layout_reads_the_graph_onnxruntime_optimises():
    blocked = kernels.blocked_layout(1)
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


def _one_ms(data, feeds, n, pol, opt) -> Series:
    """Every timing answered with 1 ms (nothing is timed)."""
    return Series(1e-3, 0.01, 7, 0.01, True)


@pytest.mark.parametrize("blocked", [True, False])
def test_the_profile_writes_and_says_whether_the_runtime_converts(monkeypatch, blocked):
    script_timings(monkeypatch, timer=_one_ms, beside=_one_ms)  # the co-runners' rounds too
    monkeypatch.setattr(kernels, "blocked_layout", lambda threads: blocked)
    lines: list[str] = []
    p = measure.measure_host(threads=1, quick=True, probe=_Probe(), runtime_costs=False, progress=lines.append)
    assert p["layout_conversions"] is blocked and "layout_conversions" not in p["threads"][1]
    assert f"blocked layout: {'yes' if blocked else 'no'}" in "\n".join(lines)
    assert sum(s.startswith("layout_conversions: ") for s in p["sources"]) == 1
    assert validate_profile_dict(p, "host.yaml").layout_conversions is blocked
