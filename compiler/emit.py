"""Emit: (normalised model, LayerGraph, Plan) -> per-device ONNX fragments and manifest.json, atomically."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from .errors import UserError
from .graph import LayerGraph
from .ingest import Ingested, skeleton
from .layers import node_inputs
from .plan.types import Plan
from .simulate import Prediction, crossing_tensors

__all__ = ["Fragment", "build_fragments", "build_manifest", "write_output", "MANIFEST_FORMAT", "MANIFEST_VERSION"]

MANIFEST_FORMAT = "edgec.manifest"
MANIFEST_VERSION = 1
HOST = "@host"


@dataclass(frozen=True)
class Fragment:
    id: str
    device: str
    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    data: bytes
    predicted_ms: float

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def build_fragments(ing: Ingested, plan: Plan, pred: Prediction) -> list[Fragment]:
    graph, model = ing.graph, ing.model
    crossing = crossing_tensors(plan, graph)
    leaving = {(t, a) for t, a, _ in crossing}
    frags = []
    for k, stage in enumerate(plan.stages):
        layers = graph.layers[stage.lo:stage.hi]
        produced = {t for layer in layers for t in layer.outputs}
        inputs = [t for layer in layers for t in layer.inputs if t not in produced]
        inputs = list(dict.fromkeys(inputs))
        outputs = [t for layer in layers for t in layer.outputs if (t, k) in leaving or t in graph.outputs]
        node_ids = sorted(i for layer in layers for i in layer.nodes)
        fid = f"f{k}"
        proto = _fragment_model(model, graph, node_ids, inputs, outputs, f"{_safe(stage.device)}_{fid}")
        frags.append(Fragment(fid, stage.device, f"{_safe(stage.device)}.{fid}.onnx", tuple(inputs), tuple(outputs),
                              proto.SerializeToString(), pred.stage_ms[k]))
    return frags


def _fragment_model(model, graph: LayerGraph, node_ids, inputs, outputs, name) -> onnx.ModelProto:
    nodes = [model.graph.node[i] for i in node_ids]
    used = {n for node in nodes for n in node_inputs(node)}
    inits = [i for i in model.graph.initializer if i.name in used]

    def vi(t):
        info = graph.tensors[t]
        return helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype)), list(info.shape))

    g = helper.make_graph(nodes, name, [vi(t) for t in inputs], [vi(t) for t in outputs], initializer=inits)
    frag = helper.make_model(g, opset_imports=list(model.opset_import), producer_name="edgec")
    frag.ir_version = model.ir_version
    frag.functions.extend(model.functions)
    try:
        onnx.checker.check_model(skeleton(frag))
    except Exception as exc:  # an emitter bug, not a user error: say which fragment
        raise RuntimeError(f"fragment {name} fails onnx.checker: {exc}") from exc
    return frag


def build_manifest(ing: Ingested, plan: Plan, pred: Prediction, frags: list[Fragment], cluster_dict: dict,
                   outdir: Path, plan_info: dict) -> dict:
    graph = ing.graph
    stage_dev = [s.device for s in plan.stages]
    steps: dict[str, list[dict]] = {d["name"]: [] for d in cluster_dict["devices"]}
    transfers = []
    for k, frag in enumerate(frags):
        dev = frag.device
        for t in frag.inputs:
            src = HOST if t in graph.inputs else stage_dev[_stage_producing(frags, t)]
            steps[dev].append({"op": "recv", "tensor": t, "from": src})
        steps[dev].append({"op": "run", "fragment": frag.id})
        for t in frag.outputs:
            consumers = sorted({stage_dev[b] for tt, a, b in crossing_tensors(plan, graph) if tt == t and a == k},
                               key=stage_dev.index)
            for dst in consumers:
                steps[dev].append({"op": "send", "tensor": t, "to": dst})
                info = graph.tensors[t]
                transfers.append({"tensor": t, "src": dev, "dst": dst, "shape": list(info.shape), "dtype": info.dtype,
                                  "bytes": info.nbytes, "region": None})
            if t in graph.outputs:
                steps[dev].append({"op": "send", "tensor": t, "to": HOST})
    out_dev = {t: f.device for f in frags for t in f.outputs if t in graph.outputs}
    model_path = _relative_or_absolute(ing.path, outdir)
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "model": {"path": model_path, "sha256": ing.sha256},
        "inputs": [_tensor_entry(graph, t) for t in graph.inputs],
        "outputs": [_tensor_entry(graph, t) | {"device": out_dev[t]} for t in graph.outputs],
        "devices": cluster_dict["devices"],
        "network": cluster_dict["network"],
        "fragments": [{"id": f.id, "device": f.device, "file": f.file, "sha256": f.sha256, "inputs": list(f.inputs),
                       "outputs": list(f.outputs), "predicted_ms": round(f.predicted_ms, 4)} for f in frags],
        "transfers": transfers,
        "steps": {d: s for d, s in steps.items()},
        "predicted": pred.to_dict(),
        "plan": plan_info,
    }


def _relative_or_absolute(path: Path, outdir: Path) -> str:
    """The source model's path as the manifest records it: relative to the manifest's folder if possible."""
    try:
        return os.path.relpath(path.resolve(), outdir.resolve())
    except ValueError:  # different drives (Windows)
        return str(path.resolve())


def _stage_producing(frags: list[Fragment], tensor: str) -> int:
    return next(k for k, f in enumerate(frags) if tensor in f.outputs)


def _tensor_entry(graph: LayerGraph, t: str) -> dict:
    info = graph.tensors[t]
    return {"name": t, "shape": list(info.shape), "dtype": info.dtype}


def write_output(outdir: Path, manifest: dict, frags: list[Fragment]) -> None:
    """Write into a temporary sibling folder, then swap it into place: a failure leaves nothing half-written.

    An existing OUTDIR is replaced only when it is empty or holds an earlier edgec build (a manifest.json
    of ours); anything else is the user's data and is refused.
    """
    outdir = Path(outdir)
    if outdir.exists():
        if not outdir.is_dir():
            raise UserError("output path exists and is not a folder", str(outdir))
        entries = list(outdir.iterdir())
        if entries and not _is_edgec_build(outdir):
            raise UserError("output folder is not empty and is not an edgec build; refusing to overwrite it", str(outdir))
    parent = outdir.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.tmp-", dir=parent))
    except OSError as exc:
        raise UserError(f"cannot create the output folder: {exc.strerror}", str(outdir)) from None
    try:
        for f in frags:
            (tmp / f.file).write_bytes(f.data)
        text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
        (tmp / "manifest.json").write_text(text, encoding="utf-8")
        _swap_into_place(tmp, outdir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _is_edgec_build(folder: Path) -> bool:
    try:
        data = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT


def _swap_into_place(tmp: Path, outdir: Path) -> None:
    if not outdir.exists():
        os.replace(tmp, outdir)
        return
    old = outdir.with_name(f".{outdir.name}.old-{os.getpid()}")
    os.replace(outdir, old)
    try:
        os.replace(tmp, outdir)
    except BaseException:
        os.replace(old, outdir)
        raise
    shutil.rmtree(old, ignore_errors=True)
