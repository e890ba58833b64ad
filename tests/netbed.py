"""A shaped network for tests: each host is a network namespace on a bridge, its links shaped with tbf.

    with Testbed(["coord", "a", "b"], {("a", "b"): 20}, unshaped=["coord"]) as tb:
        worker = tb.popen("b", ["edgec", "worker", "--listen", f"tcp://{tb.address('b')}:5555"])
        tb.run("coord", ["edgec", "run", ...], check=True)
        tb.bytes_sent("a")

Topology. A "switch" namespace holds a bridge; every host gets its own namespace with one interface,
eth0, whose veth peer is a bridge port. Addresses come from a private subnet (10.241.0.0/24 unless told)
and exist only inside these namespaces: nothing is created in, routed to or shaped on the host's own
network, so a test cannot reach (or disturb) anything outside the testbed.

Shaping follows the planner's two network models (compiler/cluster/ `medium`):
- switched: each pair of hosts has its own link. Every host's egress is an HTB root that only
  classifies (one class per destination, by destination address, through a u32 filter); each class
  holds a tbf at that pair's rate. HTB's own rate is ten times the tbf's, so tbf alone sets the pace.
  The two directions of a pair are shaped separately (full duplex, as switched Ethernet is), whereas the
  planner's throughput bound charges both directions of a pair to one link.
- shared: one channel for everyone. Every bridge port redirects what it receives to one ifb device in
  the switch namespace, and that ifb's egress is a single tbf, so all transfers queue for one rate.
Hosts listed in `unshaped` (a coordinator, say, whose input and output transfers the planner treats
as free) talk to everyone at veth speed.

tbf parameters (see `tbf_params`), chosen for 10-1000 Mbps:
- rate: by default the bandwidth is the TCP payload rate, as iperf3 reports it and as the planner
  uses it (tensor bytes / bandwidth), so the wire rate is scaled by 1514/1448: a full-size Ethernet
  frame carries 1448 bytes of TCP payload (MTU 1500, IPv4 and TCP headers with timestamps).
  `payload_rate=False` shapes the raw frame rate instead.
- burst: 4 ms at the wire rate, at least two full frames (3028 B). The bucket has to absorb the delay
  between the moment tbf may send and the moment its timer actually runs: on a busy two-core machine
  a 20 Mbps link measured 0.92-0.98x its rate with 1 ms, 0.97-1.00x with 4 ms.
  In exchange, a message that finds its link idle sends its first 4 ms worth at once and arrives up to
  4 ms early: small against the tens to hundreds of ms a tensor takes at 10-1000 Mbps. Each host's GSO
  size is capped at its smallest burst so that tbf never has to split (and partly drop) a 64 KB GSO
  packet.
- limit: burst plus 200 ms of traffic at the wire rate. netem is not available, so queueing is the only
  source of delay. In trials here one bulk TCP flow (bbr or cubic) dropped nothing with 200 ms at 10,
  20, 100, 300 and 1000 Mbps, where 50 and 100 ms queues dropped 17% and 2% of a 10 Mbps flow's
  packets; drops mean retransmissions and stalls the planner does not model. The limit also bounds how
  long a small message (a heartbeat) can wait behind a bulk transfer on the same link.

CPU and memory: `limits={"a": HostLimits(cpus=0.25, memory_mb=512)}` puts host a's processes in cgroups with
a CFS quota of a quarter core and a 512 MiB memory limit (tests/netbed_limits.py: which files, the CFS period
and why); everything started through `popen`/`run`/`exec_argv` joins them before entering the namespace.

Cleanup: `__exit__` ends the processes started through the testbed (and anything else still inside
its namespaces or cgroups), then deletes the namespaces, which takes their veths, bridge, ifb and qdiscs
with them, and the cgroups; it runs when the body raises or is interrupted too. Names are
netbed-<pid>-<seq>-<role> (a host's cgroups are named as its namespace), so runs in parallel never clash,
and `remove_stale()` (called on every entry) deletes the namespaces and cgroups of runs whose process is
gone (a killed pytest).

Use `unavailable_reason()` (or `skip_unless_available()` inside pytest) before building one: it needs
root, iproute2 (`apt-get install -y iproute2`) and a kernel with network namespaces, veth, bridge, HTB,
tbf and u32 (plus ifb, the ingress qdisc and mirred for a shared medium); with `limits=True`, also the cpu
and memory cgroup controllers.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from tests import netbed_limits
from tests.netbed_limits import CgroupError, HostLimits

__all__ = ["HostLimits", "Testbed", "TestbedError", "remove_stale", "skip_unless_available", "tbf_params",
           "unavailable_reason"]

PREFIX = "netbed"
MEDIUMS = ("switched", "shared")
FRAME_BYTES = 1514  # MTU 1500 plus the 14-byte Ethernet header: what tbf counts per full packet
TCP_PAYLOAD_BYTES = 1448  # 1500 - 20 (IPv4) - 20 (TCP) - 12 (timestamps option)
MAX_MBPS = 10_000.0
GSO_DEFAULT = 65536
HOST_IF = "eth0"
SHARED_IF = "shared0"
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-(sw|probe|h\d+)$")
_SEQ = itertools.count()
_PROBED: dict[str, str | None] = {}


class TestbedError(RuntimeError):
    """A command that builds or removes the testbed failed; the message names it and quotes its error."""

    __test__ = False  # a library class, not a pytest test class


@dataclass(frozen=True)
class TbfParams:
    rate_bit: int  # tbf `rate`, bits per second on the wire (frames, Ethernet header included)
    burst: int  # bytes in the bucket
    limit: int  # bytes that may wait in the queue

    def args(self) -> list[str]:
        return ["tbf", "rate", f"{self.rate_bit}bit", "burst", str(self.burst), "limit", str(self.limit)]


def tbf_params(mbps: float, *, burst_ms: float = 4.0, queue_ms: float = 200.0, payload_rate: bool = True) -> TbfParams:
    """tbf settings for a link of `mbps` megabits per second (10^6 bit/s); see the module docstring."""
    if not (math.isfinite(burst_ms) and burst_ms > 0 and math.isfinite(queue_ms) and queue_ms >= 0):
        raise ValueError(f"burst_ms must be > 0 and queue_ms >= 0, not {burst_ms!r} and {queue_ms!r}")
    wire_bps = mbps * 1e6 * (FRAME_BYTES / TCP_PAYLOAD_BYTES if payload_rate else 1.0)
    bytes_per_ms = wire_bps / 8 / 1000
    burst = max(2 * FRAME_BYTES, math.ceil(bytes_per_ms * burst_ms))
    return TbfParams(rate_bit=round(wire_bps), burst=burst, limit=burst + math.ceil(bytes_per_ms * queue_ms))


def _cmd(argv: Sequence[str], what: str, timeout: float = 30.0) -> str:
    """Run one ip/tc command; its failure is a TestbedError quoting the command and its stderr."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TestbedError(f"{what}: `{' '.join(argv)}`: {e}") from None
    if done.returncode != 0:
        err = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[0]
        raise TestbedError(f"{what}: `{' '.join(argv)}`: {err}")
    return done.stdout


def _netns_list() -> list[str]:
    out = _cmd(["ip", "netns", "list"], "list network namespaces")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(ns: str) -> None:
    """SIGKILL whatever still runs inside namespace `ns`: a namespace with processes outlives its name."""
    try:
        out = _cmd(["ip", "netns", "pids", ns], f"list processes in {ns}")
    except TestbedError:
        return  # the namespace is already gone
    for pid in (int(p) for p in out.split() if p.isdigit()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _delete_ns(ns: str) -> None:
    _kill_inside(ns)
    _cmd(["ip", "netns", "del", ns], f"delete namespace {ns}")


def _is_stale(name: str) -> bool:
    m = _NAME_RE.match(name)
    return bool(m) and not _pid_alive(int(m.group(1)))


def remove_stale() -> list[str]:
    """Delete this fixture's namespaces and cgroups left by processes that no longer exist; return the
    namespaces' names and the cgroups' paths."""
    removed = []
    for ns in filter(_is_stale, _netns_list()):
        try:
            _delete_ns(ns)
        except TestbedError:
            if ns in _netns_list():  # not a concurrent run that removed it first
                raise
        removed.append(ns)
    try:
        for path in netbed_limits.stale(_is_stale):
            netbed_limits.remove(path)
            removed.append(str(path))
    except CgroupError as e:
        raise TestbedError(f"remove a stale cgroup: {e}") from None
    return removed


def _probe(medium: str) -> str | None:
    """Build the smallest version of what a Testbed needs in a throwaway namespace; why it fails, or None."""
    ns = f"{PREFIX}-{os.getpid()}-{next(_SEQ)}-probe"
    steps = [
        (["ip", "netns", "add", ns], "cannot create a network namespace"),
        (["ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1"], "no veth support"),
        (["ip", "-n", ns, "link", "add", "br0", "type", "bridge"], "no bridge support"),
        (["tc", "-n", ns, "qdisc", "add", "dev", "v0", "root", "handle", "1:", "htb"], "no HTB qdisc"),
        (["tc", "-n", ns, "class", "add", "dev", "v0", "parent", "1:", "classid", "1:2", "htb", "rate", "1gbit"],
         "no HTB classes"),
        (["tc", "-n", ns, "qdisc", "add", "dev", "v0", "parent", "1:2", "handle", "2:", *tbf_params(10).args()],
         "no tbf qdisc"),
        (["tc", "-n", ns, "filter", "add", "dev", "v0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
          "match", "ip", "dst", "10.241.0.2/32", "flowid", "1:2"], "no u32 classifier"),
    ]
    if medium == "shared":
        steps += [
            (["ip", "-n", ns, "link", "add", SHARED_IF, "type", "ifb"], "no ifb device"),
            (["tc", "-n", ns, "qdisc", "add", "dev", "v1", "handle", "ffff:", "ingress"], "no ingress qdisc"),
            (["tc", "-n", ns, "filter", "add", "dev", "v1", "parent", "ffff:", "protocol", "all", "prio", "1", "u32",
              "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", SHARED_IF],
             "no mirred action"),
        ]
    try:
        for argv, reason in steps:
            try:
                _cmd(argv, reason)
            except TestbedError as e:
                return str(e)
        return None
    finally:
        if ns in _netns_list():
            _delete_ns(ns)


def unavailable_reason(medium: str = "switched", *, limits: bool = False) -> str | None:
    """One line saying why a Testbed of this medium (with host limits if `limits`) cannot be built here, or
    None when it can."""
    if medium not in MEDIUMS:
        raise ValueError(f"medium must be one of {MEDIUMS}, not {medium!r}")
    if os.name != "posix" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network testbed needs root (network namespaces and tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"network testbed needs {' and '.join(missing)} (apt-get install -y iproute2)"
    if medium not in _PROBED:
        remove_stale()
        _PROBED[medium] = _probe(medium)
    return _PROBED[medium] or (netbed_limits.unavailable_reason() if limits else None)


def skip_unless_available(medium: str = "switched", *, limits: bool = False) -> None:
    """pytest.skip with the one-line reason when a testbed cannot be built; EDGEC_REQUIRE_NETBED=1 (CI, where
    the testbed must run) turns that skip into a failure."""
    import pytest

    reason = unavailable_reason(medium, limits=limits)
    if reason is None:
        return
    if os.environ.get("EDGEC_REQUIRE_NETBED") == "1":
        pytest.fail(f"EDGEC_REQUIRE_NETBED=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _positive_mbps(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_MBPS:
        raise ValueError(f"{what} must be a number of Mbps in (0, {MAX_MBPS:g}], not {value!r}")
    return float(value)


class Testbed:
    """Hosts in network namespaces on one bridge, shaped as a switched network or a shared medium.

    hosts: host names (any distinct strings). bandwidth_mbps: one rate for every pair, or (switched only)
    a dict {(a, b): mbps} naming every pair of shaped hosts once; a pair's rate holds in both directions.
    medium: "switched" (each pair its own link) or "shared" (one channel). unshaped: hosts whose traffic,
    to and from anyone, is not shaped. subnet: a private IPv4 network; host i gets its (i+1)-th address.
    burst_ms, queue_ms, payload_rate: the tbf parameters (`tbf_params`). limits: {host: HostLimits}, the CPU
    share and memory of the hosts named (the others are unlimited).
    """

    __test__ = False  # a library class, not a pytest test class

    def __init__(self, hosts: Sequence[str], bandwidth_mbps: float | Mapping[tuple[str, str], float], *,
                 medium: str = "switched", unshaped: Iterable[str] = (), subnet: str = "10.241.0.0/24",
                 burst_ms: float = 4.0, queue_ms: float = 200.0, payload_rate: bool = True,
                 limits: Mapping[str, HostLimits] | None = None):
        self.hosts = list(hosts)
        if not self.hosts or any(not isinstance(h, str) or not h for h in self.hosts):
            raise ValueError(f"hosts must be a non-empty list of non-empty names, not {hosts!r}")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError(f"host names repeat: {self.hosts}")
        if medium not in MEDIUMS:
            raise ValueError(f"medium must be one of {MEDIUMS}, not {medium!r}")
        self.medium = medium
        self.unshaped = frozenset(unshaped)
        if not self.unshaped <= set(self.hosts):
            raise ValueError(f"unshaped names unknown hosts: {sorted(self.unshaped - set(self.hosts))}")
        self._rates = self._pair_rates(bandwidth_mbps)
        net = ipaddress.ip_network(subnet)
        if net.version != 4 or not net.is_private or net.num_addresses - 2 < len(self.hosts):
            raise ValueError(f"subnet must be a private IPv4 network with room for {len(self.hosts)} hosts, "
                             f"not {subnet}")
        self._prefixlen = net.prefixlen
        self._addresses = {h: str(net[i + 1]) for i, h in enumerate(self.hosts)}
        self._tbf = dict(burst_ms=burst_ms, queue_ms=queue_ms, payload_rate=payload_rate)
        tbf_params(1.0, **self._tbf)  # refuse bad tbf settings now, before anything is created
        tag = f"{PREFIX}-{os.getpid()}-{next(_SEQ)}"
        self._switch_ns = f"{tag}-sw"
        self._host_ns = {h: f"{tag}-h{i}" for i, h in enumerate(self.hosts)}
        self._procs: list[subprocess.Popen] = []
        self._created: list[str] = []
        self.limits = dict(limits or {})
        if not set(self.limits) <= set(self.hosts):
            raise ValueError(f"limits names unknown hosts: {sorted(set(self.limits) - set(self.hosts))}")
        for host, lim in self.limits.items():
            if not isinstance(lim, HostLimits):
                raise ValueError(f"limits[{host!r}] must be a HostLimits, not {lim!r}")
        self._cgroups: dict[str, list[Path]] = {}  # host -> the cgroups its processes join
        self._cgroups_made: list[Path] = []

    def _pair_rates(self, bandwidth: float | Mapping[tuple[str, str], float]) -> dict[frozenset, float]:
        """Rate of every shaped pair; a shared medium keeps its one rate under the key frozenset()."""
        shaped = [h for h in self.hosts if h not in self.unshaped]
        pairs = {frozenset(p) for p in itertools.combinations(shaped, 2)}
        if not isinstance(bandwidth, Mapping):
            rate = _positive_mbps(bandwidth, "bandwidth_mbps")
            return {frozenset(): rate} if self.medium == "shared" else dict.fromkeys(pairs, rate)
        if self.medium == "shared":
            raise ValueError("a shared medium has one rate: give bandwidth_mbps as a number")
        rates: dict[frozenset, float] = {}
        for key, value in bandwidth.items():
            if not (isinstance(key, tuple) and len(key) == 2 and frozenset(key) in pairs):
                raise ValueError(f"bandwidth_mbps key {key!r} is not a pair of two shaped hosts of {shaped}")
            if frozenset(key) in rates:
                raise ValueError(f"bandwidth_mbps names the pair {key!r} twice")
            rates[frozenset(key)] = _positive_mbps(value, f"bandwidth_mbps[{key!r}]")
        missing = pairs - rates.keys()
        if missing:
            raise ValueError(f"bandwidth_mbps has no rate for {sorted(tuple(sorted(p)) for p in missing)}")
        return rates

    # -- what a test uses -----------------------------------------------------------------------------
    def address(self, host: str) -> str:
        """The host's IPv4 address; it exists only inside this testbed."""
        return self._addresses[self._known(host)]

    def namespace(self, host: str) -> str:
        return self._host_ns[self._known(host)]

    def rate_mbps(self, a: str, b: str) -> float | None:
        """The configured rate between two hosts (the shared channel's on a shared medium), None if unshaped."""
        self._known(a), self._known(b)
        if a == b or a in self.unshaped or b in self.unshaped:
            return None
        return self._rates[frozenset() if self.medium == "shared" else frozenset((a, b))]

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """argv prefixed so that it runs inside the host's namespace (and its cgroups, joined first)."""
        enter = ["ip", "netns", "exec", self.namespace(host), *argv]
        return netbed_limits.join_argv(self._cgroups.get(host, []), enter)

    def cgroups(self, host: str) -> list[Path]:
        """The cgroup directories of a limited host (v1: one per hierarchy, cpu/ and memory/; v2: one); [] when
        the host has no limits."""
        return list(self._cgroups.get(self._known(host), []))

    def popen(self, host: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start argv inside the host's namespace (subprocess.Popen keywords pass through); the testbed
        ends it on exit if it still runs."""
        proc = subprocess.Popen(self.exec_argv(host, argv), **kw)
        self._procs.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], *, timeout: float = 120.0, **kw) -> subprocess.CompletedProcess:
        """subprocess.run of argv inside the host's namespace (keywords pass through; killed after timeout)."""
        return subprocess.run(self.exec_argv(host, argv), timeout=timeout, **kw)

    def bytes_sent(self, host: str) -> int:
        """Bytes the host's interface has sent: frames with their Ethernet headers, ARP included."""
        return self._counters(host)["tx"]["bytes"]

    def bytes_received(self, host: str) -> int:
        return self._counters(host)["rx"]["bytes"]

    def qdisc_stats(self) -> list[dict]:
        """Every shaping qdisc's counters (`tc -s -j`): sent bytes, drops, overlimits, backlog, with `ns`
        and `dev` added, to tell whether a queue overflowed."""
        where = [(self._switch_ns, SHARED_IF)] if self.medium == "shared" else \
            [(self._host_ns[h], HOST_IF) for h in self.hosts if h not in self.unshaped]
        stats = []
        for ns, dev in where:
            out = _cmd(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev], f"read qdiscs of {ns}")
            stats += [dict(q, ns=ns, dev=dev) for q in json.loads(out) if q.get("kind") == "tbf"]
        return stats

    @property
    def namespaces(self) -> list[str]:
        """The namespaces this testbed created (host namespaces, then the switch's)."""
        return list(self._created)

    # -- building and removing ------------------------------------------------------------------------
    def __enter__(self) -> Testbed:
        remove_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except TestbedError as e:
            if exc is None:
                raise
            warnings.warn(f"testbed teardown after an error in its body: {e}", RuntimeWarning, stacklevel=2)

    def close(self) -> None:
        """End the testbed's processes and delete its namespaces and cgroups; safe to call twice."""
        self._stop_processes()
        errors = []
        for ns in reversed(self._created):
            try:
                _delete_ns(ns)
            except TestbedError as e:
                errors.append(str(e))
        for path in reversed(self._cgroups_made):
            try:
                netbed_limits.remove(path)
            except CgroupError as e:
                errors.append(str(e))
        left = set(self._created) & set(_netns_list())
        self._created = [ns for ns in self._created if ns in left]
        self._cgroups_made = [p for p in self._cgroups_made if p.exists()]
        if errors or left or self._cgroups_made:
            raise TestbedError("; ".join(errors) or f"still present: {sorted(left)} {self._cgroups_made}")

    def _stop_processes(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 3.0
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()

    def _add_ns(self, ns: str) -> None:
        _cmd(["ip", "netns", "add", ns], f"create namespace {ns}")
        self._created.append(ns)

    def _build(self) -> None:
        if self.limits:
            found = netbed_limits.find_controllers()
            for host, lim in self.limits.items():
                try:
                    self._cgroups[host] = netbed_limits.create(self._host_ns[host], lim, found, self._cgroups_made)
                except CgroupError as e:
                    raise TestbedError(f"limit {host}: {e}") from None
        sw = self._switch_ns
        self._add_ns(sw)
        _cmd(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"], "create the bridge")
        _cmd(["ip", "-n", sw, "link", "set", "br0", "addrgenmode", "none", "up"], "bring the bridge up")
        for i, host in enumerate(self.hosts):
            self._add_host(i, host)
        if self.medium == "shared":
            self._shape_shared()
        else:
            for host in self.hosts:
                self._shape_switched(host)

    def _add_host(self, i: int, host: str) -> None:
        ns, sw, port = self._host_ns[host], self._switch_ns, f"p{i}"
        self._add_ns(ns)
        _cmd(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", HOST_IF, "netns", ns],
             f"create the link of {host}")
        # No IPv6 addresses: router solicitations and DAD would add stray bytes to the counters.
        _cmd(["ip", "-n", sw, "link", "set", port, "master", "br0", "addrgenmode", "none", "up"],
             f"attach {host} to the bridge")
        _cmd(["ip", "-n", ns, "link", "set", "lo", "up"], f"bring up loopback of {host}")
        _cmd(["ip", "-n", ns, "link", "set", HOST_IF, "mtu", "1500", "gso_max_size", str(self._gso_size(host)),
              "addrgenmode", "none"], f"configure the interface of {host}")
        _cmd(["ip", "-n", ns, "addr", "add", f"{self._addresses[host]}/{self._prefixlen}", "dev", HOST_IF],
             f"address {host}")
        _cmd(["ip", "-n", ns, "link", "set", HOST_IF, "up"], f"bring up the interface of {host}")

    def _params(self, mbps: float) -> TbfParams:
        return tbf_params(mbps, **self._tbf)

    def _gso_size(self, host: str) -> int:
        """The host's largest GSO packet: no bigger than the smallest bucket its traffic passes through."""
        if host in self.unshaped:
            return GSO_DEFAULT
        bursts = [self._params(r).burst for r in self._rates.values()] if self.medium == "shared" else \
            [self._params(r).burst for pair, r in self._rates.items() if host in pair]
        return min([GSO_DEFAULT, *bursts])

    def _shape_switched(self, host: str) -> None:
        ns = self._host_ns[host]
        peers = [p for p in self.hosts if p != host and self.rate_mbps(host, p) is not None]
        if not peers:
            return
        tc = ["tc", "-n", ns]
        # No `default` class: what no filter matches (ARP, unshaped peers) leaves through HTB's direct queue.
        _cmd([*tc, "qdisc", "add", "dev", HOST_IF, "root", "handle", "1:", "htb"], f"shape {host}")
        for k, peer in enumerate(peers, start=2):
            tbf = self._params(self.rate_mbps(host, peer))
            classid = f"1:{k:x}"
            _cmd([*tc, "class", "add", "dev", HOST_IF, "parent", "1:", "classid", classid, "htb",
                  "rate", f"{10 * tbf.rate_bit}bit", "quantum", str(GSO_DEFAULT)], f"shape {host} -> {peer}")
            _cmd([*tc, "qdisc", "add", "dev", HOST_IF, "parent", classid, "handle", f"{k:x}:", *tbf.args()],
                 f"shape {host} -> {peer}")
            _cmd([*tc, "filter", "add", "dev", HOST_IF, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                  "match", "ip", "dst", f"{self._addresses[peer]}/32", "flowid", classid], f"shape {host} -> {peer}")

    def _shape_shared(self) -> None:
        sw = self._switch_ns
        tc = ["tc", "-n", sw]
        _cmd(["ip", "-n", sw, "link", "add", SHARED_IF, "type", "ifb"], "create the shared channel")
        _cmd(["ip", "-n", sw, "link", "set", SHARED_IF, "up"], "bring up the shared channel")
        _cmd([*tc, "qdisc", "add", "dev", SHARED_IF, "root", *self._params(self._rates[frozenset()]).args()],
             "shape the shared channel")
        for i, host in enumerate(self.hosts):
            if host in self.unshaped:
                continue
            port = f"p{i}"
            _cmd([*tc, "qdisc", "add", "dev", port, "handle", "ffff:", "ingress"], f"shape {host}")
            # Traffic to an unshaped host passes untouched: a match without actions ends classification
            # with TC_ACT_OK, and needs no action module (gact is often missing).
            for free in sorted(self.unshaped):
                _cmd([*tc, "filter", "add", "dev", port, "parent", "ffff:", "protocol", "ip", "prio", "1", "u32",
                      "match", "ip", "dst", f"{self._addresses[free]}/32", "flowid", "ffff:1"],
                     f"shape {host} -> {free}")
            _cmd([*tc, "filter", "add", "dev", port, "parent", "ffff:", "protocol", "all", "prio", "2", "u32",
                  "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", SHARED_IF],
                 f"shape {host}")

    def _counters(self, host: str) -> dict:
        out = _cmd(["ip", "-n", self.namespace(host), "-s", "-j", "link", "show", "dev", HOST_IF],
                   f"read counters of {host}")
        return json.loads(out)[0]["stats64"]

    def _known(self, host: str) -> str:
        if host not in self._host_ns:
            raise KeyError(f"no host {host!r} in this testbed (hosts: {self.hosts})")
        return host
