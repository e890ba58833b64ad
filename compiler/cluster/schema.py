"""The schema of cluster.yaml and profile files: pydantic models that say which keys exist, their types and bounds.

Only what one value (or one list) can check alone lives here; checks that relate values to each other (unique
device names, links between known devices, memory left after the runtime, ...) follow the parse, in
profile.py and cluster.py.  A `description` is what an error message says is expected at that place; a custom
error (PydanticCustomError) is a statement of its own.  A field typed without `| None` but defaulting to None
may be left out, yet not written as null.
"""

import math
import re
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError, PydanticKnownError

from .format_names import EFFICIENCY_KEYS, MEDIUMS

__all__ = ["DEVICE_NAME", "MAX_FIGURE", "MIN_POSITIVE", "MAX_THREADS", "MAX_EFFICIENCY", "MAX_FIXED_MS", "ProfileDoc",
           "FiguresDoc", "CpuFiguresDoc", "RuntimeDoc", "ClusterDoc", "DeviceDoc", "LinkDoc", "NetworkDoc"]

DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")  # device names end up in file names and manifests
_OP_KEY = r"^[A-Za-z][A-Za-z0-9_]{0,63}(:[A-Za-z0-9_]{1,32})?\Z"  # op type, or op type:mode
# Bounds that keep the cost model's divisions and sums finite (see the package docstring).
MAX_FIGURE = 1e12
MIN_POSITIVE = 1e-9
MAX_THREADS = 4096
MAX_EFFICIENCY = 4.0  # a tile at most 4x the large benchmark's throughput (edgec profile caps it there)
MAX_FIXED_MS = 10_000.0  # a runtime cost per message, per MB or per request above 10 s is a broken measurement

Positive = Annotated[float, Field(allow_inf_nan=False, ge=MIN_POSITIVE, le=MAX_FIGURE)]
NonNegative = Annotated[float, Field(allow_inf_nan=False, ge=0, le=MAX_FIGURE)]
Fraction = Annotated[float, Field(allow_inf_nan=False, gt=0, le=1, description="a number in (0, 1]")]
Count = Annotated[int, Field(ge=1, description="a positive integer")]
# python-re: \Z, not $ (which matches before a final newline: "a\n" would pass as a device name); \S is what
# str.strip() removes.
NonBlank = Annotated[str, Field(pattern=r"\S", description="a non-empty string")]
ThreadKey = Annotated[int, Field(ge=1, le=MAX_THREADS, description=f"thread counts, integers 1 to {MAX_THREADS}")]
OpKey = Annotated[str, Field(pattern=_OP_KEY,
                             description="operator types (e.g. LRN, or Resize:linear for an operator and its mode)")]
DeviceName = Annotated[str, Field(pattern=DEVICE_NAME.pattern,
                                  description="1-64 characters from [A-Za-z0-9._-] starting with a letter or digit")]
ProfileRef = Annotated[str, Field(pattern=r"\S", description="a profile name or a path")]
WorkerThreads = Annotated[int, Field(ge=1, le=MAX_THREADS,
                                     description=f"an integer from 1 to {MAX_THREADS} (the worker's intra-op threads)")]
Layers = dict[str, dict[str, NonNegative]]  # {model sha256: {onnx node name: ms}}
ProviderName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9]{0,63}ExecutionProvider\Z",
                                    description="an onnxruntime execution provider name (e.g. CUDAExecutionProvider)")]


class _Doc(BaseModel):
    # Strict: a YAML string "3" or a bool is not a number (ints are, and become floats), a set is not a list.
    model_config = ConfigDict(strict=True, extra="forbid", regex_engine="python-re", frozen=True)


class CurvePoint(NamedTuple):
    output_size: Positive
    fraction: Annotated[float, Field(allow_inf_nan=False, ge=MIN_POSITIVE, le=MAX_EFFICIENCY)]


def _two_items(v: Any) -> Any:
    # A YAML pair is a list of two; a NamedTuple alone would also take a mapping.  A pydantic error type, not a
    # custom one, so that the message says what the place expects (its description).
    if not isinstance(v, list) or len(v) != 2:
        raise PydanticKnownError("tuple_type")
    return tuple(v)


def _increasing(points: list[CurvePoint]) -> list[CurvePoint]:
    for prev, p in zip(points, points[1:]):
        if p.output_size <= prev.output_size:
            raise PydanticCustomError("not_increasing", "output sizes must increase from point to point, got "
                                      "{got} after {prev}", {"got": f"{p.output_size:g}",
                                                             "prev": f"{prev.output_size:g}"})
    return points


Curve = Annotated[
    list[Annotated[CurvePoint, BeforeValidator(_two_items),
                   Field(description="an [output size, fraction] pair")]],
    Field(min_length=1, description="a non-empty list of [output size, fraction] pairs"),
    AfterValidator(_increasing),
]


class GflopsDoc(_Doc):
    """GFLOP/s per operator class.  The int8 classes (the kernels of quantized models: QLinearConv, ConvInteger,
    QLinearMatMul, MatMulInteger, QGemm, and the Q/DQ units onnxruntime fuses into them) are optional: a
    profile without one prices that class at its float class's figure (conv_int8 at conv, depthwise_conv_int8
    at depthwise_conv, gemm_int8 at gemm), an int8 kernel taken as no faster than the float one."""

    conv: Positive
    depthwise_conv: Positive
    gemm: Positive
    other: Positive
    conv_int8: Positive | None = None
    depthwise_conv_int8: Positive | None = None
    gemm_int8: Positive | None = None


class FiguresDoc(_Doc):
    """One `threads:` entry: the top level's figures, same names and bounds."""

    op_overhead_us: NonNegative
    gflops: GflopsDoc
    memory_gbps: Positive
    weight_gbps: Positive | None = None
    gemm_weight_gbps: Positive | None = None
    op_ms_per_melem: dict[OpKey, Positive] | None = None
    efficiency: dict[Literal[EFFICIENCY_KEYS], Curve] | None = None
    layers: Layers | None = None


class CpuFiguresDoc(FiguresDoc):
    """A profile measured with an accelerator (`providers:`): the same figures measured with the CPU provider
    alone, at the top level's thread count and per count (`threads:`), at which the compiler prices the nodes the
    accelerator leaves to the CPU (cost/claims.py)."""

    threads: Annotated[dict[ThreadKey, FiguresDoc],
                       Field(min_length=1, description="a non-empty mapping of thread counts")] | None = None


Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}\Z", description="model sha256s (64 lowercase hex digits)")]
NodeName = Annotated[str, Field(min_length=1, description="a node name")]
CpuNodes = dict[Sha256, Annotated[list[NodeName], Field(description="a list of node names")]]


FixedMs = Annotated[float, Field(allow_inf_nan=False, ge=0, le=MAX_FIXED_MS,
                                  description=f"a number of milliseconds from 0 to {MAX_FIXED_MS:g}")]


class RuntimeDoc(_Doc):
    """The runtime's own costs on this device (`edgec profile` measures them; absent: 0), in ms:
    message_ms per device-to-device message (encode, CURVE, ZeroMQ hand-off and decode, both ends),
    message_ms_per_mb per 10^6 bytes of it (host copies and encryption), request_ms per request (a model
    input in from the coordinator and an output out to it), run_ms per tile fragment run (what a fragment
    run in a plan takes beyond the same run timed alone and hot); the *_cpu_* figures are the same in CPU
    time of every process and thread of the runtime (absent: the time figures stand in)."""

    message_ms: FixedMs = 0.0
    message_ms_per_mb: FixedMs = 0.0
    request_ms: FixedMs = 0.0
    run_ms: FixedMs = 0.0
    message_cpu_ms: FixedMs | None = None
    message_cpu_ms_per_mb: FixedMs | None = None
    request_cpu_ms: FixedMs | None = None


class PowerDoc(_Doc):
    idle: Positive | None = None
    busy: Positive | None = None


class RadioDoc(_Doc):
    """Energy of the device's network interface per byte it sends (tx) and receives (rx), in nJ, on top of
    its idle and busy power (cost/energy.py)."""

    tx: NonNegative
    rx: NonNegative


ModeName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}\Z",
                                description="1-32 characters from [A-Za-z0-9._-] starting with a letter or digit")]


class ModePowerDoc(_Doc):
    idle: Positive
    busy: Positive


class ModeDoc(_Doc):
    """A power mode: an operating point of the device (e.g. a Jetson nvpmodel, a lower arm_freq), with its
    own power and the compute figures that differ from the top level's (the rest are the top level's)."""

    power_w: ModePowerDoc
    sources: Annotated[list[NonBlank], Field(min_length=1, description="a non-empty list of non-empty strings")]
    op_overhead_us: NonNegative | None = None
    gflops: GflopsDoc | None = None
    memory_gbps: Positive | None = None
    weight_gbps: Positive | None = None
    gemm_weight_gbps: Positive | None = None
    op_ms_per_melem: dict[OpKey, Positive] | None = None


class LoadWindowDoc(_Doc):
    seconds: NonNegative | None = None
    other_cpus: NonNegative | None = None
    loadavg: Annotated[list[NonNegative],
                       Field(min_length=3, max_length=3, description="[1 min, 5 min, 15 min]")] | None = None


class LoadDoc(_Doc):
    cpus: NonNegative = None
    busy_rule: Any = None  # prose for the reader
    verdict: Literal["quiet", "busy", "unknown"] = None
    before: LoadWindowDoc | None = None
    during: LoadWindowDoc | None = None


class TimingDoc(_Doc):
    runs: Count
    rounds: Count | None = None  # rounds taken (policy rounds + retries); profiles before it have none
    median_ms: NonNegative
    spread: NonNegative
    stable: bool
    loadavg_1m: NonNegative | None = None
    other_cpus: NonNegative | None = None
    # shared_weight_gbps' only (profile/shared.py): the rates the figure is at (shared over alone; the figure is
    # weight_gbps times it), the micro-benchmarks' pairs counted, the pairs of every set that contended, and the
    # pairs of the sets taken at the profile's end; later_paired_ratio is in profiles written before 2026-11-27
    paired_ratio: Positive | None = None
    pairs: Annotated[int, Field(ge=0, description="a non-negative integer")] | None = None
    contended_pairs: Annotated[int, Field(ge=0, description="a non-negative integer")] | None = None
    later_paired_ratio: Positive | None = None
    later_pairs: Annotated[int, Field(ge=0, description="a non-negative integer")] | None = None


class MemoryDriftDoc(_Doc):
    """memory_gbps' rate over the first and the second half of its rounds in one thread count's pass
    (profile/drift.py)."""

    first_gbps: Positive
    second_gbps: Positive
    moved: Annotated[float, Field(allow_inf_nan=False, gt=-1, le=MAX_FIGURE,
                                  description="a number above -1")]  # second / first - 1
    rounds: Count


class CpuQuotaDoc(_Doc):
    """The CPU share `edgec profile` saw (runtime/profile/quota.py): the cgroup's CFS quota, read, and a spinning
    thread's share, measured; at a thread count above it, the length of each timing's samples. The figures
    already follow the share; `burst_ms` times lone requests (compiler/cost/quota_burst.py)."""

    cores: Positive | None = None  # quota / period; None: no quota, or none readable
    period_us: Count | None = None
    source: str = ""  # where the quota was read, or why it could not be
    read: bool = True  # whether the cgroup files were read
    measured_share: NonNegative | None = None  # CPU time / wall time of a spinning thread
    burst_ms: NonNegative | None = None  # CPU ms a thread ran at full speed after idle before its first stall
    sample_ms: Annotated[dict[ThreadKey, Positive],
                         Field(min_length=1, description="a non-empty mapping of thread counts")] | None = None


class MeasurementDoc(_Doc):
    """How `edgec profile` measured: informational (no prediction reads it), but typed, so that a tool reading
    it can trust its shape."""

    max_spread: Positive = None
    window: Count = None
    max_seconds: Positive = None
    load: LoadDoc | None = None
    memory_drift: Annotated[dict[ThreadKey, MemoryDriftDoc],
                            Field(min_length=1, description="a non-empty mapping of thread counts")] | None = None
    threads: Annotated[dict[ThreadKey, dict[str, TimingDoc]],
                       Field(min_length=1, description="a non-empty mapping of thread counts")] | None = None
    warnings: Annotated[list[str], Field(description="a list of strings")] | None = None
    runtime: dict[Annotated[str, Field(pattern=r"^[a-z_]{1,32}\Z", description="timing names")], TimingDoc] | None = None


class ProfileDoc(_Doc):
    """A profile file; the keys in the order the messages list them."""

    name: NonBlank
    description: str | None = ""
    memory_mb: Positive
    usable_memory_fraction: Fraction
    runtime_overhead_mb: NonNegative
    op_overhead_us: NonNegative
    gflops: GflopsDoc
    memory_gbps: Positive
    weight_gbps: Positive | None = None
    gemm_weight_gbps: Positive | None = None
    shared_weight_gbps: Positive | None = None  # weight_gbps while every other core streams its own
    layout_conversions: bool = False  # onnxruntime converts a conv chain's activations at a fragment's ends
    power_w: PowerDoc | None = None
    radio_nj_per_byte: RadioDoc | None = None
    mode: ModeName | None = None  # the name of the top-level operating point, with `modes`
    modes: Annotated[dict[ModeName, ModeDoc],
                     Field(min_length=1, description="a non-empty mapping of mode names")] | None = None
    sources: Annotated[list[NonBlank], Field(description="a list of non-empty strings")] | None = None
    layers: Layers | None = None
    op_ms_per_melem: dict[OpKey, Positive] | None = None
    efficiency: dict[Literal[EFFICIENCY_KEYS], Curve] | None = None
    threads: Annotated[dict[ThreadKey, FiguresDoc],
                       Field(min_length=1, description="a non-empty mapping of thread counts")] | None = None
    runtime: RuntimeDoc | None = None
    measurement: MeasurementDoc | None = None
    cpu_quota: CpuQuotaDoc | None = None
    providers: Annotated[list[ProviderName],
                         Field(min_length=1, description="a non-empty list of execution provider names")] | None = None
    cpu: CpuFiguresDoc | None = None  # with an accelerator in providers: the CPU provider's own figures
    cpu_nodes: CpuNodes | None = None  # {model sha256: the nodes the CPU provider runs beside the accelerator}


HostCores = Annotated[int, Field(ge=1, le=MAX_THREADS, description=f"an integer from 1 to {MAX_THREADS}")]


class HostDoc(_Doc):
    """A machine that several devices' workers (and perhaps the coordinator) share: its cores bound what
    they compute together per request (cost/evaluate.py)."""

    cores: HostCores
    coordinator: bool = False  # `edgec run` runs on this machine too


OptionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}\Z", description="option names (1-64 characters "
                                                                                  "from [A-Za-z0-9_.-])")]


def _option_text(v: Any) -> Any:
    # onnxruntime takes provider options as strings: a number becomes its YAML text. A boolean is refused:
    # providers spell them differently ("true", "True", "1"), so the file says which.
    if isinstance(v, bool):
        raise PydanticCustomError("option_bool", "is a boolean: write it as the provider spells it, as a string "
                                  "(e.g. 'true' or '1')")
    if isinstance(v, (int, float)) and math.isfinite(v):
        return str(v)
    return v


OptionValue = Annotated[str, BeforeValidator(_option_text), Field(description="a string or a number")]


def _named_entry(v: Any) -> Any:
    # A bare name is a provider without options: one form for the schema below.
    return {v: {}} if isinstance(v, str) else v


ProviderEntry = Annotated[
    dict[ProviderName, dict[OptionName, OptionValue]],
    BeforeValidator(_named_entry),
    Field(min_length=1, max_length=1, description="a provider name, or {provider name: {option: value}}"),
]


class DeviceDoc(_Doc):
    name: DeviceName
    profile: ProfileRef
    memory_mb: Positive | None = None  # None: the profile's
    address: NonBlank | None = None
    threads: WorkerThreads | None = None  # None: the runtime's default
    host: DeviceName | None = None  # a `hosts:` entry: the machine its worker shares with others
    providers: Annotated[list[ProviderEntry],
                         Field(min_length=1, description="a non-empty list of execution providers")] | None = None

    @staticmethod
    def message_label(raw: Any) -> str | None:
        """A device with a valid name is called by it in messages: "device 'pi5-a': memory_mb ..."."""
        name = raw.get("name") if isinstance(raw, dict) else None
        return f"device {name!r}" if isinstance(name, str) and DEVICE_NAME.match(name) else None


class LinkDoc(_Doc):
    a: str
    b: str
    bandwidth_mbps: Positive | None = None  # None: the network's
    latency_ms: NonNegative | None = None


class NetworkDoc(_Doc):
    bandwidth_mbps: Positive
    latency_ms: NonNegative
    medium: Literal[MEDIUMS] | None = None  # None: switched
    links: list[LinkDoc] | None = None


class ClusterDoc(_Doc):
    devices: list[DeviceDoc] | None  # required; null or [] is "no devices", said after the parse
    network: NetworkDoc = None  # absent: a one-device cluster; a null value is an error
    hosts: Annotated[dict[DeviceName, HostDoc],
                     Field(min_length=1, description="a non-empty mapping of host names")] | None = None
