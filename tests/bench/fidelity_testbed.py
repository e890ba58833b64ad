"""bench_fidelity's part testbed: an edgec cluster deployed on a tests/netbed.py network, as bench_distributed
deploys it (an unshaped coordinator host, two device hosts on a switched medium shaped to one bandwidth, `edgec
keygen`, an `edgec worker --threads 1` on each device host), and `edgec run` from the coordinator host.

The cluster files say the device hosts' workers and the coordinator share this machine's cores (`hosts:`,
benchlib.on_this_machine): the hosts are namespaces of this machine, so the planner has to bound
throughput by its cores as it does for bench_fidelity's local clusters.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: tests.* are imported from the checkout
    sys.path.insert(0, str(ROOT))

from benchlib import on_this_machine  # noqa: E402  (tests/bench is sys.path[0] when run as a script)
from tests.e2e.netbed_cluster import ClusterError, cluster_doc, deploy, run_json, write_yaml  # noqa: E402
from tests.netbed import Testbed  # noqa: E402

COORDINATOR = "coord"
DEVICES = ("dev-a", "dev-b")
SINGLE_DEVICE = DEVICES[0]
PORT = 7000
THREADS = 1  # each worker's onnxruntime threads: the profile's thread count
# tbf's bucket (tests/netbed.py) lets a message that finds its link idle through at once up to the burst, where the
# planner prices bytes / bandwidth: with netbed's default 4 ms, a 60 KB message crossed a 100 Mbps link in 0.19 of
# its price and the spatial plans' halos in 0.42-0.55.  A smaller bucket has to keep the rate while both workers
# compute: measured here (2026-11-26) with two busy processes on the two cores, 100 Mbps held 0.99-1.01 of its rate
# on 0.25-4 ms buckets, while 1000 Mbps fell to 0.6 of it on 0.25-0.5 ms (and held on 1-4 ms, whose 130-520 KB
# hold the halos whole anyway).  So up to SMALL_BURST_MBPS the testbed part (and bench_distributed) shapes with a
# 0.5 ms bucket, where a 60 KB message took 0.92 of its price and 120 KB 0.96, and keeps netbed's 4 ms above.
SMALL_BURST_MBPS = 100.0
SMALL_BURST_MS = 0.5
DEFAULT_BURST_MS = 4.0


def burst_ms(mbps: float) -> float:
    """The tbf bucket, in ms at the link's rate, the testbed part shapes an `mbps` link with."""
    return SMALL_BURST_MS if mbps <= SMALL_BURST_MBPS else DEFAULT_BURST_MS


class TestbedCluster:
    """A testbed at `mbps` with a worker on each device host, the one- and two-device cluster files of
    `profile` on it, and `run` for `edgec run` from the coordinator host.  Leaving the `with` stops the
    workers and removes the testbed, whatever the body raised."""

    __test__ = False  # a bench helper, not a pytest test class

    def __init__(self, mbps: float, profile: Path, folder: Path, warmup: int):
        self.mbps, self.profile, self.folder, self.warmup = mbps, profile, folder, warmup
        self._tb = Testbed([COORDINATOR, *DEVICES], mbps, medium="switched", unshaped=[COORDINATOR],
                           burst_ms=burst_ms(mbps))
        self.workers: dict = {}
        self.stop_codes: dict[str, int | None] = {}  # each worker's exit code on SIGTERM (None: it had to be killed)

    def __enter__(self) -> TestbedCluster:
        self._tb.__enter__()
        try:
            self.coord_keys, self.workers = deploy(self._tb, COORDINATOR, DEVICES, self.folder, port=PORT,
                                                   threads=THREADS)
            self.one = self._cluster_file("one", (SINGLE_DEVICE,))
            self.two = self._cluster_file("two", DEVICES)
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stop_codes = {name: w.stop() for name, w in self.workers.items()}
        finally:
            self._tb.__exit__(exc_type, exc, tb)

    def _cluster_file(self, name: str, devices: tuple[str, ...]) -> Path:
        doc = cluster_doc(self._tb, {d: str(self.profile) for d in devices}, self.mbps, PORT)
        return write_yaml(self.folder / f"cluster-{name}.yaml", on_this_machine(doc, THREADS))

    def run(self, build: Path, repeat: int, *flags: str) -> dict:
        """`edgec run --warmup W --repeat N --random-inputs --verify --json FLAGS` from the coordinator host; its
        report.  A run that fails, or whose outputs differ from the source model's, is a ClusterError."""
        args = ["run", str(build / "manifest.json"), "--keys", str(self.coord_keys), "--random-inputs", "--verify",
                "--warmup", str(self.warmup), "--repeat", str(repeat), *map(str, flags)]
        report, _ = run_json(self._tb, COORDINATOR, args, timeout=120 + 60 * (repeat + self.warmup))
        if not (report.get("verify") or {}).get("passed"):
            raise ClusterError(f"edgec run {build.name} {' '.join(map(str, flags))}: outputs did not verify: "
                               f"{report.get('verify')}")
        return report

    def worker_logs(self, lines: int = 5) -> dict[str, list[str]]:
        return {name: w.log().strip().splitlines()[-lines:] for name, w in self.workers.items()}
