"""Cluster description: cluster.yaml plus device profiles -> a validated `Cluster`.

cluster.yaml::

    devices:
      - name: pi5-a
        profile: rpi5            # a profile under profiles/ by name, or a path to a profile file
        memory_mb: 4096          # optional: overrides the profile's memory
        address: tcp://192.168.1.20:7000   # optional
        threads: 1               # optional: the worker's onnxruntime intra-op threads (1..4096); the cost
                                 # model then uses the profile's figures for that count (Profile.figures)
      - name: pi4-a
        profile: rpi4
    network:                     # required with two or more devices; a one-device cluster may omit it
      bandwidth_mbps: 100        # every pair, unless a link says otherwise (megabits per second)
      latency_ms: 1              # one-way latency per transfer
      medium: switched           # switched (each pair has its own link) or shared (one channel); default switched
      links:                     # optional per-pair overrides; a missing figure falls back to the default
        - {a: pi5-a, b: pi4-a, bandwidth_mbps: 10, latency_ms: 5}

A device without `threads` runs its worker at the runtime's default, all of the device's cores, which
the profile's top-level figures describe.  With `threads`, the manifest's device entry records it and a
local worker that `edgec run` starts (without --threads) runs that many threads.

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
    op_ms_per_melem:               # optional: ms per million output elements beyond op_overhead_us (> 0)
      {LRN: 25.0, Softmax: 0.48, Resize:linear: 1.4}   # key: ONNX op type, or "<op type>:<mode>"
    efficiency:                    # optional: throughput of small outputs, as a fraction of gflops.conv / .gemm
      conv: [[7168, 0.62], [401408, 1.0]]   # [output elements, fraction in (0, 4]], elements increasing
      gemm: [[8192, 0.55], [524288, 1.0]]
    threads:                       # optional: the figures per onnxruntime intra-op thread count (keys 1..4096)
      1: {op_overhead_us: 5, gflops: {...}, memory_gbps: 9.0, op_ms_per_melem: {...}, efficiency: {...}, layers: {...}}
    measurement: {...}             # optional: how `edgec profile` measured (spread per timing, load); informational

Required keys: name, memory_mb, usable_memory_fraction, runtime_overhead_mb, op_overhead_us, gflops,
memory_gbps.  Optional: description (default ""), power_w (default both null), sources (default none),
layers, op_ms_per_melem, efficiency, threads, measurement (default empty).  A `layers` table is keyed by
ONNX node name (not layer name): the cost model sums the node times of each layer.  A `threads:` entry
holds the top level's figures (op_overhead_us, gflops, memory_gbps required; op_ms_per_melem, efficiency,
layers optional) with the same names and bounds; `edgec profile` writes the largest count's at the top
level, so a reader that knows no thread counts reads the all-cores figures.  `Profile.figures(n)` picks
a worker's.

Numbers must be finite and at most 1e12; positive ones at least 1e-9 (the cost model divides by them
and sums them, so this keeps every prediction finite).  A cluster file may hold at most 1 MiB, a profile
16 MiB (its measured tables grow with the models), and neither may nest more than 32 levels deep.

Every problem raises `UserError(message, path=<the file at fault>)`.
"""

from __future__ import annotations

import math
import os
import re
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from edgec.compiler.errors import UserError
from edgec.compiler.units import MiB

__all__ = [
    "PROFILES_DIR",
    "GFLOPS_KEYS",
    "EFFICIENCY_KEYS",
    "Figures",
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
EFFICIENCY_KEYS = ("conv", "gemm")
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
    "op_ms_per_melem",
    "efficiency",
    "threads",
    "measurement",
)
# The figures measured per intra-op thread count (a `threads:` entry): the top level's, same names and bounds.
_FIGURE_KEYS = ("op_overhead_us", "gflops", "memory_gbps", "op_ms_per_melem", "efficiency", "layers")
_FIGURE_REQUIRED = ("op_overhead_us", "gflops", "memory_gbps")
_MEASUREMENT_KEYS = ("max_spread", "window", "max_seconds", "load", "threads", "warnings")
_LOAD_KEYS = ("cpus", "busy_rule", "before", "during", "verdict")
_LOAD_WINDOW_KEYS = ("seconds", "other_cpus", "loadavg")
_VERDICTS = ("quiet", "busy", "unknown")
_TIMING_KEYS = ("runs", "median_ms", "spread", "stable", "loadavg_1m", "other_cpus")
_OP_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}(:[A-Za-z0-9_]{1,32})?$")  # op type, or op type:mode
_MAX_EFFICIENCY = 4.0  # a tile at most 4x the large benchmark's throughput (edgec profile caps it there)
_MAX_THREADS = 4096
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
_DEVICE_KEYS = ("name", "profile", "memory_mb", "address", "threads")
_NETWORK_KEYS = ("bandwidth_mbps", "latency_ms", "medium", "links")
_LINK_KEYS = ("a", "b", "bandwidth_mbps", "latency_ms")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Bounds that keep the cost model's divisions and sums finite (see the module docstring).
_MAX_FIGURE = 1e12
_MIN_POSITIVE = 1e-9
# Read limits: real files are a few KiB (profiles with measured tables: a few hundred KiB); anything far
# larger is a wrong file, not a cluster, and is refused before it is read whole.
_MAX_BYTES = {"cluster file": 1 * MiB, "profile file": 16 * MiB}
_MAX_DEPTH = 32  # real files nest at most 5 levels; PyYAML's composer recurses once per level


# --------------------------------------------------------------------------------------------------
# Data model


@dataclass(frozen=True)
class Figures:
    """What a device does at one intra-op thread count (a profile's top level, or one `threads:` entry)."""

    op_overhead_us: float
    gflops: dict[str, float] = field(hash=False)
    memory_gbps: float
    op_ms_per_melem: dict[str, float] = field(hash=False)  # {op type or "op type:mode": ms per 1e6 output elements}
    efficiency: dict[str, tuple[tuple[float, float], ...]] = field(hash=False)  # {conv|gemm: ((out elems, fraction), ...)} ascending
    layers: dict[str, dict[str, float]] = field(hash=False, repr=False)  # {model sha256: {node name: ms}}


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
    op_ms_per_melem: dict[str, float] = field(default_factory=dict, hash=False)  # top level: see Figures
    efficiency: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict, hash=False)
    threads: dict[int, Figures] = field(default_factory=dict, hash=False, repr=False)  # per intra-op thread count
    measurement: dict[str, Any] = field(default_factory=dict, hash=False, repr=False)  # how it was measured (informational)

    def figures(self, threads: int | None = None) -> Figures:
        """The figures for a worker running `threads` intra-op threads: that count's entry if measured;
        else the largest measured count below it (fewer threads: a slower, safe estimate); else the
        smallest measured.  The top level when `threads` is None or the profile has no `threads:`."""
        top = Figures(self.op_overhead_us, self.gflops, self.memory_gbps, self.op_ms_per_melem, self.efficiency,
                      self.layers)
        if threads is None or not self.threads:
            return top
        if threads in self.threads:
            return self.threads[threads]
        below = [n for n in self.threads if n < threads]
        return self.threads[max(below)] if below else self.threads[min(self.threads)]


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    profile: Profile
    memory_mb: float  # the cluster file's override, or the profile's
    address: str | None
    threads: int | None = None  # the worker's intra-op thread count; None: the runtime's default (all cores)

    @property
    def figures(self) -> Figures:
        """What this device's worker does at the thread count it runs (the profile's top level by default)."""
        return self.profile.figures(self.threads)

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
    bandwidth_mbps: float  # default for every pair; inf for a one-device cluster without `network`
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

    @property
    def has_network(self) -> bool:
        """False for a one-device cluster whose file has no `network` section."""
        return math.isfinite(self.bandwidth_mbps)

    def to_dict(self) -> dict[str, Any]:
        """The manifest's "devices" and "network" sections (JSON-able, deterministic); without a network
        section (one device), bandwidth_mbps and latency_ms are null."""
        links = []
        for pair, link in self.links.items():
            a, b = sorted(pair)
            links.append({"a": a, "b": b, "bandwidth_mbps": link.bandwidth_mbps, "latency_ms": link.latency_ms})
        links.sort(key=lambda x: (x["a"], x["b"]))
        return {
            "devices": [
                {"name": d.name, "profile": d.profile.name, "memory_mb": d.memory_mb, "address": d.address,
                 **({} if d.threads is None else {"threads": d.threads})}
                for d in self.devices
            ],
            "network": {
                "bandwidth_mbps": self.bandwidth_mbps if self.has_network else None,
                "latency_ms": self.latency_ms if self.has_network else None,
                "medium": self.medium,
                "links": links,
            },
        }


# --------------------------------------------------------------------------------------------------
# Helpers


class _TooDeep(yaml.YAMLError):
    def __init__(self, mark: yaml.Mark):
        super().__init__(f"nested more than {_MAX_DEPTH} levels deep")
        self.problem, self.problem_mark = str(self), mark


class _SafeLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, plus: a key repeated in one mapping is an error (PyYAML would keep the
    last value silently); nesting deeper than _MAX_DEPTH is an error (the composer recurses per level, so
    a deep file would otherwise end in RecursionError); a scalar that its tag cannot convert (2001-99-99,
    !!int x) is a YAML error with its position, not a ValueError."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > _MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: _SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *x` merges (and may be overridden) by design
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
        except TypeError:
            continue
        if dup:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {_show(key)}", key_node.start_mark
            )
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


def _checked_scalar(construct):
    def wrapped(loader: _SafeLoader, node: yaml.Node):
        try:
            return construct(loader, node)
        except (ValueError, TypeError, OverflowError) as e:
            raise yaml.constructor.ConstructorError(
                None, None, f"invalid {node.tag.rsplit(':', 1)[-1]} {_show(node.value)}: {e}", node.start_mark
            ) from None

    return wrapped


_SafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
for _tag in ("null", "bool", "int", "float", "binary", "timestamp"):
    _SafeLoader.add_constructor(f"tag:yaml.org,2002:{_tag}",
                                _checked_scalar(yaml.SafeLoader.yaml_constructors[f"tag:yaml.org,2002:{_tag}"]))


def _read_text(path: Path, what: str) -> str:
    """The file's text, refusing (before reading it whole) a file larger than the limit for its kind."""
    shown, limit = str(path), _MAX_BYTES[what]
    try:
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
        if len(raw) > limit:
            raise UserError(f"{what} is larger than {limit // MiB} MiB, the limit for a {what}", path=shown)
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} not found", path=shown) from None
    except IsADirectoryError:
        raise UserError(f"{what} is a directory, not a file", path=shown) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {what}: {e}", path=shown) from None


def _read_yaml(path: Path, what: str) -> Any:
    shown = str(path)
    text = _read_text(path, what)
    try:
        return yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - a SafeLoader subclass
    except _TooDeep as e:
        m = e.problem_mark
        raise UserError(f"YAML nested more than {_MAX_DEPTH} levels deep (line {m.line + 1}, column {m.column + 1})",
                        path=shown) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise UserError(f"YAML syntax error: {where}{problem}", path=shown) from None
    except RecursionError:  # the depth limit keeps PyYAML's recursion shallow; this guards what it cannot see
        raise UserError("YAML structure too deeply nested or recursive", path=shown) from None


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 80, 80, 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4
_show = _REPR.repr  # a value quoted in a message: bounded even for huge, deep or alias-shared values


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _check_keys(d: dict, allowed: tuple[str, ...], required: tuple[str, ...], where: str, path: str) -> None:
    for k in d:
        if k not in allowed:
            raise UserError(f"unknown key {_show(k)} in {where} (allowed: {', '.join(allowed)})", path=path)
    for k in required:
        if k not in d:
            raise UserError(f"missing required key {k!r} in {where}", path=path)


def _mapping(v: Any, where: str, path: str) -> dict:
    if not isinstance(v, dict):
        raise UserError(f"{where} must be a mapping, got {_type_name(v)}", path=path)
    for k in v:
        if not isinstance(k, str):
            raise UserError(f"{where}: keys must be strings, got {_type_name(k)} {_show(k)}", path=path)
    return v


def _number(v: Any, where: str, path: str, *, positive: bool = False, nonneg: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        hint = " (write floats with a dot, e.g. 1.0e3)" if isinstance(v, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", v.strip()) else ""
        raise UserError(f"{where} must be a number, got {_type_name(v)} {_show(v)}{hint}", path=path)
    try:
        x = float(v)
    except OverflowError:  # an integer beyond float range
        x = math.inf if v > 0 else -math.inf
    if not math.isfinite(x):
        raise UserError(f"{where} must be finite, got {_show(v)}", path=path)
    if positive and x <= 0:
        raise UserError(f"{where} must be positive, got {_show(v)}", path=path)
    if nonneg and x < 0:
        raise UserError(f"{where} must not be negative, got {_show(v)}", path=path)
    if abs(x) > _MAX_FIGURE:
        raise UserError(f"{where} must be at most {_MAX_FIGURE:g}, got {_show(v)}", path=path)
    if positive and x < _MIN_POSITIVE:
        raise UserError(f"{where} must be at least {_MIN_POSITIVE:g}, got {_show(v)}", path=path)
    return x


def _string(v: Any, where: str, path: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise UserError(f"{where} must be a non-empty string, got {_type_name(v)} {_show(v)}", path=path)
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
        raise UserError(f"usable_memory_fraction must be in (0, 1], got {_show(data['usable_memory_fraction'])}", path=path)
    overhead_mb = _number(data["runtime_overhead_mb"], "runtime_overhead_mb", path, nonneg=True)
    if overhead_mb >= memory_mb * frac:
        raise UserError(
            f"runtime_overhead_mb ({overhead_mb:g}) leaves no usable memory "
            f"(memory_mb x usable_memory_fraction = {memory_mb * frac:g})",
            path=path,
        )
    top = _figures(data, "", path)

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

    threads_in = data.get("threads")
    threads: dict[int, Figures] = {}
    if threads_in is not None:
        threads = _threads_table(threads_in, "threads", path, lambda v, where: _figures(v, where, path))
    measurement = _measurement(data.get("measurement"), path)

    return Profile(
        name=name,
        description=description,
        memory_mb=memory_mb,
        usable_memory_fraction=frac,
        runtime_overhead_mb=overhead_mb,
        op_overhead_us=top.op_overhead_us,
        gflops=top.gflops,
        memory_gbps=top.memory_gbps,
        power_idle_w=idle,
        power_busy_w=busy,
        sources=tuple(sources),
        layers=top.layers,
        path=path,
        op_ms_per_melem=top.op_ms_per_melem,
        efficiency=top.efficiency,
        threads=threads,
        measurement=measurement,
    )


def _figures(data: Any, where: str, path: str) -> Figures:
    """The figures at the top level of a profile (where == "") or in one `threads:` entry."""
    at = f"{where}." if where else ""
    if where:
        data = _mapping(data, where, path)
        _check_keys(data, _FIGURE_KEYS, _FIGURE_REQUIRED, where, path)
    op_overhead = _number(data["op_overhead_us"], f"{at}op_overhead_us", path, nonneg=True)
    g = _mapping(data["gflops"], f"{at}gflops", path)
    _check_keys(g, GFLOPS_KEYS, GFLOPS_KEYS, f"{at}gflops", path)
    gflops = {k: _number(g[k], f"{at}gflops.{k}", path, positive=True) for k in GFLOPS_KEYS}
    memory_gbps = _number(data["memory_gbps"], f"{at}memory_gbps", path, positive=True)
    ops: dict[str, float] = {}
    if data.get("op_ms_per_melem") is not None:
        table = _mapping(data["op_ms_per_melem"], f"{at}op_ms_per_melem", path)
        for op, ms in table.items():
            if not _OP_KEY.match(op):
                raise UserError(f"{at}op_ms_per_melem: {_show(op)} is not an operator type (e.g. LRN, or Resize:linear "
                                "for an operator and its mode)", path=path)
            ops[op] = _number(ms, f"{at}op_ms_per_melem.{op}", path, positive=True)
    efficiency = {}
    if data.get("efficiency") is not None:
        eff = _mapping(data["efficiency"], f"{at}efficiency", path)
        _check_keys(eff, EFFICIENCY_KEYS, (), f"{at}efficiency", path)
        efficiency = {k: _curve(v, f"{at}efficiency.{k}", path) for k, v in eff.items()}
    layers = _layers(data.get("layers"), f"{at}layers", path)
    return Figures(op_overhead, gflops, memory_gbps, ops, efficiency, layers)


def _curve(v: Any, where: str, path: str) -> tuple[tuple[float, float], ...]:
    """[[output elements, fraction of peak], ...]: at least one point, elements ascending."""
    if not isinstance(v, list) or not v:
        raise UserError(f"{where} must be a non-empty list of [output elements, fraction] pairs, got "
                        f"{_type_name(v)} {_show(v)}", path=path)
    points = []
    for i, p in enumerate(v):
        if not isinstance(p, list) or len(p) != 2:
            raise UserError(f"{where}[{i}] must be an [output elements, fraction] pair, got {_show(p)}", path=path)
        elems = _number(p[0], f"{where}[{i}] output elements", path, positive=True)
        frac = _number(p[1], f"{where}[{i}] fraction", path, positive=True)
        if frac > _MAX_EFFICIENCY:
            raise UserError(f"{where}[{i}] fraction must be at most {_MAX_EFFICIENCY:g}, got {_show(p[1])}", path=path)
        if points and elems <= points[-1][0]:
            raise UserError(f"{where}: output elements must increase from point to point, got {_show(p[0])} after "
                            f"{points[-1][0]:g}", path=path)
        points.append((elems, frac))
    return tuple(points)


def _layers(v: Any, where: str, path: str) -> dict[str, dict[str, float]]:
    layers: dict[str, dict[str, float]] = {}
    if v is not None:
        for model, table in _mapping(v, where, path).items():
            table = _mapping(table, f"{where}[{_show(model)}]", path)
            layers[model] = {node: _number(ms, f"{where}[{_show(model)}][{_show(node)}]", path, nonneg=True)
                             for node, ms in table.items()}
    return layers


def _threads_table(v: Any, where: str, path: str, entry) -> dict:
    """{thread count: entry(value, where)}: keys are positive integers."""
    if not isinstance(v, dict) or not v:
        raise UserError(f"{where} must be a non-empty mapping of thread counts, got {_type_name(v)} {_show(v)}", path=path)
    out = {}
    for n, value in v.items():
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_THREADS:
            raise UserError(f"{where}: keys must be thread counts, integers 1 to {_MAX_THREADS}, got "
                            f"{_type_name(n)} {_show(n)}", path=path)
        out[n] = entry(value, f"{where}.{n}")
    return out


def _measurement(v: Any, path: str) -> dict[str, Any]:
    """How the figures were measured: informational (no prediction reads it), but typed, so that a tool
    reading it can trust its shape."""
    if v is None:
        return {}
    m = _mapping(v, "measurement", path)
    _check_keys(m, _MEASUREMENT_KEYS, (), "measurement", path)
    for k in ("max_spread", "max_seconds"):
        if k in m:
            _number(m[k], f"measurement.{k}", path, positive=True)
    if "window" in m and (isinstance(m["window"], bool) or not isinstance(m["window"], int) or m["window"] < 1):
        raise UserError(f"measurement.window must be a positive integer, got {_show(m['window'])}", path=path)
    if m.get("load") is not None:
        _load_section(m["load"], path)
    if m.get("threads") is not None:
        _threads_table(m["threads"], "measurement.threads", path, lambda t, where: _timings(t, where, path))
    warnings = m.get("warnings")
    if warnings is not None and (not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings)):
        raise UserError("measurement.warnings must be a list of strings", path=path)
    return m


def _load_section(v: Any, path: str) -> None:
    load = _mapping(v, "measurement.load", path)
    _check_keys(load, _LOAD_KEYS, (), "measurement.load", path)
    if "cpus" in load:
        _number(load["cpus"], "measurement.load.cpus", path, nonneg=True)
    if "verdict" in load and load["verdict"] not in _VERDICTS:
        raise UserError(f"measurement.load.verdict must be one of {', '.join(_VERDICTS)}, got {_show(load['verdict'])}",
                        path=path)
    for k in ("before", "during"):
        if load.get(k) is None:
            continue
        w = _mapping(load[k], f"measurement.load.{k}", path)
        _check_keys(w, _LOAD_WINDOW_KEYS, (), f"measurement.load.{k}", path)
        for f in ("seconds", "other_cpus"):
            if w.get(f) is not None:
                _number(w[f], f"measurement.load.{k}.{f}", path, nonneg=True)
        avg = w.get("loadavg")
        if avg is not None and (not isinstance(avg, list) or len(avg) != 3):
            raise UserError(f"measurement.load.{k}.loadavg must be [1 min, 5 min, 15 min], got {_show(avg)}", path=path)
        for i, x in enumerate(avg or []):
            _number(x, f"measurement.load.{k}.loadavg[{i}]", path, nonneg=True)


def _timings(v: Any, where: str, path: str) -> None:
    for name, t in _mapping(v, where, path).items():
        at = f"{where}[{_show(name)}]"
        t = _mapping(t, at, path)
        _check_keys(t, _TIMING_KEYS, ("runs", "median_ms", "spread", "stable"), at, path)
        if isinstance(t["runs"], bool) or not isinstance(t["runs"], int) or t["runs"] < 1:
            raise UserError(f"{at}.runs must be a positive integer, got {_show(t['runs'])}", path=path)
        _number(t["median_ms"], f"{at}.median_ms", path, nonneg=True)
        _number(t["spread"], f"{at}.spread", path, nonneg=True)
        if not isinstance(t["stable"], bool):
            raise UserError(f"{at}.stable must be true or false, got {_show(t['stable'])}", path=path)
        for f in ("loadavg_1m", "other_cpus"):
            if t.get(f) is not None:
                _number(t[f], f"{at}.{f}", path, nonneg=True)


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
    return f"unknown profile {_show(ref)} (available: {', '.join(avail) if avail else f'none in {profiles_dir()}'})"


def load_profile(ref: str, base_dir: Path | None = None) -> Profile:
    """A profile by name (a file <name>.yaml under the profiles folder) or by path (relative to
    base_dir when given, else to the working directory)."""
    if not isinstance(ref, str) or not ref.strip():
        raise UserError(f"a profile reference must be a non-empty string, got {_show(ref)}")
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
    _check_keys(data, _CLUSTER_KEYS, ("devices",), "cluster file", shown)

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
                f"{where}.name must be 1-64 characters from [A-Za-z0-9._-] starting with a letter or digit, got {_show(name)}",
                path=shown,
            )
        where = f"device {name!r}"
        if name in seen:
            raise UserError(f"duplicate device name {name!r}", path=shown)
        seen.add(name)
        ref = dv["profile"]
        if not isinstance(ref, str) or not ref.strip():
            raise UserError(f"{where}: profile must be a profile name or a path, got {_type_name(ref)} {_show(ref)}", path=shown)
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
        threads = dv.get("threads")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or not 1 <= threads <= _MAX_THREADS):
            raise UserError(f"{where}: threads must be an integer from 1 to {_MAX_THREADS} (the worker's intra-op "
                            f"threads), got {_type_name(threads)} {_show(threads)}", path=shown)
        device = DeviceSpec(name=name, profile=prof, memory_mb=memory_mb, address=address, threads=threads)
        if device.usable_bytes <= 0:
            raise UserError(
                f"{where}: no usable memory ({memory_mb:g} MB x {prof.usable_memory_fraction:g} "
                f"- {prof.runtime_overhead_mb:g} MB runtime overhead)",
                path=shown,
            )
        devices.append(device)

    # network
    if "network" not in data:
        if len(devices) > 1:
            raise UserError(f"missing required key 'network' in cluster file ({len(devices)} devices need one)",
                            path=shown)
        # No pair of devices exists: the defaults are those of "no network hop" and never price a transfer.
        return Cluster(devices=tuple(devices), bandwidth_mbps=_SAME_DEVICE.bandwidth_mbps,
                       latency_ms=_SAME_DEVICE.latency_ms, medium="switched", links={}, path=shown)
    net = _mapping(data["network"], "network", shown)
    _check_keys(net, _NETWORK_KEYS, ("bandwidth_mbps", "latency_ms"), "network", shown)
    bandwidth = _number(net["bandwidth_mbps"], "network.bandwidth_mbps", shown, positive=True)
    latency = _number(net["latency_ms"], "network.latency_ms", shown, nonneg=True)
    medium = net.get("medium", "switched")
    if medium is None:
        medium = "switched"
    if medium not in MEDIUMS:
        raise UserError(f"unknown network.medium {_show(medium)} (allowed: {', '.join(MEDIUMS)})", path=shown)
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
                    f"{where} names unknown device {_show(end)} (devices: {', '.join(d.name for d in devices)})", path=shown
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
