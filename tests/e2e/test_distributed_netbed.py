"""edgec across machines, on a shaped network (issue 10, item 7): network namespaces joined on a bridge
(tests/netbed.py), each device link shaped to the cluster's 100 Mbps, an `edgec worker` in each device's
namespace with only its own secret key, and `edgec run --verify` from an unshaped coordinator namespace.

Needs root, iproute2 and the kernel's namespaces/tc; elsewhere every test here skips with the reason
(EDGEC_REQUIRE_NETBED=1 makes that a failure).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import netbed
from tests.e2e.netbed_cluster import (ClusterError, Worker, cluster_doc, deal_keys, keygen, run_json,
                                      shaped_bytes, start_workers, write_yaml)
from tests.netbed import Testbed

MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
DEVICES = ("dev-a", "dev-b")
MBPS = 100
PORT = 7000
RUN_TIMEOUT = 120.0


@dataclass
class Cluster:
    tb: Testbed
    build: Path
    coord_keys: Path
    summary: dict  # `edgec compile --json`
    workers: dict[str, Worker]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """tinyconv compiled as a two-stage pipeline dev-a -> dev-b, and a worker serving each device."""
    netbed.skip_unless_available()
    tmp = tmp_path_factory.mktemp("netbed-cluster")
    with Testbed(["coord", *DEVICES], MBPS, unshaped=["coord"]) as tb:
        keygen(tb, "coord", tmp / "keys", DEVICES)
        dealt = deal_keys(tmp / "keys", tmp / "machines", ["coordinator", *DEVICES])
        cluster_file = write_yaml(tmp / "cluster.yaml", cluster_doc(tb, {d: "rpi5" for d in DEVICES}, MBPS, PORT))
        build = tmp / "build"
        summary, _ = run_json(tb, "coord", ["compile", str(MODELS / "tinyconv.onnx"), "--devices", str(cluster_file),
                                            "-o", str(build), "--strategy", "pipeline", "--objective", "throughput"],
                              timeout=RUN_TIMEOUT)
        assert [(d["name"], len(d["fragments"])) for d in summary["devices"]] == [("dev-a", 1), ("dev-b", 1)]
        assert summary["bytes_transferred"] > 0
        workers = start_workers(tb, {d: dealt[d] for d in DEVICES}, tmp, port=PORT, threads=1)
        try:
            yield Cluster(tb, build, dealt["coordinator"], summary, workers)
        finally:
            codes = {name: w.stop() for name, w in workers.items()}
        # SIGTERM ends a worker cleanly (issue 10, item 1), after it served every run of this module.
        assert codes == {d: 0 for d in DEVICES}, {n: (c, workers[n].log()) for n, c in codes.items()}


def _run(cluster: Cluster, *extra: str) -> tuple[dict, dict[str, int]]:
    """`edgec run --verify` from the coordinator; the JSON report and the bytes each device sent over its
    shaped links meanwhile."""
    tb = cluster.tb
    before = {d: shaped_bytes(tb, d) for d in DEVICES}
    try:
        report, _ = run_json(tb, "coord", ["run", str(cluster.build), "--keys", str(cluster.coord_keys),
                                           "--random-inputs", "--seed", "5", "--verify", *extra], timeout=RUN_TIMEOUT)
    except ClusterError as exc:
        logs = "\n".join(f"--- {n}:\n{w.log()[-2000:]}" for n, w in cluster.workers.items())
        raise AssertionError(f"{exc}\n{logs}") from None
    return report, {d: shaped_bytes(tb, d) - before[d] for d in DEVICES}


def _check_distributed(cluster: Cluster, report: dict, sent: dict[str, int], requests: int) -> None:
    """Outputs verified; every device ran every request on its worker at its testbed address; the
    activation went dev-a -> dev-b over their shaped link, not through the coordinator."""
    assert report["verify"]["passed"], report["verify"]
    devices = report["devices"]
    for d in DEVICES:
        assert devices[d]["local"] is False, devices[d]
        assert devices[d]["address"] == f"tcp://{cluster.tb.address(d)}:{PORT}", devices[d]
        assert devices[d]["requests"] == requests, devices[d]
    tensor_bytes = requests * cluster.summary["bytes_transferred"]
    assert devices["dev-a"]["bytes_sent"] >= tensor_bytes, devices["dev-a"]
    assert devices["dev-b"]["bytes_received"] >= tensor_bytes, devices["dev-b"]
    # The link carries the tensors plus framing and TCP: its counter is at least what the worker sent.
    assert sent["dev-a"] >= devices["dev-a"]["bytes_sent"], sent
    # dev-b's results go to the coordinator: towards dev-a it sends only TCP acknowledgements.
    assert sent["dev-b"] < tensor_bytes / 2, sent


def test_barrier_run_verifies_across_namespaces(cluster):
    report, sent = _run(cluster, "--inflight", "1", "--repeat", "3")
    assert report["inflight"] == 1
    assert len(report["latencies_ms"]) == 3
    _check_distributed(cluster, report, sent, requests=4)  # 3 timed after one warm-up


def test_streaming_run_verifies(cluster):
    report, sent = _run(cluster, "--inflight", "2", "--repeat", "20")
    assert report["inflight"] == 2
    assert len(report["latencies_ms"]) == 20
    assert report["throughput_ips"] > 0
    _check_distributed(cluster, report, sent, requests=21)


def test_second_run_sends_no_fragments(cluster):
    """A worker outlives a run and keeps its fragments by hash: the next run of the same build sends none."""
    _run(cluster, "--inflight", "1")
    report, _ = _run(cluster, "--inflight", "1")
    assert {d: report["devices"][d]["fragment_bytes_sent"] for d in DEVICES} == {d: 0 for d in DEVICES}
    assert report["verify"]["passed"]
