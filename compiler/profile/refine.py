"""`edgec profile --refine REPORT.json`: fold the measured fragment times of an accuracy report (`edgec run
--report`, schema in edgec.runtime.coordinator.accuracy) back into a device's profile, as its per-node table
`layers: {<model sha256>: {<onnx node name>: ms}}`.

Which device: `--device NAME`, else every device of the report that ran a measured fragment, when they all
share one profile and thread count (else the choices are named). Which profile: `--profile NAME|PATH`, else
the one the manifest names for that device. The table goes where the cost model reads the device's figures
(the profile's `threads: {n: ...}` entry for the device's thread count, else the top level).

A fragment's measured median is split over its nodes (read from its ONNX file) in proportion to the cost
model's per-node prediction for that device: the profile's own table for this model when it covers every
node; otherwise the layer's predicted time split into the per-operator overhead of each node, the op-table
price of each priced node, and the rest on the layer's own operator (its first node). So the table's sum over
a fragment is its measured median, and a recompile predicts it. Nodes outside the measured fragments keep
that prediction, so the table covers the whole model (the cost model uses a table only then).

Tile fragments (spatial stages) compute parts of nodes: they are skipped, with a note on stderr.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import onnx
import yaml

from edgec.runtime.errors import EdgecRuntimeError
from edgec.runtime.manifest.types import Fragment, Manifest
from edgec.runtime.manifest.load import load_manifest

from ..cluster import ClusterModel, DeviceSpec, Profile, load_profile
from ..cost.table import (build_cost_table, layer_out_elems, model_context, price_keys, node_ms, node_price,
                          op_overhead_ms)
from ..errors import UserError
from ..ingest import Ingested, load_model
from .output import write_profile

__all__ = ["refine_profile"]

DIGITS = 6  # table entries in ms, rounded: a fragment's sum is its measured median to within 1e-6 ms per node


def refine_profile(report_path: str | Path, output: str | Path, *, profile: str | None = None,
                   device: str | None = None, note: Callable[[str], None] = lambda _msg: None) -> str:
    """Write the refined profile to `output` (validated, atomically); returns a one-line summary.
    Every problem is a UserError naming the file at fault."""
    report = _read_report(Path(report_path))
    try:
        manifest = load_manifest(report["manifest"])
    except EdgecRuntimeError as exc:
        raise UserError(f"the report's manifest: {exc}", path=str(report_path)) from None
    measured = _measured_fragments(report, manifest, str(report_path))
    devices = _pick_devices(manifest, measured, device, str(report_path))
    spec = _device_spec(manifest, devices[0], profile)
    ing = _ingest(manifest)
    predicted = node_predictions(ing, spec)
    refined: dict[str, float] = {}
    for frag in (manifest.fragments[f] for f, d in measured.items() if d in devices):
        nodes = _fragment_nodes(manifest, frag, ing)
        if nodes is None:
            note(f"fragment {frag.id} on {frag.device} is a tile of a spatial stage (part of each node): skipped")
            continue
        refined.update(split(measured_ms=report_ms(report, frag.id), nodes=nodes, predicted=predicted))
    if not refined:
        raise UserError(f"no pipeline fragment of {', '.join(devices)} was measured: nothing to refine",
                        path=str(report_path))
    table = {n: round(refined.get(n, ms), DIGITS) for n, ms in predicted.items()}
    where = _place_table(spec.profile, spec.threads, ing.sha256, table, output)
    return (f"refined {len(refined)} of {len(table)} node(s) of {ing.path.name} from {', '.join(devices)} into "
            f"profile {spec.profile.name} ({where})")


# -- the report -------------------------------------------------------------------------------------------
def _read_report(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError("report not found", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the report: {getattr(exc, 'strerror', None) or exc}", path=str(path)) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"not a JSON report: {exc}", path=str(path)) from None
    ok = isinstance(data, dict) and isinstance(data.get("manifest"), str) and isinstance(data.get("fragments"), list)
    if not ok or not all(_fragment_entry_ok(f) for f in data["fragments"]):
        raise UserError("not an `edgec run --report` file (expected manifest and fragments: [{id, device, "
                        "measured_ms}])", path=str(path))
    return data


def _fragment_entry_ok(f: Any) -> bool:
    ms = f.get("measured_ms") if isinstance(f, dict) else None
    return (isinstance(f, dict) and isinstance(f.get("id"), str) and isinstance(f.get("device"), str)
            and (ms is None or (isinstance(ms, (int, float)) and not isinstance(ms, bool) and math.isfinite(ms)
                                and ms > 0)))


def report_ms(report: dict, fid: str) -> float:
    return next(float(f["measured_ms"]) for f in report["fragments"] if f["id"] == fid)


def _measured_fragments(report: dict, manifest: Manifest, where: str) -> dict[str, str]:
    """{fragment id: device} of the report's measured fragments, each checked against the manifest."""
    out = {}
    for f in report["fragments"]:
        frag = manifest.fragments.get(f["id"])
        if frag is None or frag.device != f["device"]:
            raise UserError(f"fragment {f['id']!r} on {f['device']!r} is not in {manifest.path}", path=where)
        if f["measured_ms"] is not None:
            out[frag.id] = frag.device
    return out


def _pick_devices(manifest: Manifest, measured: dict[str, str], device: str | None, where: str) -> list[str]:
    ran = sorted(set(measured.values()), key=manifest.device_names.index)
    if device is not None:
        if device not in ran:
            raise UserError(f"--device {device}: no measured fragment ran on it (devices: {', '.join(ran) or 'none'})",
                            path=where)
        return [device]
    entries = {d.name: d for d in manifest.devices}
    kinds = {(entries[d].profile, entries[d].threads) for d in ran}
    if len(kinds) > 1:
        choices = ", ".join(f"{d} ({entries[d].profile}"
                            f"{'' if entries[d].threads is None else f', {entries[d].threads} threads'})" for d in ran)
        raise UserError(f"the report's devices use different profiles; choose one with --device: {choices}", path=where)
    if not ran:
        raise UserError("the report holds no measured fragment", path=where)
    return ran


def _device_spec(manifest: Manifest, name: str, profile: str | None) -> DeviceSpec:
    entry = next(d for d in manifest.devices if d.name == name)
    prof = load_profile(profile if profile is not None else entry.profile)
    return DeviceSpec(name=name, profile=prof, memory_mb=entry.memory_mb, address=None, threads=entry.threads)


# -- the model and its per-node prediction ----------------------------------------------------------------
def _ingest(manifest: Manifest) -> Ingested:
    shapes = {t.name: tuple(t.shape) for t in manifest.inputs}
    ing = load_model(manifest.model_path, shapes)
    if ing.sha256 != manifest.model_sha256.lower():
        raise UserError(f"the model changed since {manifest.path} was compiled (sha256 {ing.sha256[:12]}..., the "
                        f"manifest says {manifest.model_sha256[:12]}...)", path=str(manifest.model_path))
    return ing


def node_predictions(ing: Ingested, spec: DeviceSpec) -> dict[str, float]:
    """{node name: the cost model's ms on this device} for every node of the model (see the module docstring)."""
    figures = spec.figures
    own = figures.layers.get(ing.sha256, {})
    names = [n for layer in ing.graph.layers for n in layer.node_names]
    if own and all(n in own for n in names):
        return {n: own[n] for n in names}
    cluster = ClusterModel(devices=(spec,), bandwidth_mbps=math.inf, latency_ms=0.0, medium="switched", links={},
                      path="(refine)")
    layer_ms = build_cost_table(ing.graph, cluster, None, ing.model).layer_ms[:, 0]
    context = model_context(ing.model)
    overhead = op_overhead_ms(figures)
    out: dict[str, float] = {}
    for layer, ms in zip(ing.graph.layers, layer_ms):
        elems = layer_out_elems(ing.graph, layer)
        parts = [overhead + node_ms(elems, node_price(figures, keys) or 0.0)
                 for keys in price_keys(layer, ing.model, context)]
        parts[0] += max(float(ms) - sum(parts), 0.0)
        out.update(zip(layer.node_names, parts))
    return out


def _fragment_nodes(manifest: Manifest, frag: Fragment, ing: Ingested) -> list[str] | None:
    """The model nodes a pipeline fragment runs; None for a tile (its tensors are not the model's)."""
    if any(t not in ing.graph.tensors for t in (*frag.inputs, *frag.outputs)):
        return None
    path = manifest.fragment_path(frag)
    try:
        nodes = [n.name for n in onnx.load(str(path), load_external_data=False).graph.node]
    except Exception as exc:  # protobuf's DecodeError and OSError: the file is what is wrong
        raise UserError(f"cannot read fragment {frag.id}: {str(exc).splitlines()[0] if str(exc) else exc}",
                        path=str(path)) from None
    known = {n for layer in ing.graph.layers for n in layer.node_names}
    stray = [n for n in nodes if n not in known]
    if stray:
        raise UserError(f"fragment {frag.id}: node {stray[0]!r} is not a node of {ing.path}", path=str(path))
    return nodes


def split(*, measured_ms: float, nodes: list[str], predicted: dict[str, float]) -> dict[str, float]:
    """measured_ms over the nodes in proportion to their predictions (evenly when all are 0)."""
    total = sum(predicted[n] for n in nodes)
    if total <= 0:
        return {n: measured_ms / len(nodes) for n in nodes}
    return {n: measured_ms * predicted[n] / total for n in nodes}


# -- the profile ----------------------------------------------------------------------------------------------
def _place_table(prof: Profile, threads: int | None, sha256: str, table: dict[str, float], output) -> str:
    """Write the profile file with `table` where Profile.figures(threads) reads it; returns where that is."""
    raw = yaml.safe_load(Path(prof.path).read_text(encoding="utf-8"))  # already validated by load_profile
    if threads is None or not prof.threads:
        target, where = raw, "top level"
    else:
        below = [n for n in prof.threads if n <= threads]
        key = max(below) if below else min(prof.threads)
        target, where = raw["threads"][key], f"threads {key}"
    layers = target.get("layers") or {}
    layers[sha256] = table
    target["layers"] = layers
    write_profile(raw, output)
    return where
