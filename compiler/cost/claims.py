"""Pricing what an accelerator leaves to the CPU: a device whose providers put an accelerator first (cluster.yaml
`providers:`) runs the nodes the accelerator claims at its profile's figures (measured with the accelerator) and
the others on onnxruntime's CPU provider, priced at the profile's `cpu:` figures (the same figures measured with
the CPU provider alone).

Which nodes the CPU runs, in order: the profile's `cpu_nodes:` for this model (by its sha256; `edgec profile
--providers ... --model ...` records them on the device, with its onnxruntime build and provider); else
onnxruntime on this machine, when it has the device's providers (runtime/profile/claims.py, the same function);
else a warning naming the device, and every node at the profile's figures. A profile without `cpu:` figures: a
warning, and every node at the profile's figures. A device whose profile was not measured with its accelerator
is priced at the profile's figures throughout (cluster.py `provider_note` says so).

A layer is priced at the `cpu:` figures when the CPU runs any of its nodes (a layer is one operator and the
pointwise ones after it: the part an accelerator leaves also costs a crossing between providers), at the top
level's otherwise. Where both figure sets hold a measured table of the model, each of its nodes is taken from the
table of the provider that runs it. What table.py keeps per device, not per layer (the tile efficiency curves, the
memory rate a tile's input is assembled at, the layout conversions) stays the top level's.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import lru_cache
from typing import Callable, TypeVar

import numpy as np
import onnx
import onnxruntime as ort

from edgec.runtime.errors import InputError
from edgec.runtime.profile.claims import cpu_nodes
from edgec.runtime.providers import CPU, CPU_ONLY, Provider, missing_provider

from ..cluster import DeviceSpec
from ..graph import LayerGraph

Table = TypeVar("Table")  # table.py's CostTable (which imports this module)

__all__ = ["cpu_twin", "claimed_on_cpu", "price_cpu_nodes"]

logger = logging.getLogger(__name__)


def cpu_twin(dev: DeviceSpec) -> DeviceSpec:
    """The device as its CPU provider alone runs it: its profile's `cpu:` figures in place of the top level's
    (at the same thread count; power modes are the accelerator's and do not carry over)."""
    prof, cpu = dev.profile, dev.profile.cpu
    top = cpu.top
    twin = replace(prof, op_overhead_us=top.op_overhead_us, gflops=top.gflops, memory_gbps=top.memory_gbps,
                   op_ms_per_melem=top.op_ms_per_melem, efficiency=top.efficiency, layers=top.layers,
                   weight_gbps=top.weight_gbps, gemm_weight_gbps=top.gemm_weight_gbps, threads=dict(cpu.threads),
                   modes={}, providers=(CPU,), cpu=None, cpu_nodes={})
    return replace(dev, profile=twin, providers=CPU_ONLY, mode=None)


@lru_cache(maxsize=None)
def _warn_once(text: str) -> None:
    logger.warning(text)


_HERE: dict[tuple, frozenset[str]] = {}


def _here(sha: str, providers: tuple[Provider, ...], model: onnx.ModelProto) -> frozenset[str]:
    """cpu_nodes on this machine's onnxruntime, once per model (sha256 and its inputs' pinned shapes) and provider
    list."""
    shapes = tuple((v.name, tuple(d.dim_value for d in v.type.tensor_type.shape.dim)) for v in model.graph.input)
    key = (sha, shapes, providers)
    if key not in _HERE:
        _HERE[key] = cpu_nodes(model, providers, where=f"model {sha[:12]}...")
    return _HERE[key]


def claimed_on_cpu(dev: DeviceSpec, model_sha256: str | None, model: onnx.ModelProto | None) -> frozenset[str] | None:
    """The node names the CPU provider runs on `dev`, or None when the device is priced at its profile's figures
    throughout (no accelerator, a profile not measured with it, no `cpu:` figures, no claims: the last two said in
    a warning)."""
    accel = [p.name for p in dev.providers if p.name != CPU]
    prof = dev.profile
    if not accel or not any(p in prof.providers for p in accel):
        return None
    names = ",".join(p.name for p in dev.providers)
    if prof.cpu is None:
        _warn_once(f"device {dev.name!r}: profile {prof.name} ({prof.path}) has no cpu: figures (the CPU provider's, "
                   f"for the nodes {accel[0]} leaves to it): every node is priced at the provider's figures; profile "
                   f"the device again with `edgec profile --providers {names} --model <model.onnx>`")
        return None
    if model_sha256 is not None and model_sha256 in prof.cpu_nodes:
        return prof.cpu_nodes[model_sha256]
    lacking = missing_provider(dev.providers, ort.get_available_providers())
    if model is not None and model_sha256 is not None and lacking is None:
        try:
            return _here(model_sha256, dev.providers, model)
        except InputError as e:
            reason = f"onnxruntime here could not say which nodes it takes ({e})"
    else:
        reason = (f"its profile has no cpu_nodes for this model and this onnxruntime "
                  f"{'lacks ' + lacking if lacking else 'was not given the model'}")
    _warn_once(f"device {dev.name!r}: which nodes {accel[0]} leaves to the CPU is unknown ({reason}): every node is "
               f"priced at the provider's figures; record them on the device with `edgec profile --providers {names} "
               "--model <model.onnx>`")
    return None


def price_cpu_nodes(table: Table, build: Callable[..., Table]) -> Table:
    """`table` with, on every device that runs an accelerator, the layers whose nodes the CPU provider runs priced
    at the profile's `cpu:` figures (`build`: build_cost_table, which prices the device's cpu_twin)."""
    if table.source is None:
        return table
    graph, sha, model = table.source
    arrays = {k: np.array(getattr(table, k)) for k in ("layer_ms", "overhead_ms", "priced_ms", "shared_weight_ms")
              if getattr(table, k) is not None}
    measured = list(table.measured)
    changed = False
    for d, dev in enumerate(table.cluster.devices):
        on_cpu = claimed_on_cpu(dev, sha, model)
        rows = [i for i, layer in enumerate(graph.layers) if on_cpu and not on_cpu.isdisjoint(layer.node_names)]
        if not rows:
            continue
        twin = cpu_twin(dev)
        cpu = build(graph, replace(table.cluster, devices=(twin,)), sha, model)
        for k, a in arrays.items():
            a[rows, d] = getattr(cpu, k)[rows, 0]
        if measured[d] and cpu.measured[0]:  # each node from the table of the provider that runs it
            arrays["layer_ms"][rows, d] = _per_node(graph, rows, on_cpu, dev, twin, sha)
        measured[d] = measured[d] and cpu.measured[0]
        changed = True
    if not changed:
        return table
    return replace(table, measured=tuple(measured), **arrays)


def _per_node(graph: LayerGraph, rows: list[int], on_cpu: frozenset[str], dev: DeviceSpec, twin: DeviceSpec,
              sha: str) -> list[float]:
    accel, cpu = dev.figures.layers[sha], twin.figures.layers[sha]
    return [sum(cpu[n] if n in on_cpu else accel[n] for n in graph.layers[i].node_names) for i in rows]
