"""An edgec cluster on a tests/netbed.py Testbed, deployed as README's three steps: `edgec keygen`, an `edgec
worker` on each device host, `edgec run` from the coordinator host. Shared by tests/e2e/test_distributed_netbed.py
and tests/bench/bench_distributed.py.

Every command is this interpreter's `edgec` (`python -m edgec.compiler`): `ip netns exec` keeps the environment,
but PATH need not lead to the same install inside a namespace.
"""

from __future__ import annotations

import json
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from tests.netbed import Testbed

EDGEC = (sys.executable, "-m", "edgec.compiler")
LISTENING = "edgec worker: listening on "


class ClusterError(RuntimeError):
    """An edgec command on the testbed failed or misbehaved; the message quotes what it printed."""


def edgec_argv(*args: str) -> list[str]:
    return [*EDGEC, *args]


def deal_keys(keys: Path, dest: Path, members: Sequence[str]) -> dict[str, Path]:
    """What each machine gets in a real deployment: everyone's public/ folder and its own secret key only.
    `keys` is the folder `edgec keygen` wrote; returns each member's folder under `dest`."""
    dealt = {}
    for name in members:
        folder = dest / name
        shutil.copytree(keys / "public", folder / "public")
        (folder / "private").mkdir(mode=0o700)
        secret = folder / "private" / f"{name}.key_secret"
        shutil.copy2(keys / "private" / f"{name}.key_secret", secret)
        secret.chmod(0o600)
        dealt[name] = folder
    return dealt


def keygen(tb: Testbed, host: str, folder: Path, devices: Sequence[str]) -> None:
    """`edgec keygen` on `host` for the devices and the coordinator."""
    names = [arg for d in devices for arg in ("--name", d)]
    done = tb.run(host, edgec_argv("keygen", str(folder), *names), capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ClusterError(f"edgec keygen exited {done.returncode}: {done.stderr.strip()}")


def cluster_doc(tb: Testbed, profiles: Mapping[str, str], mbps: float, port: int) -> dict:
    """cluster.yaml for devices named as the testbed's hosts, each at its testbed address. The network has
    no latency beyond queueing: netem is not available, so the testbed adds none (tests/netbed.py)."""
    return {"devices": [{"name": name, "profile": profile, "address": f"tcp://{tb.address(name)}:{port}"}
                        for name, profile in profiles.items()],
            "network": {"bandwidth_mbps": mbps, "latency_ms": 0, "medium": tb.medium}}


def write_yaml(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class Worker:
    """`edgec worker` inside a testbed host's namespace, listening on the host's address; stderr goes to
    `folder`/worker.log, fragments to `folder`/cache."""

    def __init__(self, tb: Testbed, host: str, keys: Path, folder: Path, *, port: int, threads: int,
                 start_timeout: float = 30.0, extra: Sequence[str] = ()):
        self.host = host
        folder.mkdir(parents=True, exist_ok=True)
        self.log_file = folder / "worker.log"
        listen = f"tcp://{tb.address(host)}:{port}"
        argv = edgec_argv("worker", "--listen", listen, "--keys", str(keys), "--name", host,
                          "--cache", str(folder / "cache"), "--threads", str(threads), *extra)
        with open(self.log_file, "ab") as log:
            self.proc = tb.popen(host, argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
        line = self._first_line(start_timeout)
        if line != f"{LISTENING}{listen}":
            self.stop()
            raise ClusterError(f"worker on {host}: expected '{LISTENING}{listen}', got {line!r}; log:\n{self.log()}")
        self.address = listen

    def _first_line(self, timeout: float) -> str:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return f"<nothing within {timeout:g} s>"
        return self.proc.stdout.readline().rstrip("\n") or f"<exited {self.proc.wait()}>"

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL, as a device that loses power: no goodbye, its connections drop. `ip netns exec` execs the
        worker in place, so the process started is the worker itself."""
        if self.proc.poll() is None:
            self.proc.kill()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, as an operator stops it; its exit code, or None when it had to be killed."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        finally:
            self.proc.stdout.close()


def start_workers(tb: Testbed, keys: Mapping[str, Path], folder: Path, *, port: int, threads: int,
                  extra: Sequence[str] = ()) -> dict[str, Worker]:
    """One worker per host named in `keys` (host -> its keys folder); all stopped again if one fails to start."""
    started: dict[str, Worker] = {}
    try:
        for host, key_folder in keys.items():
            started[host] = Worker(tb, host, key_folder, folder / f"worker-{host}", port=port, threads=threads,
                                   extra=extra)
    except BaseException:
        for w in started.values():
            w.stop()
        raise
    return started


def deploy(tb: Testbed, coordinator_host: str, devices: Sequence[str], folder: Path, *, port: int, threads: int,
           extra: Sequence[str] = ()) -> tuple[Path, dict[str, Worker]]:
    """README's first two steps: `edgec keygen` on the coordinator host, the keys dealt out (deal_keys), a worker
    started on each device host. Returns the coordinator's keys folder and the workers; on failure no worker
    is left running."""
    keygen(tb, coordinator_host, folder / "keys", devices)
    dealt = deal_keys(folder / "keys", folder / "machines", ["coordinator", *devices])
    workers = start_workers(tb, {d: dealt[d] for d in devices}, folder, port=port, threads=threads, extra=extra)
    return dealt["coordinator"], workers


def run_json(tb: Testbed, host: str, args: Sequence[str], *, timeout: float) -> tuple[dict, float]:
    """`edgec ARGS --json` on `host`: the JSON object it printed and the wall time; an exit code other
    than 0 is a ClusterError quoting the end of stderr."""
    start = time.perf_counter()
    try:
        done = tb.run(host, edgec_argv(*args, "--json"), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"edgec {' '.join(args)}: no answer within {timeout:g} s") from exc
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise ClusterError(f"edgec {' '.join(args)} exited {done.returncode}:\n{tail}")
    try:
        return json.loads(done.stdout), elapsed
    except json.JSONDecodeError as exc:
        raise ClusterError(f"edgec {' '.join(args)}: stdout is not one JSON object ({exc}): {done.stdout[:500]!r}")


def shaped_bytes(tb: Testbed, host: str) -> int:
    """Bytes `host` has sent to other shaped hosts (frames, Ethernet headers included): its tbf queues see
    only that traffic; what goes to an unshaped coordinator bypasses them."""
    ns = tb.namespace(host)
    return sum(q["bytes"] for q in tb.qdisc_stats() if q["ns"] == ns)
