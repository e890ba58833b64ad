"""A worker keeps its heap (worker.keep_heap): a message's buffers do not cost fresh pages on every request."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgec.runtime.profile.fixed import _exchange_build
from edgec.runtime.coordinator.pool import WorkerPool
from edgec.runtime.manifest.load import load_manifest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not Path("/proc/self/stat").exists(),
                                reason="glibc's allocator and Linux /proc")

# Two buffers of about 1 MiB made and freed again and again, as a worker's frames and tensors of a message are;
# prints the minor page faults per round.
_ROUNDS = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from edgec.runtime.device.worker import keep_heap
    assert keep_heap()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    a = np.ones(1 << 20, np.uint8); b = np.ones((1 << 20) + 4096, np.uint8); del a, b
f0 = faults()
for _ in range(50):
    a = np.ones(1 << 20, np.uint8); b = np.ones((1 << 20) + 4096, np.uint8); del a, b
print((faults() - f0) / 50)
"""


def faults_per_round(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, check=True)
    return float(out.stdout)


def test_keep_heap_serves_large_buffers_again_without_fresh_pages():
    # glibc's defaults: the freed 2 MiB goes back to the OS each round, and its 512 pages fault in again
    assert faults_per_round("defaults") > 100
    assert faults_per_round("keep") < 4


def minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def test_workers_exchanging_a_1_mib_tensor_take_no_fresh_pages_per_request(tmp_path):
    # a to b and back, 1 MiB each way (the profile's message build): 256 pages per copy of the tensor; with
    # glibc's defaults each worker faulted in 240-350 pages per request here (2026-11-27), now below 1
    large = 1 << 20
    manifest = load_manifest(_exchange_build(tmp_path, large, "l"))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, large // 4)).astype(np.float32)}
    with WorkerPool(manifest, threads=1, timeout=30.0) as cluster:
        for _ in range(5):
            cluster.infer(feeds)
        pids = [w.proc.pid for w in cluster.workers.values()]
        before = [minor_faults(p) for p in pids]
        for _ in range(20):
            outputs, _, _ = cluster.infer(feeds)
        per_request = [(minor_faults(p) - b) / 20 for p, b in zip(pids, before)]
    np.testing.assert_array_equal(outputs["y"], np.maximum(feeds["x"], 0))
    assert max(per_request) < 16, per_request
