"""`edgec profile`'s message figures (runtime/profile/fixed.py): a message between two local workers of the runtime,
each way timed as `edgec run --report` times a transfer."""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from pathlib import Path

import pytest

from edgec.runtime.profile import fixed
from edgec.runtime.profile.timing import QUICK, Figure
from edgec.runtime.coordinator.accuracy import transfer_keys
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.manifest.schedule import working_devices

# what a fake pair of workers takes per way (ms), and how far worker b's clock is off: the figure must not see it
SMALL_MS = {("a", "b"): 0.30, ("b", "a"): 0.10}
LARGE_MS = {("a", "b"): 1.30, ("b", "a"): 1.10}
OFFSET_MS = 0.25


RUN_IN_PLAN_MS, RUN_ALONE_MS = 1.10, 1.03  # the run figure's fragment: in a request, and alone


class _Samples:
    def __init__(self):
        self.transfer_ms: dict = {}
        self.fragment_ms: dict = {}


class FakeCluster:
    """Cluster's interface as fixed.py uses it: the manifest it was given, and per request the transfer times
    a real run would keep, b's clock offset added to a -> b and taken from b -> a."""

    manifests: list = []

    def __init__(self, manifest, *, threads, timeout, timings=False):
        assert threads == 1
        self.manifest = manifest
        self.samples = _Samples() if timings else None
        FakeCluster.manifests.append(manifest)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def infer(self, feeds):
        if self.samples is not None:
            for name, ms in (("s", SMALL_MS), ("l", LARGE_MS)):
                for (src, dst), t in ms.items():
                    skew = OFFSET_MS if dst == "b" else -OFFSET_MS
                    self.samples.transfer_ms.setdefault((src, dst, name), deque()).append(t + skew)
            self.samples.fragment_ms.setdefault(fixed.RUN_FRAGMENT, deque()).append(RUN_IN_PLAN_MS)
        return {}, 1.0, {"d": 0.25}


def _scripted_run_alone(policy):
    """The run figure's fragment alone, RUN_ALONE_MS: timed for real it is ~1 ms too, and on a busy moment
    slower than the scripted RUN_IN_PLAN_MS, which writes run_ms as 0 with a note of its own."""
    return Figure(RUN_ALONE_MS / 1e3, 0.01, 0.01, 0.0, (RUN_ALONE_MS / 1e3,), 7, 0.1, True)


def test_a_message_is_the_mean_of_both_ways_between_two_workers(monkeypatch):
    """Two worker processes (two working devices) exchange the tensor; the clock offset between them cancels."""
    import edgec.runtime.coordinator.pool as coordinator

    FakeCluster.manifests = []
    monkeypatch.setattr(coordinator, "WorkerPool", FakeCluster)
    monkeypatch.setattr(fixed, "_cpu_figures", lambda policy, large: None)  # timed below, on real workers
    monkeypatch.setattr(fixed, "_run_alone", _scripted_run_alone)
    costs, figures, notes = fixed.measure_runtime_costs(QUICK, True, lambda s: None)
    assert "message_cpu_ms" not in costs and notes == []
    assert figures["message_small"].median_s * 1e3 == pytest.approx(0.20)
    assert figures["message_large"].median_s * 1e3 == pytest.approx(1.20)
    assert costs["message_ms"] == pytest.approx(0.2)
    quick_large = fixed._LARGE_BYTES[True]
    assert costs["message_ms_per_mb"] == pytest.approx(1.0 / (quick_large - fixed.SMALL_BYTES) * 1e6, rel=1e-2)
    assert costs["request_ms"] == pytest.approx(0.75)
    assert figures["run_in_plan"].median_s * 1e3 == pytest.approx(RUN_IN_PLAN_MS)
    assert costs["run_ms"] == pytest.approx(RUN_IN_PLAN_MS - RUN_ALONE_MS)
    small, large = FakeCluster.manifests[:2]
    for exchange in (small, large):
        assert working_devices(exchange) == ("a", "b")  # one worker process each
    # each figure in requests of its own, whose input is no larger than the tensor exchanged: under a small CPU
    # quota a request's other work runs the quota out and the stall lands in the hand-off timed
    assert [t.bytes for t in small.transfers] == [fixed.SMALL_BYTES] * 2
    assert [i.nbytes for i in small.inputs] == [fixed.SMALL_BYTES]
    assert [t.bytes for t in large.transfers] == [quick_large] * 2


def _cpu(ms: float) -> Figure:
    return Figure(ms / 1e3, 0.01, 0.01, 0.0, (ms / 1e3,), 7, 0.1, True)


def test_a_cpu_difference_swamped_by_noise_is_left_out_and_said(monkeypatch):
    """When the request exchanging the large tensor took no more CPU than the 64-byte one, no
    message_cpu_ms_per_mb is written (the time figure stands in) and a note says why, with the figures."""
    import edgec.runtime.coordinator.pool as coordinator

    monkeypatch.setattr(coordinator, "WorkerPool", FakeCluster)
    monkeypatch.setattr(fixed, "_run_alone", _scripted_run_alone)
    for small, large, written in ((4.0, 5.0, True), (4.0, 3.9, False)):
        monkeypatch.setattr(fixed, "_cpu_figures", lambda policy, size, small=small, large=large: {
            "cpu_small": _cpu(small), "cpu_large": _cpu(large), "cpu_request": _cpu(0.4)})
        costs, _, notes = fixed.measure_runtime_costs(QUICK, True, lambda s: None)
        assert costs["request_cpu_ms"] == pytest.approx(0.4)
        assert ("message_cpu_ms_per_mb" in costs) is written
        if written:
            assert costs["message_cpu_ms_per_mb"] > 0 and notes == []
        else:
            (note,) = notes
            assert note.startswith("runtime message_cpu_ms_per_mb not written") and "3.9 ms of CPU against 4" in note


def test_the_exchange_build_is_timed_like_a_report_transfer(tmp_path: Path):
    """Every transfer entry of the build matches a send step, as `edgec run --report` matches them: the keys the
    measurement reads are the report's."""
    manifest = load_manifest(fixed._exchange_build(tmp_path, 1 << 12))
    keys = transfer_keys(manifest)
    assert keys == [("a", "b", "s"), ("b", "a", "s"), ("a", "b", "l"), ("b", "a", "l")]
    assert [t.bytes for t in manifest.transfers] == [fixed.SMALL_BYTES, fixed.SMALL_BYTES, 1 << 12, 1 << 12]


def test_the_run_build_times_a_run_right_after_a_message(tmp_path: Path):
    """The run figure's build: b runs RUN_FRAGMENT once per request, right after receiving a's message (which
    a sent right after its own fragment runs), then sends it back; its transfers are the report's keys."""
    manifest = load_manifest(fixed._run_build(tmp_path))
    assert transfer_keys(manifest) == [("a", "b", "ping"), ("b", "a", "ping")]
    kinds = {d: [type(s).__name__ for s in steps if type(s).__name__ != "Free"] for d, steps in manifest.steps.items()}
    runs_b = [getattr(s, "fragment", None) for s in manifest.steps["b"]]
    assert runs_b.count(fixed.RUN_FRAGMENT) == 1
    i = kinds["b"].index("Run", kinds["b"].index("Recv", 1))  # b's first run after the message from a
    assert kinds["b"][i - 1] == "Recv" and [s for s in manifest.steps["b"] if type(s).__name__ == "Run"][-1].fragment \
        == fixed.RUN_FRAGMENT
    assert kinds["a"][kinds["a"].index("Send") - 1] == "Run"  # a's message leaves right after a fragment run
    assert set(manifest.fragments) == {"f0", "evict-a", "evict-b", fixed.RUN_FRAGMENT}


@pytest.mark.slow  # times the runtime's workers on this machine: its figures' bounds and order are the machine's
def test_two_real_workers_time_a_run_in_a_plan():
    """Through the runtime's own workers: both run figures positive, of the same fragment (within 2x)."""
    figures = fixed._run_figures(QUICK)
    in_plan, alone = figures["run_in_plan"].median_s, figures["run_alone"].median_s
    assert 0 < alone < 1.0 and 0 < in_plan < 1.0 and 0.5 < in_plan / alone < 2.0


@pytest.mark.slow  # times the runtime's workers on this machine: its figures' bounds and order are the machine's
def test_two_real_workers_hand_off_a_larger_tensor_slower():
    """Through the runtime's own workers (two processes, CURVE): positive figures, the larger tensor slower."""
    figures = fixed._message_figures(QUICK, 1 << 20)
    small, large = figures["message_small"].median_s, figures["message_large"].median_s
    assert 0 < small < large < 1.0
    assert all(f.runs >= 3 for f in figures.values())


def test_the_exchange_builds_for_cpu_move_the_same_input_and_output(tmp_path: Path):
    """A small or a large exchange (or both, as the time figures use) between the same two workers; the same
    large input in and output out."""
    small = fixed.SMALL_BYTES
    for ways, sizes in (("s", [small] * 2), ("l", [1 << 12] * 2), ("sl", [small] * 2 + [1 << 12] * 2)):
        folder = tmp_path / ways
        folder.mkdir()
        m = load_manifest(fixed._exchange_build(folder, 1 << 12, ways))
        assert [t.bytes for t in m.transfers] == sizes
        assert [i.nbytes for i in m.inputs] == [1 << 12] and [o.nbytes for o in m.outputs] == [1 << 12]
        assert working_devices(m) == ("a", "b")  # the same two workers in every build
    # message_cpu_ms_per_mb's requests: each exchange CPU_EXCHANGES times, every message a tensor of its own
    for ways, size in (("s", small), ("l", 1 << 12)):
        folder = tmp_path / f"{ways}-times"
        folder.mkdir()
        m = load_manifest(fixed._exchange_build(folder, 1 << 12, ways, fixed.CPU_EXCHANGES))
        assert [t.bytes for t in m.transfers] == [size] * 2 * fixed.CPU_EXCHANGES
        names = [ways] + [f"{ways}{i}" for i in range(1, fixed.CPU_EXCHANGES)]
        assert transfer_keys(m) == [k for n in names for k in (("a", "b", n), ("b", "a", n))]
        assert [i.nbytes for i in m.inputs] == [1 << 12] and [o.nbytes for o in m.outputs] == [1 << 12]


@pytest.mark.slow  # times the runtime's workers on this machine: its figures' bounds and order are the machine's
def test_cpu_figures_count_every_process_and_grow_with_the_messages():
    """Through the runtime's own workers: a request with messages takes more CPU than without, larger ones more."""
    figures = fixed._cpu_figures(QUICK, 1 << 20)
    assert figures is not None  # Linux: /proc/PID/task/*/schedstat
    small, large = (figures[k].median_s for k in ("cpu_small", "cpu_large"))
    assert 0 < small < large < 1.0  # 2 MiB more through CURVE and the copies: milliseconds of CPU
    assert 0 < figures["cpu_request"].median_s < small  # 256 bytes in and out, against 1 MiB


def test_runtime_figures_spread_their_rounds_over_fresh_clusters_and_take_the_median_round(monkeypatch):
    """A run's workers keep a speed of their own (a 64-byte hand-off measured 0.145-0.174 ms from one pair of
    workers to the next, minutes apart): each figure's rounds are spread over CLUSTERS clusters started one
    after another, and its figure is the median round, not the fastest."""
    import edgec.runtime.coordinator.pool as coordinator
    from edgec.runtime.profile.timing import Policy

    started: list = []

    class Counting(FakeCluster):
        def __init__(self, manifest, **kw):
            super().__init__(manifest, **kw)
            started.append(self)

    monkeypatch.setattr(coordinator, "WorkerPool", Counting)
    policy = Policy(rounds=2 * fixed.CLUSTERS, max_seconds=0.08, window=3, min_sample_s=1e-5, warmup=0, warmup_s=0.0)
    seen: list = []

    def sampler(cluster):
        ms = 1.0 + len(started) - 1  # the k-th cluster's workers take k ms, every sample
        return lambda: (seen.append(cluster), ms / 1e3)[1]

    figure = fixed._over_clusters("the manifest", {"x": sampler}, policy)["x"]
    assert len(started) == fixed.CLUSTERS and all(c.manifest == "the manifest" for c in started)
    assert [len({id(c) for c in seen if c is s}) for s in started] == [1] * fixed.CLUSTERS  # each took samples
    assert sorted(round(m * 1e3, 6) for m in figure.round_medians) == sorted(
        [float(k) for k in range(1, fixed.CLUSTERS + 1)] * 2)  # two rounds per cluster
    assert figure.median_s * 1e3 == pytest.approx(2.0)  # nearest rank at 0.5 of 1,1,2,2,3,3,4,4
    # a quick profile's two rounds stay in one cluster
    started.clear()
    fixed._over_clusters("m", {"x": sampler}, replace(policy, rounds=2))
    assert len(started) == 1


def _affinities(pid: int) -> set[frozenset]:
    """The CPU sets of every thread of process `pid`."""
    import os

    return {frozenset(os.sched_getaffinity(int(t.name))) for t in Path(f"/proc/{pid}/task").iterdir()}


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_getaffinity") or not Path("/proc/self/task").exists(),
                    reason="thread affinities are Linux's")
def test_under_a_share_below_a_core_the_runtime_is_timed_on_one_cpu(monkeypatch):
    """The coordinator and both workers share the profile's quota; across CPUs CFS hands it out in slices larger
    than a small quota, and they stall each other (a 64-byte hand-off 0.25-2.4 ms in a 0.3-core cgroup on this
    2-core machine, 0.10-0.11 on one CPU, against 0.17-0.21 between two 0.3-core testbed hosts of their own).
    Below ONE_CPU_BELOW every thread of this process runs on one CPU while the runtime is timed, and its
    affinity comes back after; at a core or more, or with no quota, nothing is pinned."""
    import os

    mine = os.sched_getaffinity(0)
    seen: list = []

    def record(policy, quick, say, throttled=None):
        seen.append((policy.cpu, _affinities(os.getpid())))
        return {}, {}, []

    monkeypatch.setattr(fixed, "_measure_runtime_costs", record)
    for cores in (None, 1.0, 2.5):
        fixed.measure_runtime_costs(QUICK, True, lambda s: None, cores)
    assert [cpu for cpu, _ in seen] == [None] * 3
    seen.clear()
    said: list[str] = []
    fixed.measure_runtime_costs(QUICK, True, said.append, 0.3)
    (cpu, during), = seen
    assert cpu == min(mine) and during == {frozenset({cpu})}
    assert "0.3 cores" in said[0] and f"CPU {cpu}" in said[0]
    assert _affinities(os.getpid()) == {frozenset(mine)}  # every thread back where it was


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_getaffinity") or not Path("/proc/self/task").exists(),
                    reason="thread affinities are Linux's")
def test_pinned_timings_pin_every_thread_of_the_workers(tmp_path: Path):
    """The workers are forked by the zygote, made before this process was pinned: each of their threads is
    pinned when their cluster starts."""
    import os

    cpu = min(os.sched_getaffinity(0))
    manifest = load_manifest(fixed._exchange_build(tmp_path, fixed.SMALL_BYTES, "s"))
    seen: list = []

    def sampler(cluster):
        seen.extend(_affinities(w.proc.pid) for w in cluster.workers.values())
        return lambda: 1e-3

    policy = replace(QUICK, cpu=cpu)
    fixed._over_clusters(manifest, {"x": sampler}, policy)
    assert len(seen) == 2 and all(a == {frozenset({cpu})} for a in seen)
