"""The cost table: (LayerGraph, Cluster) -> CostTable of per-layer, per-device times, plus transfer times."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..cluster import Cluster, DeviceSpec
from ..graph import Layer, LayerGraph
from .network import Network

__all__ = ["CostTable", "build_cost_table", "layer_ms"]

logger = logging.getLogger(__name__)

MEMORY_BOUND = {"pool", "elementwise", "norm", "softmax", "data"}


@dataclass(frozen=True, eq=False)
class CostTable:
    """Times in ms. `layer_ms[i, d]` is layer i on device d; `measured[d]` says a measured table was used."""

    devices: tuple[str, ...]
    layer_ms: np.ndarray  # [L, D]
    measured: tuple[bool, ...]
    cluster: Cluster

    def index(self, device: str) -> int:
        return self.devices.index(device)

    @cached_property
    def network(self) -> Network:
        """The cluster's links (network.py): the one place bandwidth becomes bytes per ms."""
        return Network(self.cluster)

    def transfer_ms(self, nbytes: int, src: str, dst: str) -> float:
        return self.network.transfer_ms(nbytes, src, dst)


def layer_ms(layer: Layer, device: DeviceSpec) -> float:
    """Roofline estimate: per-operator overhead + max(compute time, memory time)."""
    p = device.profile
    overhead = len(layer.op_types) * p.op_overhead_us / 1000.0
    moved = layer.input_bytes + layer.output_bytes + layer.param_bytes
    mem_ms = moved / (p.memory_gbps * 1e6)  # GB/s = 1e6 bytes/ms
    if layer.cost_class in MEMORY_BOUND:
        return overhead + mem_ms
    gflops = p.gflops.get(layer.cost_class, p.gflops["other"])
    return overhead + max(layer.flops / (gflops * 1e6), mem_ms)


def build_cost_table(graph: LayerGraph, cluster: Cluster, model_sha256: str | None = None) -> CostTable:
    cols, measured = [], []
    for dev in cluster.devices:
        table = dev.profile.layers.get(model_sha256 or "", {})
        if table and all(n in table for layer in graph.layers for n in layer.node_names):
            cols.append([sum(table[n] for n in layer.node_names) for layer in graph.layers])
            measured.append(True)
        else:
            if table:
                logger.warning("%s: measured table does not cover this model's nodes; using the roofline model", dev.name)
            cols.append([layer_ms(layer, dev) for layer in graph.layers])
            measured.append(False)
    arr = np.asarray(cols, dtype=np.float64).T.reshape(len(graph.layers), len(cluster.devices))
    return CostTable(tuple(d.name for d in cluster.devices), arr, tuple(measured), cluster)

