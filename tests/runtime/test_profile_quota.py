"""The CPU share `edgec profile` sees (runtime/profile/quota.py), how it lengthens the samples (timing.py), and
the device's profile writer (write.py): flow-style YAML that the compiler loads as it was measured."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from edgec.compiler.cluster import load_profile, profiles_dir
from edgec.runtime.errors import InputError
from edgec.runtime.profile import quota
from edgec.runtime.profile.quota import CpuQuota, parse_cgroups, parse_mountinfo, read_cgroup_quota
from edgec.runtime.profile.timing import QUICK, sample_fn
from edgec.runtime.profile.write import dumps, write_profile_flow

V1_MOUNTS = """\
25 30 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
26 25 0:23 / {root}/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
27 25 0:24 / {root}/memory rw,relatime - cgroup cgroup rw,memory
"""
V2_MOUNTS = "30 1 0:26 / {root}/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def _proc(tmp: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(mountinfo.format(root=tmp / "fs"))
    return proc


def _v1_group(tmp: Path, path: str, quota_us: int, period_us: int) -> None:
    folder = tmp / "fs" / "cpu" / path
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
    (folder / "cpu.cfs_period_us").write_text(f"{period_us}\n")


def test_the_throttled_time_is_read_from_the_tightest_quota_s_cgroup(tmp_path):
    """The runtime's costs under a quota are timed over requests that met no stall (fixed._unstalled): the
    throttled time of the cgroup whose quota is the tightest (v1 ns), None without a quota or a cpu.stat."""
    from edgec.runtime.profile.quota import throttle_reader

    _v1_group(tmp_path, "", -1, 100_000)
    _v1_group(tmp_path, "pod", 50_000, 100_000)
    _v1_group(tmp_path, "pod/box", 100_000, 100_000)
    proc = _proc(tmp_path, "3:cpu:/pod/box\n", V1_MOUNTS)
    assert throttle_reader(proc) is None  # no cpu.stat
    stat = tmp_path / "fs" / "cpu" / "pod" / "cpu.stat"
    stat.write_text("nr_periods 10\nnr_throttled 2\nthrottled_time 7000\n")
    (tmp_path / "fs" / "cpu" / "pod" / "box" / "cpu.stat").write_text("throttled_time 1\n")  # not the tightest
    read = throttle_reader(proc)
    assert read() == 7000
    stat.write_text("nr_periods 11\nnr_throttled 3\nthrottled_time 9500\n")
    assert read() == 9500
    _v1_group(tmp_path, "pod", -1, 100_000)
    _v1_group(tmp_path, "pod/box", -1, 100_000)
    assert throttle_reader(proc) is None  # no quota


def test_a_request_that_met_a_stall_is_taken_again():
    from edgec.runtime.profile import fixed

    counter, taken = iter([0, 5, 5, 5]), []
    once = fixed._unstalled(lambda: taken.append(len(taken)) or len(taken), lambda: next(counter))
    assert once() == 2 and len(taken) == 2  # the first met a stall (0 -> 5), the second none (5 -> 5)
    always = iter(range(100))
    stalled = fixed._unstalled(lambda: "last", lambda: next(always))
    fixed.STALLED_KEPT.clear()
    assert stalled() == "last"  # STALL_TRIES stalls: the last is kept, and counted for the profile's notes
    assert fixed.STALLED_KEPT == [1]
    fixed.STALLED_KEPT.clear()
    assert fixed._unstalled(len, None) is len


def test_cgroup_and_mountinfo_lines_parse():
    assert parse_cgroups("4:memory:/a\n1:cpu,cpuacct:/box\n0::/v2\n") == {"memory": "/a", "cpu": "/box",
                                                                          "cpuacct": "/box", "": "/v2"}
    mounts = parse_mountinfo(V1_MOUNTS.format(root="/sys/fs/cgroup") + "40 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    assert [(m[1], m[2], m[3]) for m in mounts] == [(Path("/sys/fs/cgroup/cpu"), "cgroup", ["rw", "cpu"]),
                                                    (Path("/sys/fs/cgroup/memory"), "cgroup", ["rw", "memory"])]


def test_a_v1_quota_is_read_and_the_tightest_ancestor_counts(tmp_path):
    _v1_group(tmp_path, "", -1, 100_000)  # the hierarchy's root: no limit
    _v1_group(tmp_path, "pod", 50_000, 100_000)  # 0.5 cores
    _v1_group(tmp_path, "pod/box", 100_000, 100_000)  # 1 core, inside the pod's 0.5
    proc = _proc(tmp_path, "3:cpu:/pod/box\n", V1_MOUNTS)
    cores, period, where, read = read_cgroup_quota(proc)
    assert (cores, period, read) == (0.5, 100_000, True) and where.endswith("cpu.cfs_quota_us of " + str(
        (tmp_path / "fs" / "cpu" / "pod").resolve()))


def test_a_v2_quota_is_read_and_max_is_no_limit(tmp_path):
    folder = tmp_path / "fs" / "unified" / "box"
    folder.mkdir(parents=True)
    (folder / "cpu.max").write_text("1250 5000\n")
    proc = _proc(tmp_path, "0::/box\n", V2_MOUNTS)
    assert read_cgroup_quota(proc)[:2] == (0.25, 5000)
    (folder / "cpu.max").write_text("max 100000\n")
    cores, _, where, read = read_cgroup_quota(proc)
    assert cores is None and read and "no limit in cpu.max" in where


def test_without_a_mounted_hierarchy_nothing_is_read(tmp_path):
    """Inside `ip netns exec`, /sys is remounted: the process's cgroup is named, its files are not there."""
    proc = _proc(tmp_path, "3:cpu:/box\n", "40 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    cores, period, where, read = read_cgroup_quota(proc)
    assert (cores, period, read) == (None, None, False) and "ip netns exec" in where
    assert read_cgroup_quota(tmp_path / "absent")[3] is False


@pytest.mark.parametrize("q, threads, sample_s", [
    (CpuQuota(0.25, 5000, "f", 0.25), 1, 0.05),  # ten periods
    (CpuQuota(0.9, 5000, "f", 0.9), 2, 0.05),
    (CpuQuota(2.0, 5000, "f", 1.0), 2, None),  # a share of the thread count: samples as they are
    (CpuQuota(0.5, 100_000, "f", 0.5), 1, quota.MAX_SAMPLE_S),  # the kernel's default period: capped
    (CpuQuota(None, None, "read, no limit", 0.3), 1, None),  # the files say no limit: the spin saw other load
    (CpuQuota(None, None, "unreadable", 0.3, read=False), 1, quota.UNKNOWN_PERIOD_SAMPLE_S),
    (CpuQuota(None, None, "unreadable", 0.95, read=False), 1, None),
])
def test_samples_span_many_periods_only_below_the_thread_count(q, threads, sample_s):
    assert q.sample_s(threads) == sample_s
    entry = q.entry([threads])
    assert entry["sample_ms"] == (None if sample_s is None else {threads: round(sample_s * 1e3, 3)})


def test_a_spinning_thread_gets_some_of_a_core():
    share = quota.spin_share(0.05)
    assert share is not None and 0 < share <= 1.05


def test_long_samples_count_their_runs_over_the_stretch():
    """A run timed alone may have stalled for a period: the runs are counted over the whole first stretch."""
    runs = []
    sampler = sample_fn(lambda: runs.append(1), replace(QUICK, min_sample_s=0.01, long_samples=True))
    before = len(runs)
    seconds = sampler()
    per_sample = len(runs) - before
    assert per_sample > 1000 and seconds * per_sample < 0.1  # not capped at 1000 as short samples are


def test_the_flow_style_profile_loads_as_written(tmp_path):
    doc = yaml.safe_load((profiles_dir() / "rpi5.yaml").read_text())
    doc["threads"] = {1: {"op_overhead_us": 12.0, "gflops": dict(doc["gflops"]), "memory_gbps": 1e-05 * 1e6}}
    doc["cpu_quota"] = CpuQuota(0.25, 5000, "cgroup v1", 0.251).entry([1])
    doc["sources"] = ["a \"quoted\" source: with a colon, é"]
    out = tmp_path / "p.yaml"
    write_profile_flow(doc, out)
    assert yaml.safe_load(out.read_text()) == doc
    assert load_profile(str(out)).figures(1).gflops == doc["gflops"]
    assert yaml.safe_load(dumps({"tiny": 1e-05, "huge": 1e20, "n": 3})) == {"tiny": 1e-05, "huge": 1e20, "n": 3}
    with pytest.raises(ValueError):
        dumps({"x": math.inf})
    with pytest.raises(InputError, match="does not exist"):
        write_profile_flow(doc, tmp_path / "no" / "p.yaml")


def test_a_profile_below_its_quota_takes_long_samples_and_records_the_quota(monkeypatch):
    """Scripted rounds (no benchmark runs): at 1 thread under a 0.25-core quota every round gets samples of ten
    5 ms periods, counted over the stretch; at 2 threads above a 2-core quota, the policy as it was."""
    from edgec.runtime.profile import measure
    from tests.compiler.profile_scripted import script_runtime_costs, script_timings, scripted_timer
    from tests.compiler.test_profile_stability import ScriptedProbe

    seen: dict[int, set] = {}

    def timer(data, feeds, threads, policy, opt):
        seen.setdefault(threads, set()).add((policy.min_sample_s, policy.long_samples))
        return scripted_timer(data, feeds, threads, policy, opt)

    script_timings(monkeypatch, timer=timer)
    script_runtime_costs(monkeypatch)
    from edgec.runtime.profile import fixed

    request_figure, pinned = fixed._request_figure, []
    monkeypatch.setattr(fixed, "_request_figure",
                        lambda policy, *a: (pinned.append(policy.cpu), request_figure(policy, *a))[1])
    lines: list[str] = []
    for cores, threads, long in ((0.25, 1, True), (2.0, 2, False)):
        q = CpuQuota(cores, 5000, "cgroup v1 cpu.cfs_quota_us of /sys/fs/cgroup/cpu/box", 0.24)
        p = measure.measure_host(threads=threads, quick=True, probe=ScriptedProbe(0.0), quota=q, shared_weights=False,
                                 progress=lines.append)
        assert seen.pop(threads) == ({(0.05, True)} if long else {(QUICK.min_sample_s, False)})
        assert p["cpu_quota"] == {**q.entry([threads]), "measured_share": 0.24}
        assert p["description"].endswith(f"; CPU quota {cores:g} cores")
        assert any("cpu_quota:" in s for s in p["sources"])
    assert any("samples of 50 ms" in line for line in lines)
    # the runtime's costs on one CPU below a core only (fixed.ONE_CPU_BELOW), where the OS says the CPUs
    assert pinned[1] is None and (pinned[0] is not None or not hasattr(__import__("os"), "sched_getaffinity"))


def test_below_the_machine_s_cores_no_co_runner_starts(monkeypatch):
    """shared_weight_gbps' co-runners would share the quota with the benchmark: not measured, and said why."""
    from edgec.runtime.profile import host, measure
    from tests.compiler.profile_scripted import script_runtime_costs, script_timings
    from tests.compiler.test_profile_stability import ScriptedProbe

    monkeypatch.setattr(host, "all_cores", lambda cpu: 2)
    script_timings(monkeypatch)
    script_runtime_costs(monkeypatch)
    monkeypatch.setattr(measure, "CoRunners", lambda *a, **k: pytest.fail("a co-runner started"))
    p = measure.measure_host(threads=1, quick=True, probe=ScriptedProbe(0.0), quota=CpuQuota(1.5, 5000, "f", 1.0))
    assert "shared_weight_gbps" not in p
    assert any(w.startswith("shared_weight_gbps not measured: the CPU quota (1.5 cores)") for w in
               p["measurement"]["warnings"])
