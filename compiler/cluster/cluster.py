"""The cluster model: devices, their profiles and the network between them, from a cluster.yaml."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgec.compiler.errors import UserError
from edgec.compiler.units import MiB
from edgec.runtime.providers import CPU, CPU_ONLY, Provider

from .power import DevicePower
from .profile import Figures, Profile, RuntimeFigures, profile_path, read_profile, unknown_profile
from .quote import show
from .yamlio import read_yaml

if TYPE_CHECKING:
    from .schema import DeviceDoc, NetworkDoc

__all__ = ["provider_note", "DeviceSpec", "LinkSpec", "HostSpec", "ClusterModel", "load_cluster", "LOCAL"]

logger = logging.getLogger(__name__)

LOCAL = "local"  # `address: local`: the device runs as a worker process on the coordinator's machine


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    profile: Profile
    memory_mb: float  # the cluster file's override, or the profile's
    address: str | None
    threads: int | None = None  # the worker's intra-op thread count; None: the runtime's default (all cores)
    mode: str | None = None  # the power mode a plan runs it in (a profile's `modes:` entry); None: the top level's
    host: str | None = None  # the `hosts:` entry of the machine it shares with other devices; None: its own
    providers: tuple[Provider, ...] = CPU_ONLY  # onnxruntime's execution providers for its sessions, in order

    @property
    def figures(self) -> Figures:
        """What this device's worker does at the thread count it runs (the profile's top level by default),
        in its power mode."""
        return self.profile.figures(self.threads) if self.mode is None else self.profile.mode_figures(self.mode, self.threads)

    @property
    def runtime(self) -> RuntimeFigures:
        """The runtime's own costs on this device (the profile's `runtime:`, zeros where not measured)."""
        return self.profile.runtime

    @property
    def quota_burst(self) -> tuple[float, int, float] | None:
        """(quota cores, threads, burst CPU ms) of a device profiled under a CPU quota below its threads (1 when
        unset) whose profile measured the burst (`cpu_quota.burst_ms`) and that shares no machine (`hosts:`
        prices those): a lone request's work there runs at full speed while the burst lasts
        (cost/quota_burst.py); None for any other device."""
        p, threads = self.profile, self.threads or 1
        q, burst = p.cpu_quota_cores, p.cpu_quota_burst_ms
        if self.host is None and q is not None and burst is not None and q < threads:
            return q, threads, burst
        return None

    @property
    def lone_runtime(self) -> RuntimeFigures:
        """The runtime's costs as a lone request meets them: on a device whose quota bursts (`quota_burst`), a
        message's bytes at the profile's CPU figure (message_cpu_ms_per_mb, timed on one CPU: the work at full
        speed) where it is below the time figure, which follows the share; `runtime` itself otherwise."""
        r = self.runtime
        cpu = r.message_cpu_ms_per_mb
        if self.quota_burst is None or cpu is None or cpu >= r.message_ms_per_mb:
            return r
        return replace(r, message_ms_per_mb=cpu)

    @property
    def run_mode(self) -> str | None:
        """The power mode it must run in: its mode, or its profile's top level's when the profile has modes
        (None: the profile has one operating point)."""
        return self.mode or (self.profile.top_mode if self.profile.modes else None)

    @property
    def power(self) -> DevicePower:
        """Its power figures (the profile's `power_w` and `radio_nj_per_byte`), for the energy model."""
        p = self.profile
        idle, busy = (p.power_idle_w, p.power_busy_w) if self.mode is None else p.mode_power(self.mode)
        return DevicePower(idle, busy, p.radio_tx_nj_per_byte, p.radio_rx_nj_per_byte)

    @property
    def traits(self) -> tuple:
        """What prices a plan on this device beyond its own times, memory and links: the machine it shares
        with other devices (`hosts:`; evaluate charges a machine's devices for its cores, and tiles on one
        machine share its memory path) and its power figures (the energy model). Every planner that treats
        alike devices as interchangeable (the pipeline DP, the spatial search, allocate's classes) requires
        their traits to be equal too; compared for equality only. Its execution providers too: devices that
        run different ones are not interchangeable, whatever their figures."""
        return (self.host, self.power, self.providers)

    @property
    def provider_note(self) -> str | None:
        """Why this device's figures may not be what its sessions run at (None: they are): see provider_note."""
        return provider_note(self.name, self.profile, tuple(p.name for p in self.providers))

    @property
    def usable_bytes(self) -> int:
        """Bytes edgec may fill with weights and activations on this device."""
        return int(self.memory_mb * self.profile.usable_memory_fraction * MiB) - int(
            self.profile.runtime_overhead_mb * MiB
        )


@dataclass(frozen=True)
class LinkSpec:
    bandwidth_mbps: float  # megabits per second (10^6 bit/s)
    latency_ms: float


_SAME_DEVICE = LinkSpec(bandwidth_mbps=math.inf, latency_ms=0.0)


@dataclass(frozen=True)
class HostSpec:
    """A machine several devices share (cluster.yaml `hosts:`): its cores, and whether the coordinator
    (`edgec run`) runs on it too."""

    cores: int
    coordinator: bool = False


@dataclass(frozen=True)
class ClusterModel:
    devices: tuple[DeviceSpec, ...]
    bandwidth_mbps: float  # default for every pair; inf for a one-device cluster without `network`
    latency_ms: float  # default for every pair
    medium: str  # "switched" or "shared"
    links: dict[frozenset[str], LinkSpec] = field(hash=False)  # explicit overrides only
    path: str
    hosts: dict[str, HostSpec] = field(default_factory=dict, hash=False)  # machines devices share, by name

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def device(self, name: str) -> DeviceSpec:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(f"no device {name!r} in {self.path} (devices: {', '.join(self.device_names)})")

    def link(self, a: str, b: str) -> LinkSpec:
        """The link between devices a and b (symmetric): the override if the file gives one, else the
        network default.  a == b is no network hop: infinite bandwidth, zero latency."""
        self.device(a)
        self.device(b)
        if a == b:
            return _SAME_DEVICE
        return self.links.get(frozenset((a, b)), LinkSpec(self.bandwidth_mbps, self.latency_ms))

    def with_modes(self, modes: dict[str, str]) -> "ClusterModel":
        """The cluster with devices run in the given power modes ({device: mode}; a mode that is the
        profile's top level's is no mode: the device stays as it is)."""
        devices = []
        for d in self.devices:
            mode = modes.get(d.name)
            if mode is not None and mode not in d.profile.mode_names:
                raise ValueError(f"{d.name}: profile {d.profile.name} has no mode {mode!r}")
            devices.append(replace(d, mode=None if mode in (None, d.profile.top_mode) else mode))
        return replace(self, devices=tuple(devices))

    @property
    def has_network(self) -> bool:
        """False for a one-device cluster whose file has no `network` section."""
        return math.isfinite(self.bandwidth_mbps)

    def to_dict(self) -> dict[str, Any]:
        """The manifest's "devices" and "network" sections (JSON-able, deterministic); without a network
        section (one device), bandwidth_mbps and latency_ms are null. `network.costs` ({device: the
        runtime's costs}) lists the devices whose profile measured them, and is left out when none did
        (so a build for profiles without them is what it was before they existed)."""
        links = []
        for pair, link in self.links.items():
            a, b = sorted(pair)
            links.append({"a": a, "b": b, "bandwidth_mbps": link.bandwidth_mbps, "latency_ms": link.latency_ms})
        links.sort(key=lambda x: (x["a"], x["b"]))
        costs = {d.name: d.runtime.to_dict() for d in self.devices if d.runtime}
        return {
            "devices": [
                {"name": d.name, "profile": d.profile.name, "memory_mb": d.memory_mb, "address": d.address,
                 **({} if d.threads is None else {"threads": d.threads}), **d.power.to_dict(),
                 **({} if d.run_mode is None else {"mode": d.run_mode}),
                 **({} if d.providers == CPU_ONLY else {"providers": [p.to_json() for p in d.providers]})}
                for d in self.devices
            ],
            "network": {
                "bandwidth_mbps": self.bandwidth_mbps if self.has_network else None,
                "latency_ms": self.latency_ms if self.has_network else None,
                "medium": self.medium,
                "links": links,
                **({"costs": costs} if costs else {}),
            },
        }


def load_cluster(path: str | Path) -> ClusterModel:
    """The cluster a cluster.yaml describes, its profiles loaded; any problem is one UserError naming the
    file at fault (the cluster file, or a profile file it names)."""
    from .messages import parse  # imported here, as in validate_profile_dict: pydantic is slow to import
    from .schema import ClusterDoc

    p = Path(path)
    shown = str(p)
    data = read_yaml(p, "cluster file")
    if data is None:
        raise UserError("cluster file is empty (expected keys: devices, network)", path=shown)
    doc = parse(ClusterDoc, data, shown, root="cluster file")
    # What relates one entry to another, or to other files, after the schema has checked each entry alone.
    if not doc.devices:
        raise UserError("no devices: 'devices' must list at least one device", path=shown)
    devices = _devices(doc.devices, p.parent, shown)
    hosts = _hosts(doc, shown)
    if doc.network is None:
        if len(devices) > 1:
            raise UserError(f"missing required key 'network' in cluster file ({len(devices)} devices need one)",
                            path=shown)
        # No pair of devices exists: the defaults are those of "no network hop" and never price a transfer.
        return ClusterModel(devices=devices, bandwidth_mbps=_SAME_DEVICE.bandwidth_mbps,
                       latency_ms=_SAME_DEVICE.latency_ms, medium="switched", links={}, path=shown, hosts=hosts)
    net = doc.network
    return ClusterModel(devices=devices, bandwidth_mbps=net.bandwidth_mbps, latency_ms=net.latency_ms,
                   medium=net.medium or "switched", links=_links(net, devices, shown), path=shown, hosts=hosts)


def _hosts(doc, shown: str) -> dict[str, HostSpec]:
    """The `hosts:` entries, each named by a device and by no more than one coordinator."""
    hosts = {name: HostSpec(h.cores, h.coordinator) for name, h in (doc.hosts or {}).items()}
    used = set()
    for dv in doc.devices:
        if dv.host is not None and dv.host not in hosts:
            known = f" (hosts: {', '.join(hosts)})" if hosts else " (the file has no 'hosts' section)"
            raise UserError(f"device {dv.name!r}: host {dv.host!r} is not in 'hosts'{known}", path=shown)
        used.add(dv.host)
    idle = sorted(set(hosts) - used)
    if idle:
        raise UserError(f"hosts[{idle[0]!r}]: no device names it (set a device's 'host')", path=shown)
    coordinators = [name for name, h in hosts.items() if h.coordinator]
    if len(coordinators) > 1:
        raise UserError(f"hosts: the coordinator runs on one machine, but {', '.join(coordinators)} all say "
                        "coordinator: true", path=shown)
    return hosts


def _devices(docs: list[DeviceDoc], base_dir: Path, shown: str) -> tuple[DeviceSpec, ...]:
    """Unique names, profiles found and read (each file once), memory left after the runtime."""
    profiles: dict[str, Profile] = {}
    devices: list[DeviceSpec] = []
    seen: set[str] = set()
    for dv in docs:
        where = f"device {dv.name!r}"
        if dv.name in seen:
            raise UserError(f"duplicate device name {dv.name!r}", path=shown)
        seen.add(dv.name)
        if dv.profile not in profiles:
            pp = profile_path(dv.profile, base_dir)
            if pp is None:
                raise UserError(f"{where}: {unknown_profile(dv.profile)}", path=shown)
            if not pp.is_file():
                raise UserError(f"{where}: profile file {str(pp)!r} not found", path=shown)
            profiles[dv.profile] = read_profile(pp)
        prof = profiles[dv.profile]
        memory_mb = prof.memory_mb if dv.memory_mb is None else dv.memory_mb
        address = None if dv.address == LOCAL else dv.address
        device = DeviceSpec(name=dv.name, profile=prof, memory_mb=memory_mb, address=address, threads=dv.threads,
                            host=dv.host, providers=_providers(dv, shown))
        if device.usable_bytes <= 0:
            raise UserError(f"{where}: no usable memory ({memory_mb:g} MB x {prof.usable_memory_fraction:g} "
                            f"- {prof.runtime_overhead_mb:g} MB runtime overhead)", path=shown)
        devices.append(device)
        if device.provider_note is not None:
            logger.warning("%s: %s", shown, device.provider_note)
    _no_silent_local(docs, shown)
    return tuple(devices)


def provider_note(device: str, profile: Profile, providers: tuple[str, ...]) -> str | None:
    """The pricing rule for execution providers, said when it matters. The profile says which providers its
    figures were measured with (`providers:`, absent: the CPU's). A device that runs an accelerator its profile has
    no figures for is priced at the profile's (the CPU's) figures, so its plan is conservative for the nodes the
    accelerator takes; a device whose profile was measured with an accelerator it does not list runs on the CPU,
    slower than the plan predicts. Both are said (a warning at compile), never silently assumed. A device whose
    profile was measured with its accelerator is priced at those figures for the nodes the accelerator takes and at
    the profile's `cpu:` figures for the nodes it leaves to the CPU provider (cost/claims.py, which says in a
    warning when the profile has no `cpu:` figures or nothing says which nodes those are)."""
    extra = [p for p in providers if p != CPU and p not in profile.providers]
    if extra:
        return (f"device {device!r} runs {extra[0]}, but profile {profile.name} was measured with "
                f"{', '.join(profile.providers)}: the plan prices its every node at the profile's figures")
    lacking = [p for p in profile.providers if p != CPU and p not in providers]
    if lacking:
        return (f"device {device!r}: profile {profile.name}'s figures are for {lacking[0]}, which the device does "
                f"not list in 'providers' (its sessions run {', '.join(providers)}): it will run slower than the "
                "plan predicts")
    return None


def _providers(dv: DeviceDoc, shown: str) -> tuple[Provider, ...]:
    """The device's `providers:` as the runtime's Provider list (absent: the CPU's alone), each name once."""
    if dv.providers is None:
        return CPU_ONLY
    out = tuple(Provider(name, tuple(options.items())) for entry in dv.providers for name, options in entry.items())
    names = [p.name for p in out]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise UserError(f"device {dv.name!r}: providers lists {dup} twice", path=shown)
    return out


def _no_silent_local(docs: list[DeviceDoc], shown: str) -> None:
    """In a cluster whose devices have addresses, a device without one would run as a process on the
    coordinator's machine, unnoticed: it must say so (`address: local`) or be given its worker's address."""
    remote = [dv.name for dv in docs if dv.address not in (None, LOCAL)]
    silent = [dv.name for dv in docs if dv.address is None]
    if remote and silent:
        raise UserError(f"device {silent[0]!r} has no address while {', '.join(map(repr, remote[:3]))}"
                        f"{' ...' if len(remote) > 3 else ''} {'have' if len(remote) > 1 else 'has'} one: give it its "
                        "`edgec worker`'s address, or `address: local` to run it as a process on the machine that runs "
                        "`edgec run`", path=shown)


def _links(net: NetworkDoc, devices: tuple[DeviceSpec, ...], shown: str) -> dict[frozenset[str], LinkSpec]:
    """The per-pair overrides: between two known, different devices, one per pair."""
    names = [d.name for d in devices]
    links: dict[frozenset[str], LinkSpec] = {}
    for i, lk in enumerate(net.links or ()):
        where = f"network.links[{i}]"
        for end in (lk.a, lk.b):
            if end not in names:
                raise UserError(f"{where} names unknown device {show(end)} (devices: {', '.join(names)})", path=shown)
        if lk.a == lk.b:
            raise UserError(f"{where} links device {lk.a!r} with itself", path=shown)
        pair = frozenset((lk.a, lk.b))
        if pair in links:
            raise UserError(f"{where}: duplicate link between {lk.a!r} and {lk.b!r}", path=shown)
        links[pair] = LinkSpec(
            bandwidth_mbps=net.bandwidth_mbps if lk.bandwidth_mbps is None else lk.bandwidth_mbps,
            latency_ms=net.latency_ms if lk.latency_ms is None else lk.latency_ms,
        )
    return links
