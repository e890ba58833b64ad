"""Manifest dataclasses (format version 1, and 2 for a generative build); the schema is documented in load.py."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..linkmodel import link as link_figures
from ..linkmodel import wire_ms
from ..providers import CPU_ONLY, Provider

__all__ = [
    "HOST", "DTYPES", "GENERATE_VERSION", "FEEDS", "DIM_ROLES", "StateSpec", "Generate", "TensorSpec", "OutputSpec", "Device", "Link", "RuntimeCosts", "Network", "Fragment", "Region", "Regions",
    "region_ranges", "Transfer", "Run", "Send", "Recv", "Slice", "Concat", "Free", "Step", "Fallback", "Alternative", "Manifest",
]

logger = logging.getLogger(__name__)

HOST = "@host"
# A generative build's manifest (`edgec compile --generate`) is version 2: a runtime that reads only version 1
# would run it as one pass and feed its caches from the host, so it refuses it instead.
GENERATE_VERSION = 2
FEEDS = ("token", "positions", "mask")  # how the runtime makes each input of a generative build's step
DIM_ROLES = ("seq", "past", "total")  # what a dimension that changes from step to step counts
DTYPES = frozenset({
    "float16", "float32", "float64", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64", "bool",
})


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize  # Python ints: 2**70 does not wrap


@dataclass(frozen=True)
class OutputSpec(TensorSpec):
    device: str = ""


@dataclass(frozen=True)
class Device:
    name: str
    profile: str
    memory_mb: float
    address: str | None
    threads: int | None = None  # the worker's intra-op threads the plan was priced for (cluster.yaml); None: default
    # Energy figures the plan was priced with (W; nJ per byte sent / received); None: unknown. Informational:
    # `edgec simulate` prices a replay's energy with them, the runtime itself does not read them.
    idle_w: float | None = None
    busy_w: float | None = None
    tx_nj_per_byte: float | None = None
    rx_nj_per_byte: float | None = None
    mode: str | None = None  # the power mode the plan needs the device to run in; None: its only one
    # The onnxruntime execution providers its sessions are created with, in order (absent: the CPU's alone).
    providers: tuple[Provider, ...] = CPU_ONLY


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    bandwidth_mbps: float
    latency_ms: float


@dataclass(frozen=True)
class RuntimeCosts:
    """The runtime's own costs on one device, in ms (the profile's `runtime:`, as compiled into
    network.costs): per message (both ends together), per 10^6 bytes of a message, per request."""

    message_ms: float = 0.0
    message_ms_per_mb: float = 0.0
    request_ms: float = 0.0


_NO_COSTS = RuntimeCosts()


@dataclass(frozen=True)
class Network:
    bandwidth_mbps: float
    latency_ms: float
    medium: str
    links: tuple[Link, ...]
    costs: dict[str, RuntimeCosts] = field(default_factory=dict, hash=False)  # per device; one not listed costs 0

    def cost(self, device: str) -> RuntimeCosts:
        return self.costs.get(device, _NO_COSTS)

    def link(self, a: str, b: str) -> tuple[float, float]:
        """(bandwidth_mbps, latency_ms) between two devices; a link entry overrides the defaults (the last
        entry for a pair, as when the manifest is read as JSON)."""
        for lk in reversed(self.links):
            if {lk.a, lk.b} == {a, b}:
                return lk.bandwidth_mbps, lk.latency_ms
        return self.bandwidth_mbps, self.latency_ms

    def message_link(self, a: str, b: str) -> tuple[float, float]:
        """(bytes per ms, latency ms) of a message from a to b under the link model (linkmodel.link): the
        link's figures with the runtime's cost of a message at both ends folded in."""
        return link_figures(*self.link(a, b), self.cost(a), self.cost(b))

    def transfer_s(self, a: str, b: str, nbytes: int) -> float:
        """Seconds to move nbytes from a to b under the link model (`message_link`): a message the runtime
        sends takes the link's latency even with no bytes (linkmodel.wire_ms)."""
        return wire_ms(nbytes, *self.message_link(a, b)) / 1000.0


@dataclass(frozen=True)
class StateSpec:
    """State a fragment keeps from one step of a sequence to the next: `output` of this step is `input` at
    the next; `shape` (with 0 along `axis`) and `dtype` make its empty value before the first step; it
    grows along `axis`, to at most `max_length`."""

    input: str
    output: str
    dtype: str
    shape: tuple[int, ...]
    axis: int
    max_length: int


@dataclass(frozen=True)
class Fragment:
    id: str
    device: str
    file: str
    sha256: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    predicted_ms: float
    state: tuple[StateSpec, ...] = ()  # a generative build's (version 2); empty otherwise

    @property
    def state_inputs(self) -> frozenset[str]:
        return frozenset(s.input for s in self.state)


@dataclass(frozen=True)
class Generate:
    """A generative build's `generate` block: the prompt length and context the plan was priced for, the
    input that takes the token id, the output (and the fragment that gives it) the token is chosen from,
    how each host input of a step is made (`feeds`: FEEDS), and the shapes of the host inputs, the logits
    and the state: per dimension a size, or the role (DIM_ROLES) of one that changes from step to step."""

    prompt_len: int
    max_context: int
    priced_past: int
    token_input: str
    token_dtype: str
    logits_output: str
    logits_fragment: str
    feeds: dict[str, str]
    shapes: dict[str, tuple[int | str, ...]]
    # the steps the plan was priced at: {"prefill": {"seq": prompt_len, "past": 0}, "decode": {"seq": 1,
    # "past": priced_past}} (a sequence's steps run at any seq and past up to max_context)
    phases: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Region:
    axis: int
    start: int
    stop: int


# A send's region: one range (the version-1 form) or a box of ranges on distinct axes (a 2-D tile).
Regions = Union[Region, tuple[Region, ...]]


def region_ranges(region: Regions | None) -> tuple[Region, ...]:
    """The ranges of a region as a tuple (empty for None: the whole tensor)."""
    if region is None:
        return ()
    return (region,) if isinstance(region, Region) else region


@dataclass(frozen=True)
class Transfer:
    tensor: str
    src: str
    dst: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    region: Regions | None


@dataclass(frozen=True)
class Run:
    fragment: str


@dataclass(frozen=True)
class Send:
    tensor: str
    to: str
    region: Regions | None = None
    as_name: str | None = None

    @property
    def name(self) -> str:
        """The name the receiver stores the tensor under."""
        return self.as_name or self.tensor


@dataclass(frozen=True)
class Recv:
    tensor: str
    src: str


@dataclass(frozen=True)
class Slice:
    tensor: str
    axis: int
    start: int
    stop: int
    as_name: str


@dataclass(frozen=True)
class Concat:
    parts: tuple[str, ...]
    axis: int
    as_name: str


@dataclass(frozen=True)
class Free:
    tensors: tuple[str, ...]


Step = Union[Run, Send, Recv, Slice, Concat, Free]


@dataclass(frozen=True)
class Fallback:
    """The plan for the same model on the cluster without one device (`edgec compile --fallbacks`): its
    manifest's path relative to this manifest's folder and that file's sha256; both None, with `error`
    saying why, when no plan fits the devices left."""

    without: str
    manifest: str | None
    sha256: str | None
    error: str | None = None


OBJECTIVES = ("latency", "throughput", "energy")  # what a plan can be compiled for (`edgec compile --objective`)


@dataclass(frozen=True)
class Alternative:
    """Another plan of the same model on the same cluster (`edgec compile --keep N`, best first, then the
    boundary shifts of `--shifts`): its manifest's path relative to this manifest's folder and that file's
    sha256, with the strategy and the predicted figures ({"latency_ms", "throughput_ips", "energy_mj" or
    None}) its manifest records; `variant` says what a variant of the chosen plan changes (None: a plan of
    its own, from --keep)."""

    manifest: str
    sha256: str
    strategy: str
    predicted: dict[str, Any]
    variant: str | None = None


@dataclass(frozen=True)
class Manifest:
    path: Path
    model_path: Path
    model_sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[OutputSpec, ...]
    devices: tuple[Device, ...]
    network: Network
    fragments: dict[str, Fragment]
    transfers: tuple[Transfer, ...]
    steps: dict[str, tuple[Step, ...]]
    predicted: dict[str, Any] = field(default_factory=dict)
    fallbacks: tuple[Fallback, ...] = ()
    alternatives: tuple[Alternative, ...] = ()
    objective: str | None = None  # what the plan was compiled for (`plan.objective`), when the manifest says
    generate: Generate | None = None  # a generative build's (version 2); None: one pass per request

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def fragment_path(self, frag: Fragment) -> Path:
        return self.folder / frag.file

    def device_fragments(self, device: str) -> list[Fragment]:
        return [f for f in self.fragments.values() if f.device == device]

    def device(self, name: str) -> Device:
        return next(d for d in self.devices if d.name == name)

    def fallback_for(self, device: str) -> Fallback | None:
        return next((fb for fb in self.fallbacks if fb.without == device), None)
