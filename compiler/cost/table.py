"""The cost table: (LayerGraph, ClusterModel) -> CostTable of per-layer, per-device times, plus transfer times.

Each device is priced with the figures of the thread count its worker runs (`DeviceSpec.figures`: the
profile's `threads:` entry for the cluster file's `threads`, else the profile's top level), in this order:

1. A measured table (`layers`) of those figures that covers every node of the model: the sum of the
   layer's node times.
2. Otherwise the roofline model, with the figures' op table (`op_ms_per_melem`) for the operators the
   roofline misprices.  With oh = op_overhead_us / 1000, n the layer's nodes and E the layer's output
   elements (every node of a layer shares them: a layer is one operator and the shape-preserving
   operators that follow it)::

       layer_ms = n * oh + sum over priced nodes of E * price / 1e6 + roofline of the rest

   A node is priced when "<op type>:<mode>" (with the model, for a node with a `mode` attribute such as
   Resize), or "LayerNormalization:skip" for a LayerNormalization of a residual Add, which onnxruntime
   fuses into its much slower SkipLayerNormalization (with the model; the Add keeps its own price, about
   a tenth of the pair's), or else its op type is in the table.  The roofline of the rest is the layer's
   max(FLOPs / gflops, bytes / memory_gbps) (bytes only for a memory-bound class), dropped when the
   layer's leading operator (the one that sets its cost class) is priced and every unpriced operator is
   pointwise: such a layer is memory-bound, its roofline is the chain's traffic, which the leader's
   price already holds (the transformer's Softmax and LayerNormalization layers).  Otherwise the prices
   come on top of the roofline: a priced follower of a Conv (Inception's LRN, MobileNetV2's Clip) adds
   its price to the Conv's FLOPs (its own FLOPs there are a few per element against the Conv's
   hundreds; a Clip is a pass over the output that the NCHWc kernel does not fuse); an LRN that
   outweighs the MaxPool before it keeps the MaxPool's traffic in.

   Where the figures measured `weight_gbps` (the rate a batch-1 MatMul streams weights too large for the
   caches), a layer that is not memory-bound also pays for reading its weights in, on top of its compute:
   roofline = max(FLOPs / gflops, activation bytes / memory_gbps) + weight bytes / weight_gbps.  A model's
   weights seldom stay in cache from one request to the next, and onnxruntime's kernels overlap little of
   that read with their arithmetic: ResNet-50's 7x7 layers (4-9 MB of weights each) took 0.1-0.5 ms more
   than their FLOPs at gflops.conv, VGG-16's classifier ran at the MatMul's rate, not memory_gbps.  A gemm
   layer of two or more rows pays at `gemm_weight_gbps` where measured (`weight_ms`).

   Devices on one machine (the cluster's `hosts:`) share its memory: while two of them run tiles of the same
   segment at once, each streams its tile's weights (every tile needs all of them) beside the other.  Where
   the device's profile measured `shared_weight_gbps` (the weight_gbps MatMul timed while the machine's other
   cores each run it too), such a tile pays its layers' weights at that rate instead: `shared_weight_ms[i, d]`
   is the difference for layer i on device d (0 without the figure, on a device without a host, and where
   the weights are not priced by weight_gbps).  Measured 2026-11-26 on a 2-core machine: the MatMul ran
   1.57-1.67x slower beside a second one; a 7x7 ResNet-50 tile fragment (17.9 MB of weights) 1.12-1.20x
   slower beside a second one, and in a two-device plan 0.20-0.23 ms over its price, where the shared rate
   prices 0.24 ms more.

Where the figures measured `efficiency.conv_positions`, a conv layer's FLOPs run at gflops.conv times that
curve's fraction at the layer's output positions (height x width; `layer_out_positions`): a conv on a small
map runs slower than gflops.conv's 56x56 benchmark, whatever its channels (CURVE_OF_CLASS, BY_POSITIONS).

The tile model (tiles.py) reads `overhead_ms`, `priced_ms`, `out_elems`, `out_positions` and `curves` to scale
a tile's share by the figures' tile efficiency, and `memory_bytes_per_ms` to price assembling a tile's input.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper

from ..cluster import ClusterModel, DeviceSpec, Figures
from ..graph import Layer, LayerGraph
from ..layers import POINTWISE, cost_class
from ..quant import FLOAT_CLASS_OF

QDQ_FUSED = frozenset({"QuantizeLinear", "DequantizeLinear"})
from ..units import gbps_to_bytes_per_ms, gflops_to_flops_per_ms, per_million_ms, us_to_ms
from .claims import price_cpu_nodes
from .network import NetworkModel

__all__ = ["CostTable", "build_cost_table", "class_gflops", "int8_fallbacks", "layer_ms", "weight_ms", "shared_weight_ms", "price_keys", "layer_out_elems",
           "op_overhead_ms", "node_price", "node_ms",
           "layer_out_positions", "priced_ms", "TileCurve", "efficiency"]

logger = logging.getLogger(__name__)

MEMORY_BOUND = {"pool", "elementwise", "norm", "softmax", "data"}
# The efficiency curve (Figures.efficiency key) that scales a tile of each compute-bound cost class: the
# first of its keys the figures have. A depthwise conv's own curve falls much faster than a full conv's (it
# does 9 FLOPs per input element, so reading a tile's halo rows and each row's set-up weigh on it: one row of
# a 144 x 56 map ran at 0.44 of the 56-row rate, where a 3x3 conv's one row ran at 0.96); profiles written
# before `edgec profile` measured it carry the conv curve only, which depthwise tiles then use, as before.
CURVE_OF_CLASS = {"conv": ("conv_positions", "conv"), "depthwise_conv": ("depthwise_conv", "conv"), "gemm": ("gemm",)}
CURVE_OF_CLASS |= {int8: CURVE_OF_CLASS[fp32] for int8, fp32 in FLOAT_CLASS_OF.items()}  # int8 kernels: the float curve
# Curves whose sizes are a layer's output positions (its map's height x width), not its output elements.  A
# conv's speed follows the positions it computes, whatever its channels: 3x3 convs at 1 thread ran at 0.88,
# 0.94 and 0.93 of gflops.conv on a 7x7 map with 128, 256 and 512 channels and at 0.75, 0.78 and 0.82 on 4x7,
# where 14,336 output elements meant 0.82 on 512 channels (4x7) and 0.94 on 128 (8x14).  `conv_positions` also
# prices a whole conv layer (`layer_ms`): ResNet-50's 7x7 layers ran 5-8% under gflops.conv.
BY_POSITIONS = frozenset({"conv_positions"})


class TileCurve(NamedTuple):
    """An efficiency curve and what its sizes count: output positions (BY_POSITIONS) or output elements."""

    points: tuple[tuple[float, float], ...]
    by_positions: bool


def efficiency(curve: tuple[tuple[float, float], ...], size) -> np.ndarray:
    """Fraction of the large benchmark's throughput at `size` (a number or an array; output elements, or
    positions for a BY_POSITIONS curve): piecewise linear in log(size) between the curve's points, its end
    points' fractions beyond."""
    x = np.log(np.maximum(np.asarray(size, dtype=np.float64), 1e-300))
    return np.interp(x, [math.log(e) for e, _ in curve], [f for _, f in curve])


@dataclass(frozen=True, eq=False)
class CostTable:
    """Times in ms. `layer_ms[i, d]` is layer i on device d; `measured[d]` says a measured table was used.

    For the tile model: `overhead_ms[i, d]` is what every tile of layer i on device d pays again, however
    few rows it computes (at most its layer_ms): its per-operator overhead plus, on the roofline, streaming in
    the layer's weights (`weight_ms`), `priced_ms[i, d]` the op-table share of layer_ms (0 for a measured table), `out_elems[i]`
    the layer's output elements, `out_positions[i]` its output positions (height x width), and `curves[d]`
    {cost class: TileCurve} of device d's figures.
    """

    devices: tuple[str, ...]
    layer_ms: np.ndarray  # [L, D]
    measured: tuple[bool, ...]
    cluster: ClusterModel
    overhead_ms: np.ndarray  # [L, D]
    priced_ms: np.ndarray  # [L, D]
    out_elems: np.ndarray  # [L]
    out_positions: np.ndarray  # [L]
    curves: tuple[dict, ...]  # per device: {cost class: TileCurve}
    shared_weight_ms: np.ndarray | None = None  # [L, D]; None: zeros (see the module docstring)
    source: tuple | None = field(default=None, repr=False)  # (graph, model sha256, model): to price it again
    # Not a field: a generative build's table is a GenerativeCostTable (generate.py), whose `generate` field
    # holds the prefill, the caches and the token beside the decode step this table prices
    generate = None

    def index(self, device: str) -> int:
        return self.devices.index(device)

    def curve_size(self, i: int, curve: TileCurve) -> float:
        """Layer i's size as `curve` counts it: output positions or output elements."""
        return float((self.out_positions if curve.by_positions else self.out_elems)[i])

    @property
    def modes(self) -> dict[str, str]:
        """{device: the power mode it is priced in}, for the devices not at their top level's."""
        return {d.name: d.mode for d in self.cluster.devices if d.mode is not None}

    def with_modes(self, modes: dict[str, str]) -> "CostTable":
        """The same model priced on the cluster with devices in the given power modes (ClusterModel.with_modes)."""
        if self.source is None:
            raise ValueError("this cost table was not built by build_cost_table: it cannot be priced again")
        graph, sha, model = self.source
        return build_cost_table(graph, self.cluster.with_modes(modes), sha, model)

    @cached_property
    def network(self) -> NetworkModel:
        """The cluster's links (network.py): the one place bandwidth becomes bytes per ms."""
        return self._network(lone=False)

    @cached_property
    def lone_network(self) -> NetworkModel:
        """The links as a lone request's timeline meets them: a message to or from a device whose quota bursts
        at full speed (cost/quota_burst.py); `network` itself where no device's costs differ so."""
        if all(d.lone_runtime is d.runtime for d in self.cluster.devices):
            return self.network
        return self._network(lone=True)

    def _network(self, lone: bool) -> NetworkModel:
        if self.source is None:
            return NetworkModel(self.cluster, lone=lone)
        graph = self.source[0]
        return NetworkModel(self.cluster, (sum(graph.tensors[t].nbytes for t in graph.inputs),
                                      sum(graph.tensors[t].nbytes for t in graph.outputs)), lone)

    def transfer_ms(self, nbytes: int, src: str, dst: str) -> float:
        return self.network.transfer_ms(nbytes, src, dst)

    @cached_property
    def memory_bytes_per_ms(self) -> tuple[float, ...]:
        """Per device, its figures' memory bandwidth (memory_gbps) in bytes per ms: what a copy in memory,
        such as assembling a tile's input from its parts (tiles.py), moves at."""
        return tuple(gbps_to_bytes_per_ms(dev.figures.memory_gbps) for dev in self.cluster.devices)

    @cached_property
    def run_ms(self) -> tuple[float, ...]:
        """Per device, what a tile fragment's run in a plan takes beyond its priced time, alone and hot (the
        profile's `runtime.run_ms`; 0 where unmeasured): tiles.py adds it to every tile."""
        return tuple(dev.runtime.run_ms for dev in self.cluster.devices)

    def shared_weights(self, lo: int, hi: int, d: int) -> float:
        """What a tile of layers [lo, hi) on device d pays beyond its price while a device on the same host
        runs a tile of those layers too (the module docstring)."""
        return 0.0 if self.shared_weight_ms is None else float(self.shared_weight_ms[lo:hi, d].sum())

    @cached_property
    def hosts(self) -> tuple[str | None, ...]:
        """Per device, the machine it shares with other devices (the cluster's `hosts:`), or None."""
        return tuple(dev.host for dev in self.cluster.devices)

    @cached_property
    def conversion_ms_per_byte(self) -> tuple[float, ...]:
        """Per device, converting one byte of an activation into or out of the runtime's blocked layout: a
        read and a write at its figures' memory_gbps where its profile says the runtime converts
        (`layout_conversions`), else 0.  tiles.py prices a tile fragment's ends and its crops with it."""
        return tuple(2.0 / bpm if dev.profile.layout_conversions else 0.0
                     for dev, bpm in zip(self.cluster.devices, self.memory_bytes_per_ms))


SKIP_NORM = "LayerNormalization:skip"


def model_context(model: onnx.ModelProto) -> tuple[dict, dict]:
    """({tensor: the node producing it}, {tensor: its static shape}) of a shape-inferred model, for price_keys."""
    producers = {o: n for n in model.graph.node for o in n.output}
    shapes = {}
    for v in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        dims = v.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[v.name] = tuple(d.dim_value for d in dims)
    shapes.update({init.name: tuple(init.dims) for init in model.graph.initializer})
    return producers, shapes


def _skip_norm(node: onnx.NodeProto, producers: dict, shapes: dict) -> bool:
    """A LayerNormalization of an Add of two tensors of one shape (a residual): onnxruntime fuses the pair
    into SkipLayerNormalization, whose CPU kernel took 0.39 ms on 128 x 768 at 1 thread here against 0.038
    for the LayerNormalization alone and 0.049 for an Add of a bias (broadcast: not fused) and the
    LayerNormalization; the transformer's 13 such pairs took 5.2 ms of its 63."""
    add = producers.get(node.input[0]) if node.input else None
    if add is None or add.op_type != "Add" or len(add.input) != 2:
        return False
    a, b = (shapes.get(t) for t in add.input)
    return a is not None and a == b


def price_keys(layer: Layer, model: onnx.ModelProto | None = None,
              context: tuple[dict, dict] | None = None) -> tuple[tuple[str, ...], ...]:
    """Per node of the layer, the op-table keys to try in order: "<op type>:<mode>" for a node with a
    `mode` attribute, SKIP_NORM for a LayerNormalization onnxruntime fuses with the residual Add before it
    (`_skip_norm`), then the op type; the first two known only with the model (`context`: its
    `model_context`, computed here when not given)."""
    out = []
    for k, op in enumerate(layer.op_types):
        mode, skip = None, False
        if model is not None:
            node = model.graph.node[layer.nodes[k]]
            mode = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "mode"), None)
            if op == "LayerNormalization":
                skip = _skip_norm(node, *(context or model_context(model)))
        if isinstance(mode, bytes):
            mode = mode.decode("utf-8", "replace")
        out.append((f"{op}:{mode}", op) if mode else (SKIP_NORM, op) if skip else (op,))
    return tuple(out)


def layer_out_elems(graph: LayerGraph, layer: Layer) -> int:
    """Output elements of the layer's operator chain: the largest of its outputs (a chain's operators are
    shape-preserving, so its nodes all produce this many)."""
    return max((math.prod(graph.tensors[t].shape) for t in layer.outputs if t in graph.tensors), default=0)


def layer_out_positions(graph: LayerGraph, layer: Layer) -> int:
    """Output positions of the layer's largest output: its spatial extent (the dimensions after batch and
    channels; height x width of an NCHW map), or its elements for an output of rank 2 or less."""
    shapes = [graph.tensors[t].shape for t in layer.outputs if t in graph.tensors]
    if not shapes:
        return 0
    shape = max(shapes, key=math.prod)
    return math.prod(shape[2:]) if len(shape) > 2 else math.prod(shape)


@lru_cache(maxsize=None)
def _op_class(op: str) -> str:
    """The cost class a node of this op type leads its layer with (shapes do not matter but for Conv's
    depthwise test, which an unknown input shape answers "conv")."""
    return cost_class(helper.make_node(op, ["x"], ["y"]), {})


def layer_kernels(layer: Layer) -> int:
    """The kernels onnxruntime runs for the layer, each paying the per-operator overhead: one per operator,
    but a Q/DQ unit's QuantizeLinear and DequantizeLinear nodes are fused into its operator's int8 kernel
    (QLinearConv, QLinearAdd, ...; quant.py), so only the operators between them count."""
    fused = sum(op in QDQ_FUSED for op in layer.op_types)
    return len(layer.op_types) - fused if fused < len(layer.op_types) else len(layer.op_types)


def op_overhead_ms(figures: Figures, ops: int = 1) -> float:
    """The figures' per-operator overhead (op_overhead_us) of `ops` operators, in ms."""
    return us_to_ms(ops * figures.op_overhead_us)


def node_price(figures: Figures, keys: tuple[str, ...]) -> float | None:
    """A node's op-table price (ms per 10^6 output elements): that of its first key the table lists, or
    None when it lists none."""
    return next((figures.op_ms_per_melem[k] for k in keys if k in figures.op_ms_per_melem), None)


def node_ms(elems: float, price: float) -> float:
    """A priced node's time: its output elements at `price` ms per 10^6 of them."""
    return per_million_ms(elems, price)


def priced_ms(layer: Layer, figures: Figures, keys: tuple[tuple[str, ...], ...], elems: int) -> tuple[float, bool]:
    """(The op-table share of the layer's time, whether the prices replace the layer's roofline: its
    leading operator is priced and every other operator is pointwise)."""
    total, lead, rest_pointwise = 0.0, False, True
    for op, cands in zip(layer.op_types, keys):
        price = node_price(figures, cands)
        if price is None:
            rest_pointwise &= op in POINTWISE
        else:
            total += node_ms(elems, price)
            lead |= _op_class(op) == layer.cost_class
    return total, lead and rest_pointwise


def gemm_rows(layer: Layer) -> float:
    """The rows a gemm layer multiplies its weights by: FLOPs / (2 x weight elements), 4-byte weights (1-byte
    for an int8 class)."""
    itemsize = 1.0 if layer.cost_class in FLOAT_CLASS_OF else 4.0
    return layer.flops * itemsize / 2.0 / layer.read_param_bytes if layer.read_param_bytes else 0.0


def weight_ms(layer: Layer, figures: Figures) -> float:
    """Streaming the layer's weights in at the figures' weight_gbps, or for a gemm layer of two rows or more
    at their gemm_weight_gbps where measured (a GEMM waits for its weights longer per byte than a batch-1
    MatMul streams them; the transformer's MatMuls of 128 rows), never faster than weight_gbps (a faster GEMM
    figure timed weights that stayed in a cache; `edgec profile` no longer records one, kernels.py
    gemm_weight_figure): 0 for a memory-bound class (its roofline moves them at memory_gbps) and where neither
    was measured."""
    if layer.cost_class in MEMORY_BOUND:
        return 0.0
    gbps = figures.weight_gbps
    if figures.gemm_weight_gbps is not None and layer.cost_class in ("gemm", "gemm_int8") and gemm_rows(layer) >= 2:
        gbps = figures.gemm_weight_gbps if gbps is None else min(gbps, figures.gemm_weight_gbps)
    return 0.0 if gbps is None else layer.read_param_bytes / gbps_to_bytes_per_ms(gbps)


def shared_weight_ms(layer: Layer, figures: Figures, device: DeviceSpec) -> float:
    """What streaming the layer's weights takes beyond `weight_ms` while another device on the device's host
    streams its own: at the profile's shared_weight_gbps, where it is slower (0 without a host or the figure,
    and where weight_ms prices nothing)."""
    gbps = device.profile.shared_weight_gbps
    alone = weight_ms(layer, figures)
    if device.host is None or gbps is None or alone == 0.0:
        return 0.0
    return max(0.0, layer.read_param_bytes / gbps_to_bytes_per_ms(gbps) - alone)


def layer_ms(layer: Layer, device: DeviceSpec, priced: tuple[float, bool] = (0.0, False), positions: int = 0) -> float:
    """Per-operator overhead + max(compute time, memory time), at the device's thread count, plus the
    op-table share `priced` = (ms, leader priced) from `priced_ms`, plus the weights' streaming
    (`weight_ms`; see the module docstring).  A conv layer's compute runs at its output `positions`' fraction
    of gflops.conv where the figures measured `efficiency.conv_positions`."""
    p = device.figures
    overhead = op_overhead_ms(p, layer_kernels(layer))
    ms, lead = priced
    if lead:
        return overhead + ms
    stream = weight_ms(layer, p)
    moved = layer.input_bytes + layer.output_bytes + (0 if stream else layer.read_param_bytes)
    mem_ms = moved / gbps_to_bytes_per_ms(p.memory_gbps)
    if layer.cost_class in MEMORY_BOUND:
        roof = mem_ms
    else:
        gflops = class_gflops(p.gflops, layer.cost_class)
        curve = p.efficiency.get("conv_positions") if layer.cost_class in ("conv", "conv_int8") else None
        if curve is not None and positions > 0:
            gflops *= float(efficiency(curve, positions))
        roof = max(layer.flops / gflops_to_flops_per_ms(gflops), mem_ms) + stream
    return overhead + roof if ms == 0.0 else overhead + ms + roof


def class_gflops(gflops: dict[str, float], cls: str) -> float:
    """The figures' GFLOP/s for a compute-bound cost class: its own figure; for an int8 class the profile does
    not give (conv_int8, depthwise_conv_int8, gemm_int8), its float class's figure, as the profile schema says
    (an int8 kernel priced no faster than the float one); `other` for any other class."""
    if cls in gflops:
        return gflops[cls]
    return gflops.get(FLOAT_CLASS_OF.get(cls, "other"), gflops["other"])


def int8_fallbacks(graph: LayerGraph, cluster: ClusterModel) -> dict[str, tuple[str, ...]]:
    """{device: the int8 classes of the graph its figures lack}, which class_gflops prices at their float
    classes' figures (the driver says so in a note)."""
    used = sorted({layer.cost_class for layer in graph.layers} & set(FLOAT_CLASS_OF))
    out = {dev.name: tuple(c for c in used if c not in dev.figures.gflops) for dev in cluster.devices}
    return {d: missing for d, missing in out.items() if missing}


def _curves(curves: dict) -> dict:
    """{cost class: the TileCurve that scales its tiles} of one device's figures (CURVE_OF_CLASS)."""
    out = {}
    for cls, keys in CURVE_OF_CLASS.items():
        key = next((k for k in keys if k in curves), None)
        if key is not None:
            out[cls] = TileCurve(curves[key], key in BY_POSITIONS)
    return out


def build_cost_table(graph: LayerGraph, cluster: ClusterModel, model_sha256: str | None = None,
                     model: onnx.ModelProto | None = None) -> CostTable:
    """The cost table of `graph` on `cluster`.  `model` (the normalised model `graph` was built from)
    only adds the op-table keys of node modes ("Resize:linear"); without it such nodes take their op
    type's price."""
    context = None if model is None else model_context(model)
    keys = [price_keys(layer, model, context) for layer in graph.layers]
    elems = np.array([layer_out_elems(graph, layer) for layer in graph.layers], dtype=np.float64)
    positions = [layer_out_positions(graph, layer) for layer in graph.layers]
    cols, measured, priced, overhead, shared = [], [], [], [], []
    for dev in cluster.devices:
        fig = dev.figures
        prices = [priced_ms(layer, fig, k, int(e)) if fig.op_ms_per_melem else (0.0, False)
                  for layer, k, e in zip(graph.layers, keys, elems)]
        table = fig.layers.get(model_sha256 or "", {})
        if table and all(n in table for layer in graph.layers for n in layer.node_names):
            col = [sum(table[n] for n in layer.node_names) for layer in graph.layers]
            measured.append(True)
            priced.append([0.0] * len(col))
        else:
            if table:
                logger.warning("%s: measured table does not cover this model's nodes; using the roofline model", dev.name)
            col = [layer_ms(layer, dev, pr, pos) for layer, pr, pos in zip(graph.layers, prices, positions)]
            measured.append(False)
            priced.append([ms for ms, _ in prices])
        cols.append(col)
        # What every tile pays again, however few rows it computes: its operators' dispatch and, priced by
        # the roofline, streaming in all of the layer's weights.
        overhead.append([min(op_overhead_ms(fig, layer_kernels(layer))
                             + (0.0 if measured[-1] or pr[1] else weight_ms(layer, fig)), ms)
                         for layer, ms, pr in zip(graph.layers, col, prices)])
        shared.append([0.0 if measured[-1] or pr[1] else shared_weight_ms(layer, fig, dev)
                       for layer, pr in zip(graph.layers, prices)])
    shape = (len(graph.layers), len(cluster.devices))
    arr = np.asarray(cols, dtype=np.float64).T.reshape(shape)
    return price_cpu_nodes(CostTable(tuple(d.name for d in cluster.devices), arr, tuple(measured), cluster,
                     overhead_ms=np.asarray(overhead, dtype=np.float64).T.reshape(shape),
                     priced_ms=np.asarray(priced, dtype=np.float64).T.reshape(shape),
                     out_elems=elems,
                     out_positions=np.asarray(positions, dtype=np.float64),
                     curves=tuple(_curves(dev.figures.efficiency) for dev in cluster.devices),
                     shared_weight_ms=np.asarray(shared, dtype=np.float64).T.reshape(shape),
                     source=(graph, model_sha256, model)), build_cost_table)  # claims.py: what an accelerator leaves
