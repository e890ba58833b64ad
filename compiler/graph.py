"""LayerGraph: the compiler's view of a model as an ordered DAG of layers, free of ONNX protobufs."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

__all__ = ["TensorInfo", "Window", "Layer", "LayerGraph", "COST_CLASSES", "SMALL_FRACTION"]

# A tensor live across a cut is small when this many copies of it fit in the cut's largest tensor.
SMALL_FRACTION = 16

# Operator classes used by the cost model (profiles give a throughput for each compute class).
COST_CLASSES = ("conv", "depthwise_conv", "gemm", "pool", "elementwise", "norm", "softmax", "data", "other",
                "conv_int8", "depthwise_conv_int8", "gemm_int8")  # the int8 kernels of quantized models (quant.py)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name, e.g. "float32"
    nbytes: int


@dataclass(frozen=True)
class Window:
    """Sliding-window geometry of a Type-1 operator over the spatial axes (H, W) of an NCHW tensor."""

    op_type: str
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, left, bottom, right (ONNX order: begins then ends)
    dilations: tuple[int, int]
    ceil_mode: bool = False
    group: int = 1


@dataclass(frozen=True)
class Layer:
    """One operator plus the cheap elementwise operators that follow it.

    `nodes` index the normalised model's node list (ingest keeps it); `inputs` and `outputs` are the
    activation tensors that cross the layer's boundary (graph inputs, other layers' outputs, graph outputs).
    """

    index: int
    name: str
    nodes: tuple[int, ...]
    node_names: tuple[str, ...]
    op_types: tuple[str, ...]
    cost_class: str  # one of COST_CLASSES, for the leading (most expensive) operator
    spatial_type: int  # ADaPS: 1 neighbourhood, 2 pointwise, 3 not split
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flops: int
    param_bytes: int
    input_bytes: int
    output_bytes: int
    window: Window | None = None  # the layer's Type-1 operator, if any (at most one per layer)
    # the weight bytes one run reads, where fewer than param_bytes: a Gather reads only the rows it gathers
    # (the transformer's 94 MB embedding table, 393 KB of it per request); None: all of them
    param_read_bytes: int | None = None

    @property
    def read_param_bytes(self) -> int:
        return self.param_bytes if self.param_read_bytes is None else self.param_read_bytes


@dataclass(frozen=True)
class LayerGraph:
    """Layers in a topological order (the order of the normalised model's nodes)."""

    layers: tuple[Layer, ...]
    tensors: dict[str, TensorInfo] = field(hash=False)
    inputs: tuple[str, ...]  # graph inputs (activations fed by the user)
    outputs: tuple[str, ...]  # graph outputs
    # (first, last) layer ranges no stage boundary may fall inside: a generative model's state (its KV
    # cache) is read and written there, and stays on the device that holds them (ingest/phases.py)
    unsplit: tuple[tuple[int, int], ...] = ()
    # tensors that ride along any pipeline cut whatever their size (`is_small`): a generative model's rotary
    # tables and attention mask, read by every decoder layer, beside a one-token hidden state (ingest/phases.py)
    riders: frozenset[str] = frozenset()

    @cached_property
    def producer(self) -> dict[str, int]:
        """Tensor name -> index of the layer producing it (graph inputs are absent)."""
        return {t: layer.index for layer in self.layers for t in layer.outputs}

    @cached_property
    def consumers(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, list[int]] = {}
        for layer in self.layers:
            for t in layer.inputs:
                out.setdefault(t, []).append(layer.index)
        return {t: tuple(v) for t, v in out.items()}

    def live_across(self, cut: int) -> tuple[str, ...]:
        """Activations produced by layers < cut and consumed by layers >= cut (sorted by producer, then
        name)."""
        if 0 <= cut <= len(self.layers):
            return self._live_sets[cut]
        return ()

    def cut_bytes(self, cut: int) -> int:
        return sum(self.tensors[t].nbytes for t in self.live_across(cut))

    @cached_property
    def _live_sets(self) -> tuple[tuple[str, ...], ...]:
        """[c] = live_across(c) for every position 0..L (one sweep instead of L scans)."""
        n = len(self.layers)
        live: list[list[tuple[int, str]]] = [[] for _ in range(n + 1)]
        for t, users in self.consumers.items():
            p = self.producer.get(t)
            if p is None:
                continue
            for c in range(p + 1, max(users) + 1):
                live[c].append((p, t))
        return tuple(tuple(t for _, t in sorted(v)) for v in live)

    @cached_property
    def block_cuts(self) -> tuple[int, ...]:
        """Cut positions (1..L-1) across which exactly one activation is live: serial block boundaries.

        Between two consecutive block cuts lies a single-entry/single-exit block, so a branching graph
        (Inception, ResNet, DenseNet, transformer) plans as a chain of blocks. Spatial regions start and
        end only here (they tile ONE tensor at a region boundary); pipeline stages use `pipeline_cuts`.
        """
        return tuple(c for c in range(1, len(self.layers)) if len(self._live_sets[c]) == 1 and self._may_cut(c))

    def _may_cut(self, cut: int) -> bool:
        """Whether no `unsplit` range holds layers on both sides of `cut`."""
        return not any(lo < cut <= hi for lo, hi in self.unsplit)

    @cached_property
    def blocks(self) -> tuple[tuple[int, int], ...]:
        """Half-open layer ranges [lo, hi) between consecutive block cuts, covering every layer."""
        return _ranges(self.block_cuts, len(self.layers))

    def is_small(self, tensor: str, cut: int) -> bool:
        """Whether `tensor` (live across `cut`) is small there: SMALL_FRACTION copies of it fit in the
        largest tensor live across the cut.

        A small tensor rides along a cut: an attention mask (512 bytes beside a 393,216-byte hidden
        state), position ids, an SE block's channel scales. The bound is relative, not absolute, because
        what a cut point must exclude is a second tensor of the main activation's order - a residual
        skip, an Inception branch - and on a tiny model every tensor is a few KiB: an absolute floor
        would make every position of such a CNN a cut point. 1/16 keeps a cut's extra traffic and its
        per-message latencies minor next to the main tensor while admitting every mask and id vector
        (a [1, S] mask against a [1, S, d] state is 1/d or less). Transfers are priced per tensor
        whatever the rule, so the rule only bounds the search space: it never makes a price wrong.
        """
        if tensor in self.riders:
            return True
        largest = max(self.tensors[t].nbytes for t in self._live_sets[cut])
        return self.tensors[tensor].nbytes * SMALL_FRACTION <= largest

    @cached_property
    def pipeline_cuts(self) -> tuple[int, ...]:
        """Cut positions (1..L-1) where pipeline stages may meet: at least one activation is live and at
        most one live activation is not small (`is_small`). Every block cut is one; so is, in a
        transformer, each encoder boundary and each attention/feed-forward boundary (the hidden state
        plus the attention mask). Every tensor live across a cut is sent (pipeline.py prices each)."""
        return tuple(c for c in range(1, len(self.layers)) if self._live_sets[c] and self._may_cut(c)
                     and sum(not self.is_small(t, c) for t in self._live_sets[c]) <= 1)

    @cached_property
    def pipeline_blocks(self) -> tuple[tuple[int, int], ...]:
        """Half-open layer ranges [lo, hi) between consecutive pipeline cuts, covering every layer."""
        return _ranges(self.pipeline_cuts, len(self.layers))

    @cached_property
    def footprint_bytes(self) -> tuple[int, ...]:
        """Per layer: bytes of activations resident while it runs (its inputs, outputs, and everything
        produced earlier that a later layer still needs)."""
        # one sweep: a tensor produced by layer p and last used by layer u is live through layers p+1..u-1
        # (a difference array), and each layer adds its own inputs and outputs not counted so
        last_use = {t: max(users) for t, users in self.consumers.items()}
        n = len(self.layers)
        through = [0] * (n + 1)
        for t, p in self.producer.items():
            u = last_use.get(t, -1)
            if u > p + 1 and t in self.tensors:
                through[p + 1] += self.tensors[t].nbytes
                through[u] -= self.tensors[t].nbytes
        out, running = [], 0
        for layer in self.layers:
            i = layer.index
            running += through[i]
            own = {t for t in (*layer.inputs, *layer.outputs) if t in self.tensors
                   and not (self.producer.get(t, i) < i < last_use.get(t, -1))}
            out.append(running + sum(self.tensors[t].nbytes for t in own))
        return tuple(out)

    def peak_activation_bytes(self, lo: int, hi: int) -> int:
        """Peak bytes of activations alive while layers [lo, hi) run one after another on one device."""
        return max(self.footprint_bytes[lo:hi], default=0)

    @property
    def total_flops(self) -> int:
        return sum(layer.flops for layer in self.layers)

    @property
    def total_param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)


def _ranges(cuts: tuple[int, ...], n: int) -> tuple[tuple[int, int], ...]:
    edges = (0, *cuts, n)
    return tuple((edges[i], edges[i + 1]) for i in range(len(edges) - 1))
