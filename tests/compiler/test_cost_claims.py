"""Pricing what an accelerator leaves to the CPU (compiler/cost/claims.py): on a device whose providers put an
accelerator first, the layers whose nodes the CPU provider runs are priced at the profile's `cpu:` figures, the
others at its top level's; where the claims come from (the profile's `cpu_nodes:`, this machine's onnxruntime,
else a warning), and a profile without `cpu:` (a warning). Synthetic profiles whose two figure sets differ 100x."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np
import pytest
import yaml

from edgec import models
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.ingest import load_model

OV = "OpenVINOExecutionProvider"
AZURE = "AzureExecutionProvider"  # in the stock build: a real provider that takes no node
FAST = {"op_overhead_us": 1.0, "gflops": {"conv": 5000.0, "depthwise_conv": 2000.0, "gemm": 5000.0, "other": 3000.0},
        "memory_gbps": 500.0}
SLOW = {"op_overhead_us": 100.0, "gflops": {"conv": 50.0, "depthwise_conv": 20.0, "gemm": 50.0, "other": 30.0},
        "memory_gbps": 5.0}
BASE = {"name": "accel", "memory_mb": 4096, "usable_memory_fraction": 0.8, "runtime_overhead_mb": 90}


@pytest.fixture(scope="module")
def tinyconv():
    return load_model(models.ensure("tinyconv"))


def _cost(tmp_path: Path, ing, profile: dict, providers: list[str] | None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    listed = "" if providers is None else f", providers: [{', '.join(providers)}]"
    (tmp_path / "c.yaml").write_text(f"devices: [{{name: dev, profile: p.yaml{listed}}}]\n")
    return build_cost_table(ing.graph, load_cluster(tmp_path / "c.yaml"), ing.sha256, model=ing.model).layer_ms[:, 0]


def _accel(ing, cpu_nodes: list[str] | None, provider: str = OV) -> dict:
    prof = {**BASE, **copy.deepcopy(FAST), "providers": [provider, "CPUExecutionProvider"],
            "cpu": {**copy.deepcopy(SLOW), "threads": {1: copy.deepcopy(SLOW)}}}
    if cpu_nodes is not None:
        prof["cpu_nodes"] = {ing.sha256: cpu_nodes}
    return prof


def test_the_layers_the_cpu_runs_are_priced_at_the_cpu_figures(tmp_path, tinyconv):
    fast = _cost(tmp_path / "a", tinyconv, {**BASE, **FAST}, None)  # every layer at the top level's figures
    slow = _cost(tmp_path / "b", tinyconv, {**BASE, **SLOW}, None)  # every layer at the CPU's
    assert (slow > 10 * fast).all()
    # the CPU runs the depthwise conv and the classifier (as OpenVINO leaves Hardmax), the accelerator the rest
    mixed = _cost(tmp_path / "c", tinyconv, _accel(tinyconv, ["conv_3", "fc_0"]), [OV])
    on_cpu = [i for i, layer in enumerate(tinyconv.graph.layers) if {"conv_3", "fc_0"} & set(layer.node_names)]
    assert len(on_cpu) == 2
    rest = [i for i in range(len(mixed)) if i not in on_cpu]
    assert np.allclose(mixed[on_cpu], slow[on_cpu]) and np.allclose(mixed[rest], fast[rest])


def test_one_cpu_node_of_a_layer_prices_the_layer_at_the_cpu_figures(tmp_path, tinyconv):
    slow = _cost(tmp_path / "b", tinyconv, {**BASE, **SLOW}, None)
    fast = _cost(tmp_path / "a", tinyconv, {**BASE, **FAST}, None)
    mixed = _cost(tmp_path / "c", tinyconv, _accel(tinyconv, ["relu_0"]), [OV])  # conv_0, bn_0 | relu_0
    assert mixed[0] == pytest.approx(slow[0]) and np.allclose(mixed[1:], fast[1:])


def test_measured_tables_price_each_node_at_its_providers_time(tmp_path, tinyconv):
    keys = [n for layer in tinyconv.graph.layers for n in layer.node_names]
    prof = _accel(tinyconv, ["relu_0"])
    prof["layers"] = {tinyconv.sha256: {k: 0.01 for k in keys}}
    prof["cpu"]["layers"] = {tinyconv.sha256: {k: 1.0 for k in keys}}
    mixed = _cost(tmp_path, tinyconv, prof, [OV])
    assert mixed[0] == pytest.approx(0.01 + 0.01 + 1.0)  # conv_0, bn_0 on OpenVINO, relu_0 on the CPU
    assert mixed[1] == pytest.approx(0.03)


def test_without_claims_every_node_is_at_the_providers_figures_and_a_warning_says_how_to_get_them(
        tmp_path, tinyconv, caplog):
    fast = _cost(tmp_path / "a", tinyconv, {**BASE, **FAST}, None)
    with caplog.at_level(logging.WARNING):
        priced = _cost(tmp_path / "c", tinyconv, _accel(tinyconv, None), [OV])  # this onnxruntime lacks OpenVINO
    assert np.allclose(priced, fast)
    said = [r.getMessage() for r in caplog.records if "leaves to the CPU is unknown" in r.getMessage()]
    assert len(said) == 1 and "device 'dev'" in said[0] and "lacks OpenVINOExecutionProvider" in said[0]
    assert f"edgec profile --providers {OV} --model <model.onnx>" in said[0]


def test_without_cpu_figures_a_warning_and_the_providers_figures(tmp_path, tinyconv, caplog):
    fast = _cost(tmp_path / "a", tinyconv, {**BASE, **FAST}, None)
    prof = _accel(tinyconv, None)
    del prof["cpu"]
    with caplog.at_level(logging.WARNING):
        priced = _cost(tmp_path / "c", tinyconv, prof, [OV])
    assert np.allclose(priced, fast)
    said = [r.getMessage() for r in caplog.records if "has no cpu: figures" in r.getMessage()]
    assert len(said) == 1 and "device 'dev'" in said[0] and "every node is priced at the provider's figures" in said[0]


def test_claims_from_this_machines_onnxruntime_when_it_has_the_provider(tmp_path, tinyconv):
    """No cpu_nodes in the profile, but this onnxruntime has the device's providers: it says which nodes the CPU
    runs (Azure's provider takes none: every layer at the CPU's figures)."""
    slow = _cost(tmp_path / "b", tinyconv, {**BASE, **SLOW}, None)
    priced = _cost(tmp_path / "c", tinyconv, _accel(tinyconv, None, provider=AZURE), [AZURE])
    assert np.allclose(priced, slow)
