"""A profile's boundary_ms_per_mb and crop_ms_per_mb: what cutting a conv chain into tile fragments costs per MB
(onnxruntime's layout conversions around a fragment's ends and around a Slice inside it).  The schema and the
Figures carry them like weight_gbps; `edgec profile` turns four timings into them (compiler/profile/bench.py).
Every timing here is synthetic: no model is timed."""

from __future__ import annotations

import copy
import logging

import pytest
import yaml

from edgec.compiler.cluster import load_cluster, validate_profile_dict
from edgec.compiler.errors import UserError
from edgec.compiler.profile import bench, measure
from edgec.compiler.profile.bench import Bench, RelayoutShape, relayout_figures, relayout_shape
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
# From timings to figures

SHAPE = RelayoutShape(channels=64, rows=128, width=128, cropped_rows=2)
MB = 4 * 64 * 128 * 128 / 1e6
RUN = 10e-6  # one run's fixed cost: the 1-node Relu chain


def _times(a=1.8e-3, b=1.7e-3, fused=3.0e-3, cropped=3.4e-3) -> dict[str, float]:
    return {"op_overhead_us.relu_chain_1": RUN, "boundary_ms_per_mb.fragment_a": a,
            "boundary_ms_per_mb.fragment_b": b, "boundary_ms_per_mb.fused": fused, "crop_ms_per_mb.cropped": cropped}


def test_the_figures_are_the_extra_milliseconds_per_mb():
    r = relayout_figures(_times(), SHAPE, threads=1)
    # A + B - AB less the one extra run's fixed cost: 0.49 ms over 4.19 MB
    assert r.boundary_ms_per_mb == pytest.approx((1.8 + 1.7 - 3.0 - 0.01) / MB)
    # cropped - fused: 0.4 ms, plus the 2 of 128 rows the cropped model's second fragment skips, of B's time
    # beyond a run's fixed cost
    assert r.crop_ms_per_mb == pytest.approx((3.4 - 3.0 + (1.7 - 0.01) * 2 / 128) / MB)
    assert r.clamped == ()


def test_a_negative_difference_is_written_as_zero_and_said():
    r = relayout_figures(_times(a=1.6e-3, b=1.4e-3), SHAPE, threads=2)  # A + B - AB - run = -0.01 ms
    assert r.boundary_ms_per_mb == 0.0
    assert r.crop_ms_per_mb == pytest.approx((0.4 + 1.39 * 2 / 128) / MB)
    (line,) = r.clamped
    assert line.startswith("2 threads, boundary_ms_per_mb: ") and "came out -0.01 ms" in line and "written as 0" in line
    r = relayout_figures(_times(cropped=2.9e-3), SHAPE, threads=1)  # -0.1 ms + 0.026 ms skipped rows
    assert r.crop_ms_per_mb == 0.0 and r.boundary_ms_per_mb > 0
    (line,) = r.clamped
    assert line.startswith("1 thread, crop_ms_per_mb: ") and "came out -0.0736 ms" in line


def test_the_benchmark_shapes():
    full, quick = relayout_shape(False), relayout_shape(True)
    assert full == SHAPE and full.mb == pytest.approx(MB)
    assert quick.mb < full.mb
    # the correction for the rows the cropped model skips is off by at most this share of the crop figure
    assert all(s.cropped_rows / (s.rows - s.cropped_rows) < 0.03 for s in (full, quick))


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


def test_measure_figures_writes_both_rounded_and_says_them():
    lines: list[str] = []
    b = _scripted(_times(a=1.81234e-3))(1, True, QUICK, _Probe(), False, lines.append)
    fig = bench.measure_figures(b)
    quick = relayout_shape(True)
    assert fig["boundary_ms_per_mb"] == pytest.approx((1.81234 + 1.7 - 3.0 - 0.01) / quick.mb, rel=5e-3)
    assert fig["boundary_ms_per_mb"] == bench.sig(fig["boundary_ms_per_mb"])  # 3 significant figures
    assert fig["crop_ms_per_mb"] == bench.sig((0.4 + 1.69 * quick.cropped_rows / quick.rows) / quick.mb)
    assert {"boundary_ms_per_mb.fragment_a", "crop_ms_per_mb.cropped"} <= set(b.entries)
    (said,) = [s for s in lines if "fragment boundary" in s]
    assert f"boundary {fig['boundary_ms_per_mb']:.3g} ms/MB, crop {fig['crop_ms_per_mb']:.3g} ms/MB" in said
    assert "clamped" not in said and b.clamped == []


def test_a_clamped_figure_reaches_the_profile_warnings_and_the_log(monkeypatch, caplog):
    monkeypatch.setattr(measure, "Bench", _scripted(_times(a=1.6e-3, b=1.4e-3)))
    lines: list[str] = []
    with caplog.at_level(logging.WARNING, logger="edgec.compiler.profile"):
        p = measure.measure_host(threads=1, quick=True, probe=_Probe(), runtime_costs=False, progress=lines.append)
    assert p["boundary_ms_per_mb"] == p["threads"][1]["boundary_ms_per_mb"] == 0.0
    assert p["crop_ms_per_mb"] == p["threads"][1]["crop_ms_per_mb"] > 0
    (warning,) = [w for w in p["measurement"]["warnings"] if "boundary_ms_per_mb" in w]
    assert warning.startswith("1 thread, boundary_ms_per_mb: ") and "written as 0" in warning
    assert warning in caplog.messages
    assert any("(1 clamped to 0: timing noise)" in s for s in lines)
    assert sum(s.startswith(("boundary_ms_per_mb: ", "crop_ms_per_mb: ")) for s in p["sources"]) == 2
    loaded = validate_profile_dict(p, "host.yaml")  # the written profile is valid, 0 included
    assert (loaded.boundary_ms_per_mb, loaded.figures(1).crop_ms_per_mb) == (0.0, p["crop_ms_per_mb"])
