"""bench_fidelity's part hetero: devices of different CPU shares on a tests/netbed.py testbed, each profiled in its
own cgroup, with a worker in each (fidelity_part_hetero.py measures on it).

The testbed: an unshaped coordinator host and one device host per share, dev-a, dev-b, ... (the largest share
first), on a switched medium shaped to one bandwidth (tbf's bucket as part testbed's, fidelity_testbed.burst_ms).
Each device host gets a CFS quota of its share (tests/netbed_limits.py, a 5 ms period) and no memory limit; with
`cpu_weight`, every host (the coordinator too) also gets that CPU weight, so that other jobs on a shared machine
take less of the hosts' quotas (a quota caps a host; a weight is what it gets first when cores are contended).

Profiles.  Each device is profiled with `edgec profile --threads 1` inside its host's cgroups (joined as its worker
joins them, tests/netbed_limits.join_argv), one device after another so that no two profiles compete for this
machine's cores or memory bandwidth.  The profile runs outside the host's network namespace: `ip netns exec`
remounts /sys and hides the cgroup's files, and with them in reach the profile reads the quota (its `cpu_quota:`
says read: true and the cores) and sizes its samples to the known 5 ms period, where inside the namespace it
would have to infer the share from a spinning thread.  The network namespace changes nothing a profile times.

What the devices share.  Their quotas add up to less than this machine's cores (bench_fidelity checks the shares
leave the coordinator a quarter core), so the CPU is partitioned and the cluster files have no `hosts:`: a host
entry would charge each device's busy time, already stretched by its quota, to the machine's cores a second
time.  They do share the machine's memory bandwidth and caches, which neither the planner nor the profiles
(each made alone) see: a streamed plan runs its stages at once, so a model whose kernels wait on memory runs its
stages slower together than each profiled alone.  The part reports that as it falls (throughput measured below
predicted on the memory-heavy models); it does not correct for it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: tests.* are imported from the checkout
    sys.path.insert(0, str(ROOT))

from fidelity_common import EDGEC, loadavg, log, profile_load  # noqa: E402
from fidelity_testbed import TestbedCluster, burst_ms  # noqa: E402
from tests import netbed_limits  # noqa: E402
from tests.e2e.netbed_cluster import ClusterError, cluster_doc, deploy, write_yaml  # noqa: E402
from tests.netbed import HostLimits, Testbed  # noqa: E402

COORDINATOR = "coord"
PORT = 7100
THREADS = 1  # each worker's onnxruntime threads, and the profiles'
PROFILE_TIMEOUT_S = 3600  # a full profile at a fifth of a core takes many minutes


def device_names(shares: list[float]) -> list[str]:
    """dev-a, dev-b, ... for the shares in the order given."""
    return [f"dev-{chr(ord('a') + i)}" for i in range(len(shares))]


def profile_in_host(tb: Testbed, host: str, out: Path, *, quick: bool) -> dict:
    """`edgec profile --threads 1` into `out`, in the cgroups of testbed host `host` (outside its network
    namespace: see the module's docstring); a record of it: its quota, load verdict, timing spread, time taken."""
    argv = [*EDGEC, "profile", "--threads", str(THREADS), *(["--quick"] * quick), "-o", str(out)]
    before, t0 = loadavg(), time.perf_counter()
    done = subprocess.run(netbed_limits.join_argv(tb.cgroups(host), argv), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=PROFILE_TIMEOUT_S)
    if done.returncode != 0:
        raise ClusterError(f"edgec profile on {host} exited {done.returncode}: "
                           f"{' / '.join(done.stderr.strip().splitlines()[-3:])}")
    doc = yaml.safe_load(out.read_text())
    return {"device": host, "profile": str(out), "cpu_quota": doc.get("cpu_quota"),
            "seconds": round(time.perf_counter() - t0, 1), "loadavg_before": before, "loadavg_after": loadavg(),
            **profile_load(doc)}


class HeteroCluster(TestbedCluster):  # run() and worker_logs() as the testbed part's; its own set-up
    """A testbed at `mbps` whose device hosts have the CPU `shares`, each profiled in its cgroup (`profiles`,
    `profile_records`), a worker on each, the cluster file of all devices (`cluster`) and one per device
    (`single[device]`), and `run` for `edgec run` from the coordinator host.  Leaving the `with` stops the workers
    and removes the testbed (namespaces and cgroups), whatever the body raised, Ctrl-C included."""

    __test__ = False

    def __init__(self, shares: list[float], mbps: float, folder: Path, warmup: int, quick_profile: bool,
                 cpu_weight: int | None = None):
        self.shares, self.mbps, self.folder, self.warmup, self.quick = shares, mbps, folder, warmup, quick_profile
        self.devices = device_names(shares)
        limits = {d: HostLimits(cpus=s, cpu_weight=cpu_weight) for d, s in zip(self.devices, shares)}
        if cpu_weight:
            limits[COORDINATOR] = HostLimits(cpu_weight=cpu_weight)
        self._tb = Testbed([COORDINATOR, *self.devices], mbps, medium="switched", unshaped=[COORDINATOR],
                           burst_ms=burst_ms(mbps), limits=limits)
        self.workers: dict = {}
        self.profiles: dict[str, Path] = {}
        self.profile_records: dict[str, dict] = {}
        self.stop_codes: dict[str, int | None] = {}

    def __enter__(self) -> HeteroCluster:
        self._tb.__enter__()
        try:
            for device, share in zip(self.devices, self.shares):
                self.profiles[device], self.profile_records[device] = self._profile(device, share)
            self.coord_keys, self.workers = deploy(self._tb, COORDINATOR, self.devices, self.folder, port=PORT,
                                                   threads=THREADS)
            self.cluster = self._cluster_file("all", self.devices)
            self.single = {d: self._cluster_file(d, [d]) for d in self.devices}
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stop_codes = {name: w.stop() for name, w in self.workers.items()}
        finally:
            self._tb.__exit__(exc_type, exc, tb)

    def _profile(self, device: str, share: float, suffix: str = "") -> tuple[Path, dict]:
        out = self.folder / f"profile{suffix}-{device}.yaml"
        log(f"hetero: profiling {device}{suffix.replace('-', ' ')} at {share:g} cores{' (--quick)' * self.quick} "
            f"(load average {loadavg()})")
        record = profile_in_host(self._tb, device, out, quick=self.quick)
        record["share"] = share
        log(f"hetero: {device} profiled in {record['seconds']:.0f} s, quota {record['cpu_quota']}")
        return out, record

    def profile_again(self) -> tuple[dict[str, Path], dict[str, dict]]:
        """Every device profiled once more, as before the runs (profile-after-<device>.yaml): whether the machine
        still runs as its profiles said (fidelity_part_hetero.drift); ({device: profile}, {device: record})."""
        paths, records = {}, {}
        for device, share in zip(self.devices, self.shares):
            paths[device], records[device] = self._profile(device, share, "-after")
        return paths, records

    def single_file(self, device: str, profile: Path, name: str) -> Path:
        """A one-device cluster file of `device` with `profile` (cluster-<name>.yaml)."""
        return self._cluster_file(name, [device], {device: profile})

    def _cluster_file(self, name: str, devices: list[str], profiles: dict[str, Path] | None = None) -> Path:
        profiles = self.profiles if profiles is None else profiles
        doc = cluster_doc(self._tb, {d: str(profiles[d]) for d in devices}, self.mbps, PORT)
        for d in doc["devices"]:
            d["threads"] = THREADS
        if len(devices) == 1:
            doc.pop("network")  # one device: nothing to price between devices
        return write_yaml(self.folder / f"cluster-{name}.yaml", doc)
