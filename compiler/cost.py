"""Cost analysis: (LayerGraph, Cluster) -> CostTable of per-layer, per-device times, plus transfer times."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from .cluster import Cluster, Device
from .graph import Layer, LayerGraph
from .plan.problem import PipelineProblem

__all__ = ["CostTable", "build_cost_table", "pipeline_problem", "layer_ms"]

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

    def transfer_ms(self, nbytes: int, src: str, dst: str) -> float:
        if src == dst or nbytes == 0:
            return 0.0
        link = self.cluster.link(src, dst)
        return nbytes / (link.bandwidth_mbps * 125.0) + link.latency_ms  # 1 Mbit/s = 125 bytes/ms


def layer_ms(layer: Layer, device: Device) -> float:
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


def pipeline_problem(graph: LayerGraph, cost: CostTable) -> PipelineProblem:
    """Collapse the layer graph into its chain of serial blocks, priced on every device."""
    blocks = graph.blocks
    cluster = cost.cluster
    n = len(cluster.devices)
    bw = np.ones((n, n))
    lat = np.zeros((n, n))
    for a, da in enumerate(cluster.devices):
        for b, db in enumerate(cluster.devices):
            if a != b:
                link = cluster.link(da.name, db.name)
                bw[a, b] = link.bandwidth_mbps * 125.0
                lat[a, b] = link.latency_ms
    return PipelineProblem(
        devices=cost.devices,
        block_ms=np.stack([cost.layer_ms[lo:hi].sum(axis=0) for lo, hi in blocks]),
        block_param_bytes=np.array([sum(graph.layers[i].param_bytes for i in range(lo, hi)) for lo, hi in blocks]),
        block_peak_act_bytes=np.array([graph.peak_activation_bytes(lo, hi) for lo, hi in blocks]),
        cut_bytes=np.array([graph.cut_bytes(hi) for _, hi in blocks[:-1]], dtype=np.float64),
        device_mem_bytes=np.array([d.usable_bytes for d in cluster.devices]),
        bandwidth_bytes_per_ms=bw,
        link_latency_ms=lat,
        medium=cluster.medium,
    )
