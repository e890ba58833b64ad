"""Cluster description: cluster.yaml plus device profiles -> a validated `Cluster`.

cluster.yaml::

    devices:
      - name: pi5-a
        profile: rpi5            # a profile under profiles/ by name, or a path to a profile file
        memory_mb: 4096          # optional: overrides the profile's memory
        address: tcp://192.168.1.20:7000   # optional
      - name: pi4-a
        profile: rpi4
    network:
      bandwidth_mbps: 100        # every pair, unless a link says otherwise (megabits per second)
      latency_ms: 1              # one-way latency per transfer
      medium: switched           # switched (each pair has its own link) or shared (one channel); default switched
      links:                     # optional per-pair overrides; a missing figure falls back to the default
        - {a: pi5-a, b: pi4-a, bandwidth_mbps: 10, latency_ms: 5}

Device names are 1-64 characters from [A-Za-z0-9._-], starting with a letter or digit (they end up in
file names and manifests).  A profile reference without a path separator and without a .yaml/.yml
suffix is a name under the profiles folder; anything else is a path, relative to the cluster file's
folder.

Profile file (profiles/<name>.yaml)::

    name: rpi5
    description: Raspberry Pi 5, 4x Cortex-A76 @ 2.4 GHz, 8 GB LPDDR4X, onnxruntime CPU EP fp32
    memory_mb: 8192                # physical memory (> 0)
    usable_memory_fraction: 0.75   # share of memory the OS and other processes leave to edgec, in (0, 1]
    runtime_overhead_mb: 80        # onnxruntime + worker resident memory before any weights (>= 0)
    op_overhead_us: 30             # per-operator dispatch overhead (>= 0)
    gflops:                        # sustained onnxruntime fp32 throughput in GFLOP/s (FLOPs = 2 x MACs), all > 0
      conv: 30.0
      depthwise_conv: 6.0
      gemm: 25.0
      other: 3.0                   # any other compute-bound op
    memory_gbps: 8.0               # sustained GB/s for memory-bound ops (> 0)
    power_w: {idle: 2.7, busy: 7.0}   # watts; either may be null = unknown (`edgec profile` cannot measure power)
    sources: ["..."]               # where each figure comes from
    layers: {}                     # optional measured tables {<model sha256>: {<onnx node name>: ms}}

Required keys: name, memory_mb, usable_memory_fraction, runtime_overhead_mb, op_overhead_us, gflops,
memory_gbps.  Optional: description (default ""), power_w (default both null), sources (default none),
layers (default empty).  A `layers` table is keyed by ONNX node name (not layer name): the cost model sums
the node times of each layer.

Every problem raises `UserError(message, path=<the file at fault>)`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from edgec.compiler.errors import UserError
from edgec.compiler.units import MiB

__all__ = [
    "PROFILES_DIR",
    "GFLOPS_KEYS",
    "MEDIUMS",
    "Profile",
    "DeviceSpec",
    "LinkSpec",
    "Cluster",
    "profiles_dir",
    "available_profiles",
    "load_profile",
    "load_cluster",
    "validate_profile_dict",
]

_DEFAULT_PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
PROFILES_DIR: Path = Path(os.environ["EDGEC_PROFILES"]) if os.environ.get("EDGEC_PROFILES") else _DEFAULT_PROFILES_DIR

GFLOPS_KEYS = ("conv", "depthwise_conv", "gemm", "other")
MEDIUMS = ("switched", "shared")

_PROFILE_KEYS = (
    "name",
    "description",
    "memory_mb",
    "usable_memory_fraction",
    "runtime_overhead_mb",
    "op_overhead_us",
    "gflops",
    "memory_gbps",
    "power_w",
    "sources",
    "layers",
)
_PROFILE_REQUIRED = (
    "name",
    "memory_mb",
    "usable_memory_fraction",
    "runtime_overhead_mb",
    "op_overhead_us",
    "gflops",
    "memory_gbps",
)
_POWER_KEYS = ("idle", "busy")
_CLUSTER_KEYS = ("devices", "network")
_DEVICE_KEYS = ("name", "profile", "memory_mb", "address")
_NETWORK_KEYS = ("bandwidth_mbps", "latency_ms", "medium", "links")
_LINK_KEYS = ("a", "b", "bandwidth_mbps", "latency_ms")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


# --------------------------------------------------------------------------------------------------
# Data model


@dataclass(frozen=True)
class Profile:
    """A device class: memory, per-operator-class throughput and power, from a profile file."""

    name: str
    description: str
    memory_mb: float
    usable_memory_fraction: float
    runtime_overhead_mb: float
    op_overhead_us: float
    gflops: dict[str, float] = field(hash=False)  # keys: conv, depthwise_conv, gemm, other
    memory_gbps: float
    power_idle_w: float | None  # None: unknown
    power_busy_w: float | None  # None: unknown
    sources: tuple[str, ...]
    layers: dict[str, dict[str, float]] = field(hash=False, repr=False)  # {model sha256: {node name: ms}}
    path: str  # the file it was read from


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    profile: Profile
    memory_mb: float  # the cluster file's override, or the profile's
    address: str | None

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
class Cluster:
    devices: tuple[DeviceSpec, ...]
    bandwidth_mbps: float  # default for every pair
    latency_ms: float  # default for every pair
    medium: str  # "switched" or "shared"
    links: dict[frozenset[str], LinkSpec] = field(hash=False)  # explicit overrides only
    path: str

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

    def to_dict(self) -> dict[str, Any]:
        """The manifest's "devices" and "network" sections (JSON-able, deterministic)."""
        links = []
        for pair, link in self.links.items():
            a, b = sorted(pair)
            links.append({"a": a, "b": b, "bandwidth_mbps": link.bandwidth_mbps, "latency_ms": link.latency_ms})
        links.sort(key=lambda x: (x["a"], x["b"]))
        return {
            "devices": [
                {"name": d.name, "profile": d.profile.name, "memory_mb": d.memory_mb, "address": d.address}
                for d in self.devices
            ],
            "network": {
                "bandwidth_mbps": self.bandwidth_mbps,
                "latency_ms": self.latency_ms,
                "medium": self.medium,
                "links": links,
            },
        }


# --------------------------------------------------------------------------------------------------
# Helpers


class _SafeLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, plus: a key repeated in one mapping is an error (PyYAML would keep the
    last value silently)."""


def _construct_mapping(loader: _SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
        except TypeError:
            continue
        if dup:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_SafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_yaml(path: Path, what: str) -> Any:
    shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} not found", path=shown) from None
    except IsADirectoryError:
        raise UserError(f"{what} is a directory, not a file", path=shown) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {what}: {e}", path=shown) from None
    try:
        return yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise UserError(f"YAML syntax error: {where}{problem}", path=shown) from None


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _check_keys(d: dict, allowed: tuple[str, ...], required: tuple[str, ...], where: str, path: str) -> None:
    for k in d:
        if k not in allowed:
            raise UserError(f"unknown key {k!r} in {where} (allowed: {', '.join(allowed)})", path=path)
    for k in required:
        if k not in d:
            raise UserError(f"missing required key {k!r} in {where}", path=path)


def _mapping(v: Any, where: str, path: str) -> dict:
    if not isinstance(v, dict):
        raise UserError(f"{where} must be a mapping, got {_type_name(v)}", path=path)
    for k in v:
        if not isinstance(k, str):
            raise UserError(f"{where}: keys must be strings, got {_type_name(k)} {k!r}", path=path)
    return v


def _number(v: Any, where: str, path: str, *, positive: bool = False, nonneg: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        hint = " (write floats with a dot, e.g. 1.0e3)" if isinstance(v, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", v.strip()) else ""
        raise UserError(f"{where} must be a number, got {_type_name(v)} {v!r}{hint}", path=path)
    x = float(v)
    if not math.isfinite(x):
        raise UserError(f"{where} must be finite, got {v!r}", path=path)
    if positive and x <= 0:
        raise UserError(f"{where} must be positive, got {v!r}", path=path)
    if nonneg and x < 0:
        raise UserError(f"{where} must not be negative, got {v!r}", path=path)
    return x


def _string(v: Any, where: str, path: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise UserError(f"{where} must be a non-empty string, got {_type_name(v)} {v!r}", path=path)
    return v


# --------------------------------------------------------------------------------------------------
# Profiles


def profiles_dir() -> Path:
    """The profiles folder: $EDGEC_PROFILES if set now, else PROFILES_DIR."""
    env = os.environ.get("EDGEC_PROFILES")
    return Path(env) if env else PROFILES_DIR


def available_profiles() -> list[str]:
    d = profiles_dir()
    if not d.is_dir():
        return []
    return sorted({p.stem for p in d.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()})


def _is_profile_name(ref: str) -> bool:
    return "/" not in ref and os.sep not in ref and not ref.endswith((".yaml", ".yml")) and ref not in (".", "..")


def validate_profile_dict(data: Any, path: str) -> Profile:
    """Check a parsed profile (as read from YAML, or as built by `edgec profile`) and build a Profile.

    Raises UserError(..., path=path) on the first problem."""
    if not isinstance(data, dict):
        raise UserError(f"a profile must be a mapping, got {_type_name(data)}", path=path)
    _mapping(data, "profile", path)
    _check_keys(data, _PROFILE_KEYS, _PROFILE_REQUIRED, "profile", path)

    name = _string(data["name"], "name", path)
    description = data.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise UserError(f"description must be a string, got {_type_name(description)}", path=path)
    memory_mb = _number(data["memory_mb"], "memory_mb", path, positive=True)
    frac = _number(data["usable_memory_fraction"], "usable_memory_fraction", path)
    if not 0 < frac <= 1:
        raise UserError(f"usable_memory_fraction must be in (0, 1], got {data['usable_memory_fraction']!r}", path=path)
    overhead_mb = _number(data["runtime_overhead_mb"], "runtime_overhead_mb", path, nonneg=True)
    if overhead_mb >= memory_mb * frac:
        raise UserError(
            f"runtime_overhead_mb ({overhead_mb:g}) leaves no usable memory "
            f"(memory_mb x usable_memory_fraction = {memory_mb * frac:g})",
            path=path,
        )
    op_overhead = _number(data["op_overhead_us"], "op_overhead_us", path, nonneg=True)

    g = _mapping(data["gflops"], "gflops", path)
    _check_keys(g, GFLOPS_KEYS, GFLOPS_KEYS, "gflops", path)
    gflops = {k: _number(g[k], f"gflops.{k}", path, positive=True) for k in GFLOPS_KEYS}
    memory_gbps = _number(data["memory_gbps"], "memory_gbps", path, positive=True)

    power = data.get("power_w")
    idle = busy = None
    if power is not None:
        power = _mapping(power, "power_w", path)
        _check_keys(power, _POWER_KEYS, (), "power_w", path)
        if power.get("idle") is not None:
            idle = _number(power["idle"], "power_w.idle", path, positive=True)
        if power.get("busy") is not None:
            busy = _number(power["busy"], "power_w.busy", path, positive=True)
        if idle is not None and busy is not None and busy < idle:
            raise UserError(f"power_w.busy ({busy:g}) is below power_w.idle ({idle:g})", path=path)

    sources = data.get("sources")
    if sources is None:
        sources = []
    if not isinstance(sources, list) or not all(isinstance(s, str) and s.strip() for s in sources):
        raise UserError("sources must be a list of non-empty strings", path=path)

    layers_in = data.get("layers")
    layers: dict[str, dict[str, float]] = {}
    if layers_in is not None:
        layers_in = _mapping(layers_in, "layers", path)
        for model, table in layers_in.items():
            table = _mapping(table, f"layers[{model!r}]", path)
            layers[model] = {
                node: _number(ms, f"layers[{model!r}][{node!r}]", path, nonneg=True) for node, ms in table.items()
            }

    return Profile(
        name=name,
        description=description,
        memory_mb=memory_mb,
        usable_memory_fraction=frac,
        runtime_overhead_mb=overhead_mb,
        op_overhead_us=op_overhead,
        gflops=gflops,
        memory_gbps=memory_gbps,
        power_idle_w=idle,
        power_busy_w=busy,
        sources=tuple(sources),
        layers=layers,
        path=path,
    )


def _profile_path(ref: str, base_dir: Path | None) -> Path | None:
    """The file a profile reference points at; None for a name that no profile has."""
    if _is_profile_name(ref):
        d = profiles_dir()
        for suffix in (".yaml", ".yml"):
            p = d / f"{ref}{suffix}"
            if p.is_file():
                return p
        return None
    p = Path(ref).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    return p


def _unknown_profile(ref: str) -> str:
    avail = available_profiles()
    return f"unknown profile {ref!r} (available: {', '.join(avail) if avail else f'none in {profiles_dir()}'})"


def load_profile(ref: str, base_dir: Path | None = None) -> Profile:
    """A profile by name (a file <name>.yaml under the profiles folder) or by path (relative to
    base_dir when given, else to the working directory)."""
    if not isinstance(ref, str) or not ref.strip():
        raise UserError(f"a profile reference must be a non-empty string, got {ref!r}")
    p = _profile_path(ref, base_dir)
    if p is None:
        raise UserError(_unknown_profile(ref))
    return validate_profile_dict(_read_yaml(p, "profile file"), str(p))


# --------------------------------------------------------------------------------------------------
# Clusters


def load_cluster(path: str | Path) -> Cluster:
    p = Path(path)
    shown = str(p)
    data = _read_yaml(p, "cluster file")
    if data is None:
        raise UserError("cluster file is empty (expected keys: devices, network)", path=shown)
    if not isinstance(data, dict):
        raise UserError(f"a cluster file must be a mapping, got {_type_name(data)}", path=shown)
    _mapping(data, "cluster file", shown)
    _check_keys(data, _CLUSTER_KEYS, _CLUSTER_KEYS, "cluster file", shown)

    # devices
    devs = data["devices"]
    if devs is None or devs == []:
        raise UserError("no devices: 'devices' must list at least one device", path=shown)
    if not isinstance(devs, list):
        raise UserError(f"devices must be a list, got {_type_name(devs)}", path=shown)
    base_dir = p.parent
    profiles: dict[str, Profile] = {}
    devices: list[DeviceSpec] = []
    seen: set[str] = set()
    for i, dv in enumerate(devs):
        where = f"devices[{i}]"
        dv = _mapping(dv, where, shown)
        _check_keys(dv, _DEVICE_KEYS, ("name", "profile"), where, shown)
        name = dv["name"]
        if not isinstance(name, str) or not _DEVICE_NAME.match(name):
            raise UserError(
                f"{where}.name must be 1-64 characters from [A-Za-z0-9._-] starting with a letter or digit, got {name!r}",
                path=shown,
            )
        where = f"device {name!r}"
        if name in seen:
            raise UserError(f"duplicate device name {name!r}", path=shown)
        seen.add(name)
        ref = dv["profile"]
        if not isinstance(ref, str) or not ref.strip():
            raise UserError(f"{where}: profile must be a profile name or a path, got {_type_name(ref)} {ref!r}", path=shown)
        if ref not in profiles:
            pp = _profile_path(ref, base_dir)
            if pp is None:
                raise UserError(f"{where}: {_unknown_profile(ref)}", path=shown)
            if not pp.is_file():
                raise UserError(f"{where}: profile file {str(pp)!r} not found", path=shown)
            profiles[ref] = validate_profile_dict(_read_yaml(pp, "profile file"), str(pp))
        prof = profiles[ref]
        memory_mb = prof.memory_mb
        if dv.get("memory_mb") is not None:
            memory_mb = _number(dv["memory_mb"], f"{where}: memory_mb", shown, positive=True)
        address = dv.get("address")
        if address is not None:
            address = _string(address, f"{where}: address", shown)
        device = DeviceSpec(name=name, profile=prof, memory_mb=memory_mb, address=address)
        if device.usable_bytes <= 0:
            raise UserError(
                f"{where}: no usable memory ({memory_mb:g} MB x {prof.usable_memory_fraction:g} "
                f"- {prof.runtime_overhead_mb:g} MB runtime overhead)",
                path=shown,
            )
        devices.append(device)

    # network
    net = _mapping(data["network"], "network", shown)
    _check_keys(net, _NETWORK_KEYS, ("bandwidth_mbps", "latency_ms"), "network", shown)
    bandwidth = _number(net["bandwidth_mbps"], "network.bandwidth_mbps", shown, positive=True)
    latency = _number(net["latency_ms"], "network.latency_ms", shown, nonneg=True)
    medium = net.get("medium", "switched")
    if medium is None:
        medium = "switched"
    if medium not in MEDIUMS:
        raise UserError(f"unknown network.medium {medium!r} (allowed: {', '.join(MEDIUMS)})", path=shown)
    links_in = net.get("links")
    if links_in is None:
        links_in = []
    if not isinstance(links_in, list):
        raise UserError(f"network.links must be a list, got {_type_name(links_in)}", path=shown)
    links: dict[frozenset[str], LinkSpec] = {}
    for i, lk in enumerate(links_in):
        where = f"network.links[{i}]"
        lk = _mapping(lk, where, shown)
        _check_keys(lk, _LINK_KEYS, ("a", "b"), where, shown)
        a, b = lk["a"], lk["b"]
        for end in (a, b):
            if not isinstance(end, str) or end not in seen:
                raise UserError(
                    f"{where} names unknown device {end!r} (devices: {', '.join(d.name for d in devices)})", path=shown
                )
        if a == b:
            raise UserError(f"{where} links device {a!r} with itself", path=shown)
        pair = frozenset((a, b))
        if pair in links:
            raise UserError(f"{where}: duplicate link between {a!r} and {b!r}", path=shown)
        bw = bandwidth
        if lk.get("bandwidth_mbps") is not None:
            bw = _number(lk["bandwidth_mbps"], f"{where}.bandwidth_mbps", shown, positive=True)
        lat = latency
        if lk.get("latency_ms") is not None:
            lat = _number(lk["latency_ms"], f"{where}.latency_ms", shown, nonneg=True)
        links[pair] = LinkSpec(bandwidth_mbps=bw, latency_ms=lat)

    return Cluster(
        devices=tuple(devices),
        bandwidth_mbps=bandwidth,
        latency_ms=latency,
        medium=medium,
        links=links,
        path=shown,
    )
