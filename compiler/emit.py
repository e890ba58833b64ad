"""Emit: (normalised model, LayerGraph, Plan) -> per-device ONNX fragments and manifest.json, atomically."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import UserError
from .graph import LayerGraph
from .fragment import EncodedModel, assemble, value_info
from .ingest import Ingested
from .layers import node_inputs
from .plan.types import Plan, Stage
from .simulate import Prediction, crossing_tensors
from .spatial.tiles import TileSpec, build_tile_model, stage_layout, tile_name

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
    encoded: EncodedModel
    predicted_ms: float

    @property
    def sha256(self) -> str:
        return self.encoded.sha256

    @property
    def data(self) -> bytes:
        return self.encoded.data


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def build_fragments(ing: Ingested, plan: Plan, pred: Prediction) -> list[Fragment]:
    graph, model = ing.graph, ing.model
    crossing = crossing_tensors(plan, graph)
    leaving = {(t, a) for t, a, _ in crossing}
    frags = []
    for k, stage in enumerate(plan.stages):
        if stage.spatial is not None:
            frags.extend(_tile_fragments(ing, stage, k, pred))
            continue
        layers = graph.layers[stage.lo:stage.hi]
        produced = {t for layer in layers for t in layer.outputs}
        inputs = [t for layer in layers for t in layer.inputs if t not in produced]
        inputs = list(dict.fromkeys(inputs))
        outputs = [t for layer in layers for t in layer.outputs if (t, k) in leaving or t in graph.outputs]
        node_ids = sorted(i for layer in layers for i in layer.nodes)
        fid = f"f{k}"
        encoded = _fragment_model(model, graph, node_ids, inputs, outputs, f"{_safe(stage.device)}_{fid}")
        frags.append(Fragment(fid, stage.device, f"{_safe(stage.device)}.{fid}.onnx", tuple(inputs), tuple(outputs),
                              encoded, pred.stage_ms[k]))
    return frags


def _tile_fragments(ing: Ingested, stage: Stage, k: int, pred: Prediction) -> list[Fragment]:
    """One fragment per tile of every segment of spatial stage k (ids f{stage}s{segment}t{tile})."""
    out = []
    for maps, tiles in stage_layout(ing.graph, stage, k):
        for spec, reg in tiles:
            clash = {spec.in_name, spec.out_name} & set(ing.graph.tensors)
            if clash:
                raise RuntimeError(f"tile tensor name {clash.pop()!r} is also a tensor of the model")
            name = f"{_safe(spec.device)}_{spec.fid}"
            encoded = build_tile_model(ing.model, ing.graph, maps, reg, spec.in_name, spec.out_name, name)
            out.append(Fragment(spec.fid, spec.device, f"{_safe(spec.device)}.{spec.fid}.onnx",
                                (spec.in_name,), (spec.out_name,), encoded,
                                pred.tile_ms[spec.stage, spec.segment, spec.index]))
    return out


def _fragment_model(model, graph: LayerGraph, node_ids, inputs, outputs, name) -> EncodedModel:
    nodes = [model.graph.node[i] for i in node_ids]
    used = {n for node in nodes for n in node_inputs(node)}
    inits = [i for i in model.graph.initializer if i.name in used]
    return assemble(model, nodes, [value_info(t, graph.tensors[t]) for t in inputs],
                    [value_info(t, graph.tensors[t]) for t in outputs], inits, name)


class _Schedule:
    """Every device's step list and the manifest's transfer list, built in stage order."""

    def __init__(self, graph: LayerGraph, devices: list[str]):
        self.graph = graph
        self.steps: dict[str, list[dict]] = {d: [] for d in devices}
        self.transfers: list[dict] = []

    def send(self, src: str, dst: str, tensor: str, graph_tensor: str, as_name: str | None = None,
             region: dict | None = None, axis: int = 0, rows: tuple[int, int] | None = None) -> None:
        """A send step (of `region` of `tensor`, stored on dst as `as_name`) and its transfer entry; the
        piece is rows `rows` along `axis` of `graph_tensor` (all of it when rows is None)."""
        step = {"op": "send", "tensor": tensor, "to": dst}
        if region is not None:
            step["region"] = region
        if as_name is not None and as_name != tensor:
            step["as"] = as_name
        self.steps[src].append(step)
        if dst == HOST:
            return
        info = self.graph.tensors[graph_tensor]
        shape = list(info.shape)
        if rows is not None:
            shape[axis] = rows[1] - rows[0]
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize
        self.transfers.append({"tensor": tensor, "src": src, "dst": dst, "shape": shape, "dtype": info.dtype,
                               "bytes": nbytes, "region": region})


def build_manifest(ing: Ingested, plan: Plan, pred: Prediction, frags: list[Fragment], cluster_dict: dict,
                   outdir: Path, plan_info: dict) -> dict:
    """The manifest: per stage, its device receives the stage's inputs, runs its fragment (a spatial
    stage: scatters, runs tiles with halo exchange, gathers; see _spatial_steps) and sends what leaves.

    A transfer entry describes its send step: `tensor` is the name on the sender (a tile tensor's name
    says which rows of which graph tensor it holds, see tile_name), `region` the send's region of it."""
    graph = ing.graph
    stage_dev = [s.device for s in plan.stages]
    stage_of = plan.stage_of_layer()
    crossing = crossing_tensors(plan, graph)
    by_id = {f.id: f for f in frags}
    sched = _Schedule(graph, [d["name"] for d in cluster_dict["devices"]])
    out_dev = {}
    for k, stage in enumerate(plan.stages):
        dev = stage.device
        layout = stage_layout(graph, stage, k) if stage.spatial is not None else None
        if layout is None:
            inputs, outputs = by_id[f"f{k}"].inputs, by_id[f"f{k}"].outputs
        else:
            y = layout[-1][0].output
            inputs = (layout[0][0].input,)
            outputs = (y,) if y in graph.outputs or any(t == y and a == k for t, a, _ in crossing) else ()
        for t in inputs:
            src = HOST if t in graph.inputs else stage_dev[stage_of[graph.producer[t]]]
            if src != dev:  # consecutive stages on one device share its store
                sched.steps[dev].append({"op": "recv", "tensor": t, "from": src})
        if layout is None:
            sched.steps[dev].append({"op": "run", "fragment": f"f{k}"})
        else:
            later = {t for s in plan.stages[k + 1:] if s.device == dev for i in range(s.lo, s.hi) for t in graph.layers[i].inputs}
            _spatial_steps(sched, stage, layout, keep_input=inputs[0] in later)
        for t in outputs:
            for dst in sorted({stage_dev[b] for tt, a, b in crossing if tt == t and a == k} - {dev}, key=stage_dev.index):
                sched.send(dev, dst, t, t)
            if t in graph.outputs:
                sched.send(dev, HOST, t, t)
                out_dev[t] = dev
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
        "transfers": sched.transfers,
        "steps": {d: s for d, s in sched.steps.items()},
        "predicted": pred.to_dict(),
        "plan": plan_info,
    }


def _spatial_steps(sched: _Schedule, stage: Stage, layout, keep_input: bool) -> None:
    """Scatter the stage input's rows from the stage's device to the first segment's tiles (then drop the
    whole input unless a later stage there reads it), run the segments with halo exchange between them,
    and gather the last segment's output whole on the stage's device under its graph name (so later
    stages and outputs use it as after a pipeline stage)."""
    axis = stage.spatial.axis
    x, y = layout[0][0].input, layout[-1][0].output
    holders = [(stage.device, 0, sched.graph.tensors[x].shape[axis], x)]
    for j, (maps, tiles) in enumerate(layout):
        drop = {x} if j == 0 and not keep_input else set()
        _exchange(sched, maps.input, axis, holders, [(t.device, *t.in_rows, t.in_name) for t, _ in tiles], drop)
        for t, _ in tiles:
            sched.steps[t.device] += [{"op": "run", "fragment": t.fid}, {"op": "free", "tensors": [t.in_name]}]
        holders = [(t.device, *t.out_rows, t.out_name) for t, _ in tiles]
    _exchange(sched, y, axis, holders, [(stage.device, 0, sched.graph.tensors[y].shape[axis], y)])


@dataclass(frozen=True)
class _Move:
    """Rows [lo, hi) of an exchanged tensor: from src, which stores rows [start, stop) as `held`, to dst,
    which stores them as `piece` (src == dst: a local slice, or nothing when piece is held itself)."""

    src: str
    dst: str
    held: str
    start: int
    stop: int
    lo: int
    hi: int
    piece: str

    def region(self, axis: int) -> dict | None:
        whole = (self.lo, self.hi) == (self.start, self.stop)
        return None if whole else {"axis": axis, "start": self.lo - self.start, "stop": self.hi - self.start}


def _moves(tensor: str, holders, needs) -> list[_Move]:
    """Every holder's rows of every need, named so that a piece that is a whole need is that need."""
    out = []
    for h, s, e, held in holders:
        for r, n0, n1, target in needs:
            lo, hi = max(s, n0), min(e, n1)
            if lo >= hi:
                continue
            piece = target if (lo, hi) == (n0, n1) else tile_name(tensor, r, lo, hi)
            if h == r and (lo, hi) == (s, e) and piece != target:
                piece = held  # all of its own rows, one part among several: no copy
            out.append(_Move(h, r, held, s, e, lo, hi, piece))
    return out


def _exchange(sched: _Schedule, tensor: str, axis: int, holders, needs, drop: set[str] = frozenset()) -> None:
    """Move rows of `tensor` from holders (device, start, stop, stored name) to needs (device, start, stop,
    name to store): each holder sends every other device the rows it has of that device's need (device
    to device, in need order) before it receives, and slices its own; each receiver concatenates its
    pieces in row order. Each device then frees what only this exchange used (graph-named tensors stay,
    except those in `drop`)."""
    moves = _moves(tensor, holders, needs)
    targets = {n[3] for n in needs}
    for dev in dict.fromkeys([h[0] for h in holders] + [n[0] for n in needs]):
        for m in moves:
            if m.src == dev != m.dst:
                sched.send(dev, m.dst, m.held, tensor, m.piece, m.region(axis), axis, (m.lo, m.hi))
        mine = sorted((m for m in moves if m.dst == dev), key=lambda m: m.lo)
        steps = sched.steps[dev]
        steps += [{"op": "slice", "tensor": m.held, "axis": axis, "start": m.lo - m.start, "stop": m.hi - m.start,
                   "as": m.piece} for m in mine if m.src == dev and m.piece != m.held]
        steps += [{"op": "recv", "tensor": m.piece, "from": m.src} for m in mine if m.src != dev]
        target = next((n[3] for n in needs if n[0] == dev), None)
        if len(mine) > 1:
            steps.append({"op": "concat", "parts": [m.piece for m in mine], "axis": axis, "as": target})
        elif mine and mine[0].piece != target:
            raise RuntimeError(f"{dev}: rows of {tensor} arrive as {mine[0].piece}, not {target}")
        free = {h[3] for h in holders if h[0] == dev and (h[3] != tensor or h[3] in drop)} | {m.piece for m in mine}
        if free - targets:
            steps.append({"op": "free", "tensors": sorted(free - targets)})


def _relative_or_absolute(path: Path, outdir: Path) -> str:
    """The source model's path as the manifest records it: relative to the manifest's folder if possible."""
    try:
        return os.path.relpath(path.resolve(), outdir.resolve())
    except ValueError:  # different drives (Windows)
        return str(path.resolve())


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
            with open(tmp / f.file, "wb") as fh:
                fh.writelines(f.encoded.chunks)
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
