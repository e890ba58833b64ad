"""`edgec profile` inside a CPU-limited cgroup (issue 41 item 2): its figures follow the share, and the profile
records the quota it saw.  Two hosts limited by tests/netbed_limits.py (0.25 and 0.9 cores, a CFS quota per
5 ms period) each profile --quick at 1 thread, one after the other (side by side they would compete for this
machine's cores as well as for their quotas): the 0.25-core host's rates must be 2.5 to 5 times slower (the
shares' ratio is 3.6).  Slow (two profiles at a fraction of a core) and root only (cgroups).

A quota is a ceiling: on a machine whose other processes leave a host less than its quota, the host gets what
they leave.  On this 2-core machine with other processes using 1.6 of its CPUs, the 0.9-core host's spinning
thread got 0.57 of a core and the 0.25-core host's 0.23, and the rates followed those (conv and gemm 0.52-0.67
and 0.22-0.23 of an unlimited profile's), 2.2-3.0 times apart; the spins' own ratio, a quarter second each,
wandered from 1.2 to 2.5 over such runs.  So where a profile's load check found the machine busy, the quotas
are checked and the ratio is not (skipped, saying so): slow tests run on an idle machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgec.compiler.cluster import load_profile
from tests import netbed, netbed_limits
from tests.netbed_limits import HostLimits

pytestmark = pytest.mark.slow

SHARES = (0.25, 0.9)
RATES = ("conv", "gemm")  # gflops figures: compute, which a quota slows in proportion


def _profile_in(cpus: float, seq: int, out: Path) -> dict:
    """`edgec profile --quick --threads 1` run in a cgroup of `cpus` cores (joined before it starts, as a
    testbed host's processes are); the profile as the compiler loads it, its raw cpu_quota and the load check's
    verdict."""
    found = netbed_limits.find_controllers()
    made: list[Path] = []
    try:
        # named as the testbed names its hosts' cgroups, so that netbed.remove_stale() finds a killed run's
        dirs = netbed_limits.create(f"{netbed.PREFIX}-{os.getpid()}-{seq}-h0", HostLimits(cpus=cpus), found, made)
        argv = [sys.executable, "-m", "edgec.compiler", "profile", "--quick", "--threads", "1", "-o", str(out)]
        proc = subprocess.run(netbed_limits.join_argv(dirs, argv), capture_output=True, text=True, timeout=1200)
    finally:
        for path in reversed(made):
            netbed_limits.remove(path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    raw = yaml.safe_load(out.read_text())
    return {"profile": load_profile(str(out)), "cpu_quota": raw["cpu_quota"],
            "verdict": raw["measurement"]["load"]["verdict"]}


def test_a_quarter_core_profiles_about_three_and_a_half_times_slower_than_nine_tenths(tmp_path):
    netbed.skip_unless_available(limits=True)
    netbed.remove_stale()
    seen = {cpus: _profile_in(cpus, k, tmp_path / f"host-{cpus}.yaml") for k, cpus in enumerate(SHARES)}
    for cpus, got in seen.items():
        quota = got["cpu_quota"]
        assert quota["read"] is True and quota["cores"] == pytest.approx(cpus, rel=0.01), quota
        assert quota["period_us"] == netbed_limits.PERIOD_US and quota["sample_ms"] == {1: 50.0}, quota
        assert f"CPU quota {cpus:.3g} cores" in got["profile"].description
        # the burst probe: CPU a thread runs at full speed after idle before the first stall (quota.burst)
        quota_ms = cpus * netbed_limits.PERIOD_US / 1e3
        assert quota["burst_ms"] is not None and quota_ms / 2 <= quota["burst_ms"] <= 8 * quota_ms / cpus, quota
        assert got["profile"].cpu_quota_burst_ms == quota["burst_ms"]
    slow, fast = (seen[c]["profile"].figures(1).gflops for c in SHARES)
    ratios = {k: fast[k] / slow[k] for k in RATES}
    if any(seen[c]["verdict"] != "quiet" for c in SHARES):  # the quotas are recorded; the ratio needs them met
        pytest.skip(f"the machine was busy while profiling (rates {ratios} apart): the hosts got less than their "
                    "quotas, so the quotas' ratio cannot show")
    assert all(2.5 <= r <= 5 for r in ratios.values()), ratios


def test_inside_a_testbed_host_the_share_is_measured_where_the_quota_cannot_be_read(tmp_path):
    """`ip netns exec` remounts /sys, so a testbed host's process cannot read its cgroup's files: the profile
    says so, measures the share a spinning thread gets (at most the quota's 0.25), and takes the long samples
    of an unknown period."""
    netbed.skip_unless_available(limits=True)
    out = tmp_path / "host.yaml"
    argv = [sys.executable, "-m", "edgec.compiler", "profile", "--quick", "--threads", "1", "-o", str(out)]
    with netbed.Testbed(["dev"], 100, limits={"dev": HostLimits(cpus=0.25)}) as tb:
        proc = tb.run("dev", argv, timeout=1200, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    quota = yaml.safe_load(out.read_text())["cpu_quota"]
    assert quota["read"] is False and quota["cores"] is None and "ip netns exec" in quota["source"], quota
    assert 0.1 <= quota["measured_share"] <= 0.3 and quota["sample_ms"] == {1: 50.0}, quota
    assert "CPU quota" not in load_profile(str(out)).description
