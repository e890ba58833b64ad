"""Device profiles: the profile files under profiles/ (or anywhere) -> validated `Profile`s."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgec.compiler.errors import UserError
from edgec.runtime.providers import CPU

from .format_names import GFLOPS_KEYS, INT8_GFLOPS_KEYS
from .quote import show
from .yamlio import read_yaml

if TYPE_CHECKING:
    from .schema import FiguresDoc, ProfileDoc

__all__ = [
    "PROFILES_DIR", "Figures", "CpuFigures", "pick_figures", "Mode", "DEFAULT_MODE", "RuntimeFigures", "NO_RUNTIME_FIGURES", "Profile", "profiles_dir", "available_profiles", "load_profile", "validate_profile_dict",
    "profile_path", "unknown_profile", "read_profile",
]

_DEFAULT_PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"
PROFILES_DIR: Path = Path(os.environ["EDGEC_PROFILES"]) if os.environ.get("EDGEC_PROFILES") else _DEFAULT_PROFILES_DIR


@dataclass(frozen=True)
class Figures:
    """What a device does at one intra-op thread count (a profile's top level, or one `threads:` entry)."""

    op_overhead_us: float
    gflops: dict[str, float] = field(hash=False)
    memory_gbps: float
    op_ms_per_melem: dict[str, float] = field(hash=False)  # {op type or "op type:mode": ms per 1e6 output elements}
    efficiency: dict[str, tuple[tuple[float, float], ...]] = field(hash=False)  # {conv|depthwise_conv|gemm: ((out elems, fraction), ...)} ascending
    layers: dict[str, dict[str, float]] = field(hash=False, repr=False)  # {model sha256: {node name: ms}}
    # GB/s at which a layer's weights stream in from memory on top of its compute (None: not measured, weights
    # are not priced beyond the roofline's bytes): see cost/table.py.
    weight_gbps: float | None = None
    # the same for a GEMM of several rows, whose weights, read from memory, hold its arithmetic up longer per
    # byte than a batch-1 MatMul's stream (None: not measured, weight_gbps prices them): see cost/table.py.
    gemm_weight_gbps: float | None = None


def pick_figures(top: Figures, per_count: dict[int, Figures], threads: int | None) -> Figures:
    """The figures for a worker running `threads` intra-op threads: that count's entry if measured; else the
    largest measured count below it (fewer threads: a slower, safe estimate); else the smallest measured. The top
    level when `threads` is None or there is no count."""
    if threads is None or not per_count:
        return top
    if threads in per_count:
        return per_count[threads]
    below = [n for n in per_count if n < threads]
    return per_count[max(below)] if below else per_count[min(per_count)]


@dataclass(frozen=True)
class CpuFigures:
    """A profile measured with an accelerator: the CPU provider's own figures (`cpu:`, measured with it alone),
    at which the compiler prices the nodes the accelerator leaves to the CPU (cost/claims.py)."""

    top: Figures
    threads: dict[int, Figures] = field(default_factory=dict, hash=False)

    def figures(self, threads: int | None = None) -> Figures:
        return pick_figures(self.top, self.threads, threads)


@dataclass(frozen=True)
class RuntimeFigures:
    """What edgec's runtime itself costs on a device, in ms (the profile's `runtime:`; 0 where unmeasured).

    message_ms: one device-to-device message beyond its bytes on the wire: encoding, CURVE encryption, the
      ZeroMQ hand-off and decoding, both ends together (measured with both ends on this device).
    message_ms_per_mb: the same per 10^6 bytes of the message (host copies, encryption).
    request_ms: one request's model input in from the coordinator and output out to it, beyond the
      fragment's own run.
    run_ms: a fragment's run in a plan beyond the same run timed alone and hot (as the profile times its
      figures): between two runs the runtime handles messages, which leaves onnxruntime's code and data
      out of the caches. Every tile fragment of a spatial stage pays it (cost/tiles.py); a pipeline
      stage's one fragment of milliseconds is not charged it.
    message_cpu_ms, message_cpu_ms_per_mb, request_cpu_ms: the same in CPU time, every process and thread of
      the runtime counted (ZeroMQ's I/O threads encrypt while the sender goes on, so a message takes more
      CPU than time); None where not measured: the time figures stand in. They price what devices sharing
      a machine take of its cores (cost/cpu_bounds.py `host_periods`), not the timeline.
    """

    message_ms: float = 0.0
    message_ms_per_mb: float = 0.0
    request_ms: float = 0.0
    message_cpu_ms: float | None = None
    message_cpu_ms_per_mb: float | None = None
    request_cpu_ms: float | None = None
    run_ms: float = 0.0

    def __bool__(self) -> bool:
        return any((self.message_ms, self.message_ms_per_mb, self.request_ms, self.run_ms))

    def cpu(self) -> "RuntimeFigures":
        """The CPU figures as message_ms, message_ms_per_mb and request_ms (each time figure where its CPU
        figure was not measured)."""
        def pick(cpu: float | None, time_ms: float) -> float:
            return time_ms if cpu is None else cpu
        return RuntimeFigures(pick(self.message_cpu_ms, self.message_ms),
                            pick(self.message_cpu_ms_per_mb, self.message_ms_per_mb),
                            pick(self.request_cpu_ms, self.request_ms))

    def to_dict(self) -> dict[str, float]:
        return {"message_ms": self.message_ms, "message_ms_per_mb": self.message_ms_per_mb,
                "request_ms": self.request_ms}


NO_RUNTIME_FIGURES = RuntimeFigures()
DEFAULT_MODE = "default"  # the top level's operating point, when the profile does not name it (`mode:`)


@dataclass(frozen=True)
class Mode:
    """A power mode (the profile's `modes:` entry): the figures the device computes with in it (measured
    tables do not carry over: they were taken at the top level's operating point) and its power."""

    figures: Figures
    idle_w: float
    busy_w: float
    sources: tuple[str, ...]


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
    runtime: RuntimeFigures = NO_RUNTIME_FIGURES  # the runtime's fixed costs (not per thread count: no onnxruntime in them)
    # The CPU quota (cores) the profile was measured under (`cpu_quota.cores`, read from the cgroup); None: none.
    # Its figures already follow the quota; the worker's messaging shares it too (cost/cpu_bounds.py quota_periods).
    cpu_quota_cores: float | None = None
    # CPU ms a thread ran at full speed after idle before the quota's first stall (`cpu_quota.burst_ms`): a lone
    # request's work up to it runs at full speed (cost/quota_burst.py); None: not measured.
    cpu_quota_burst_ms: float | None = None
    radio_tx_nj_per_byte: float | None = None  # the network interface's energy per byte sent; None: unknown
    radio_rx_nj_per_byte: float | None = None  # ... per byte received
    modes: dict[str, Mode] = field(default_factory=dict, hash=False, repr=False)  # power modes besides the top level's
    top_mode: str = DEFAULT_MODE  # the name of the top level's operating point
    weight_gbps: float | None = None  # top level: see Figures
    gemm_weight_gbps: float | None = None  # top level: see Figures
    # The rate one core streams weights at while every other core of the machine streams its own (None: not
    # measured): what a tile of a device pays for its weights while a device on the same host (the cluster's
    # `hosts:`) runs a tile of the same segment (cost/table.py shared_weight_ms).
    shared_weight_gbps: float | None = None
    # onnxruntime runs convolutions here in a blocked layout (NCHWc), so a fragment converts a conv chain's
    # activations at its ends and around a crop inside it (edgec profile reads it from the graph onnxruntime
    # optimises; cost/tiles.py Relayout prices each conversion as a read and a write at memory_gbps).
    layout_conversions: bool = False
    # The onnxruntime execution providers its figures were measured (or estimated) with, in order: the CPU's
    # alone unless the file says otherwise (cluster.py provider_note says how a device running others is priced).
    providers: tuple[str, ...] = (CPU,)
    # Measured with an accelerator among `providers`: the CPU provider's own figures (None: not measured), and per
    # model (sha256) the nodes the CPU provider ran beside the accelerator (cost/claims.py prices them with `cpu`).
    cpu: CpuFigures | None = field(default=None, hash=False, repr=False)
    cpu_nodes: dict[str, frozenset[str]] = field(default_factory=dict, hash=False, repr=False)

    @property
    def mode_names(self) -> tuple[str, ...]:
        """Every operating point: the top level's first, then `modes:` in file order."""
        return (self.top_mode, *self.modes)

    def mode_figures(self, mode: str, threads: int | None = None) -> Figures:
        """The figures of a worker in `mode` (the top level's: `figures(threads)`)."""
        return self.figures(threads) if mode == self.top_mode else self.modes[mode].figures

    def mode_power(self, mode: str) -> tuple[float | None, float | None]:
        """(idle W, busy W) in `mode`."""
        if mode == self.top_mode:
            return self.power_idle_w, self.power_busy_w
        return self.modes[mode].idle_w, self.modes[mode].busy_w

    def figures(self, threads: int | None = None) -> Figures:
        """The figures for a worker running `threads` intra-op threads: that count's entry if measured;
        else the largest measured count below it (fewer threads: a slower, safe estimate); else the
        smallest measured.  The top level when `threads` is None or the profile has no `threads:`."""
        top = Figures(self.op_overhead_us, self.gflops, self.memory_gbps, self.op_ms_per_melem, self.efficiency,
                      self.layers, self.weight_gbps, self.gemm_weight_gbps)
        return pick_figures(top, self.threads, threads)


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


def profile_path(ref: str, base_dir: Path | None) -> Path | None:
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


def unknown_profile(ref: str) -> str:
    avail = available_profiles()
    return f"unknown profile {show(ref)} (available: {', '.join(avail) if avail else f'none in {profiles_dir()}'})"


def read_profile(path: Path) -> Profile:
    return validate_profile_dict(read_yaml(path, "profile file"), str(path))


def load_profile(ref: str, base_dir: Path | None = None) -> Profile:
    """A profile by name (a file <name>.yaml under the profiles folder) or by path (relative to
    base_dir when given, else to the working directory)."""
    if not isinstance(ref, str) or not ref.strip():
        raise UserError(f"a profile reference must be a non-empty string, got {show(ref)}")
    p = profile_path(ref, base_dir)
    if p is None:
        raise UserError(unknown_profile(ref))
    return read_profile(p)


def validate_profile_dict(data: Any, path: str) -> Profile:
    """Check a parsed profile (as read from YAML, or as built by `edgec profile`) and build a Profile.

    Raises UserError(..., path=path) on the first problem."""
    # Imported here: pydantic doubles this package's import time, and most importers (the cost model,
    # `edgec inspect` and `simulate` of a manifest) use the dataclasses without reading a file.
    from .messages import parse
    from .schema import ProfileDoc

    doc = parse(ProfileDoc, data, path, root="profile")
    _check_relations(doc, path)
    top = _figures(doc)
    power = doc.power_w
    return Profile(
        name=doc.name,
        description=doc.description or "",
        memory_mb=doc.memory_mb,
        usable_memory_fraction=doc.usable_memory_fraction,
        runtime_overhead_mb=doc.runtime_overhead_mb,
        op_overhead_us=top.op_overhead_us,
        gflops=top.gflops,
        memory_gbps=top.memory_gbps,
        power_idle_w=power.idle if power else None,
        power_busy_w=power.busy if power else None,
        sources=tuple(doc.sources or ()),
        layers=top.layers,
        path=path,
        op_ms_per_melem=top.op_ms_per_melem,
        efficiency=top.efficiency,
        threads={n: _figures(entry) for n, entry in (doc.threads or {}).items()},
        # Informational: kept as written (the schema checked its shape), for the tools that read it.
        measurement=data["measurement"] if doc.measurement is not None else {},
        cpu_quota_cores=doc.cpu_quota.cores if doc.cpu_quota is not None and doc.cpu_quota.read else None,
        cpu_quota_burst_ms=doc.cpu_quota.burst_ms if doc.cpu_quota is not None and doc.cpu_quota.read else None,
        runtime=NO_RUNTIME_FIGURES if doc.runtime is None else RuntimeFigures(
            doc.runtime.message_ms, doc.runtime.message_ms_per_mb, doc.runtime.request_ms,
            doc.runtime.message_cpu_ms, doc.runtime.message_cpu_ms_per_mb, doc.runtime.request_cpu_ms,
            doc.runtime.run_ms),
        radio_tx_nj_per_byte=doc.radio_nj_per_byte.tx if doc.radio_nj_per_byte else None,
        radio_rx_nj_per_byte=doc.radio_nj_per_byte.rx if doc.radio_nj_per_byte else None,
        modes={name: _mode(m, top) for name, m in (doc.modes or {}).items()},
        top_mode=doc.mode or DEFAULT_MODE,
        weight_gbps=top.weight_gbps,
        gemm_weight_gbps=top.gemm_weight_gbps,
        shared_weight_gbps=doc.shared_weight_gbps,
        layout_conversions=doc.layout_conversions,
        providers=tuple(doc.providers) if doc.providers else (CPU,),
        cpu=None if doc.cpu is None else CpuFigures(_figures(doc.cpu), {n: _figures(e) for n, e in
                                                                        (doc.cpu.threads or {}).items()}),
        cpu_nodes={model: frozenset(nodes) for model, nodes in (doc.cpu_nodes or {}).items()},
    )


def _mode(doc, top: Figures) -> Mode:
    """A `modes:` entry over the top level's figures. Its op table, when it gives none, is the top level's
    scaled by the ratio of `gflops.other` (the operators it prices run on the same units, at the mode's
    clocks)."""
    gflops = top.gflops if doc.gflops is None else _gflops(doc.gflops)
    scale = top.gflops["other"] / gflops["other"]
    ops = ({k: v * scale for k, v in top.op_ms_per_melem.items()} if doc.op_ms_per_melem is None
           else dict(doc.op_ms_per_melem))
    figures = Figures(
        op_overhead_us=top.op_overhead_us if doc.op_overhead_us is None else doc.op_overhead_us,
        gflops=gflops,
        memory_gbps=top.memory_gbps if doc.memory_gbps is None else doc.memory_gbps,
        op_ms_per_melem=ops,
        efficiency=top.efficiency,
        layers={},
        weight_gbps=top.weight_gbps if doc.weight_gbps is None else doc.weight_gbps,
        gemm_weight_gbps=top.gemm_weight_gbps if doc.gemm_weight_gbps is None else doc.gemm_weight_gbps,
    )
    return Mode(figures, doc.power_w.idle, doc.power_w.busy, tuple(doc.sources))


def _check_relations(doc: ProfileDoc, path: str) -> None:
    """The checks that relate one figure to another (each figure alone is the schema's)."""
    usable = doc.memory_mb * doc.usable_memory_fraction
    if doc.runtime_overhead_mb >= usable:
        raise UserError(f"runtime_overhead_mb ({doc.runtime_overhead_mb:g}) leaves no usable memory "
                        f"(memory_mb x usable_memory_fraction = {usable:g})", path=path)
    power = doc.power_w
    if power is not None and power.idle is not None and power.busy is not None and power.busy < power.idle:
        raise UserError(f"power_w.busy ({power.busy:g}) is below power_w.idle ({power.idle:g})", path=path)
    if doc.mode is not None and not doc.modes:
        raise UserError(f"mode {doc.mode!r} names the top level's operating point, but there are no modes", path=path)
    top = doc.mode or DEFAULT_MODE
    for name, m in (doc.modes or {}).items():
        if name == top:
            raise UserError(f"modes.{name}: the top level's operating point is already called {top!r}", path=path)
        if m.power_w.busy < m.power_w.idle:
            raise UserError(f"modes.{name}.power_w.busy ({m.power_w.busy:g}) is below its idle "
                            f"({m.power_w.idle:g})", path=path)
    _check_cpu(doc, path)
    if doc.modes and (power is None or power.idle is None or power.busy is None):
        raise UserError("modes need power_w (idle and busy) at the top level too: the planner weighs them "
                        "against it", path=path)


def _check_cpu(doc: ProfileDoc, path: str) -> None:
    """`cpu:` and `cpu_nodes:` belong to a profile measured with an accelerator; a node listed twice, or not in the
    profile's own table of that model, is a broken file."""
    for key in ("cpu", "cpu_nodes"):
        if getattr(doc, key) is not None and all(p == CPU for p in doc.providers or [CPU]):
            raise UserError(f"{key}: the CPU provider's figures and nodes beside an accelerator, but 'providers' "
                            f"lists none ({', '.join(doc.providers or [CPU])})", path=path)
    for model, nodes in (doc.cpu_nodes or {}).items():
        seen: set[str] = set()
        twice = next((n for n in nodes if n in seen or seen.add(n)), None)
        if twice is not None:
            raise UserError(f"cpu_nodes.{model[:12]}...: {twice!r} is listed twice", path=path)
        table = (doc.layers or {}).get(model)
        stray = next((n for n in nodes if table is not None and n not in table), None)
        if stray is not None:
            raise UserError(f"cpu_nodes.{model[:12]}...: {stray!r} is not a node of the profile's table of that "
                            "model (layers)", path=path)


def _gflops(doc) -> dict[str, float]:
    """The classes' figures; an int8 class the profile leaves out is absent (cost/table.py's class_gflops
    prices it at its float class's, as the schema's GflopsDoc says)."""
    out = {k: getattr(doc, k) for k in GFLOPS_KEYS}
    return out | {k: getattr(doc, k) for k in INT8_GFLOPS_KEYS if getattr(doc, k) is not None}


def _figures(doc: ProfileDoc | FiguresDoc) -> Figures:
    """The figures at the top level of a profile, or in one `threads:` entry."""
    return Figures(
        op_overhead_us=doc.op_overhead_us,
        gflops=_gflops(doc.gflops),
        memory_gbps=doc.memory_gbps,
        op_ms_per_melem=dict(doc.op_ms_per_melem or {}),
        efficiency={k: tuple((p.output_size, p.fraction) for p in curve)
                    for k, curve in (doc.efficiency or {}).items()},
        layers={model: dict(table) for model, table in (doc.layers or {}).items()},
        weight_gbps=doc.weight_gbps,
        gemm_weight_gbps=doc.gemm_weight_gbps,
    )
