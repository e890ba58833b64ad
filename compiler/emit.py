"""Emit: (normalised model, LayerGraph, Plan) -> per-device ONNX fragments and manifest.json, atomically."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgec.runtime import MANIFEST_FORMAT, MANIFEST_VERSION
from edgec.runtime.errors import InputError, one_line
from edgec.runtime.interrupts import check_interrupted
from edgec.runtime.manifest import load_manifest
from edgec.runtime.manifest_types import HOST

from .errors import UserError
from .graph import LayerGraph
from .fragment import EncodedModel, assemble, value_info
from .ingest import Ingested
from .layers import node_inputs
from .cost import Prediction, crossing_tensors
from .plan_types import Plan, Stage
from .spatial.tiles import build_tile_model, stage_layout, tile_name

__all__ = ["EmittedFragment", "FallbackBuild", "build_fragments", "assemble_manifest", "write_output",
           "check_output_dir", "manifest_text", "fallback_entries", "MANIFEST_FORMAT", "MANIFEST_VERSION"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmittedFragment:
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


@dataclass(frozen=True)
class FallbackBuild:
    """The build planned without device `without` (written to OUTDIR/fallback-<without>/, a complete build of
    its own), or, with `manifest` None, why no plan fits the devices left."""

    without: str
    manifest: dict | None
    frags: tuple[EmittedFragment, ...] = ()
    error: str | None = None

    @property
    def folder(self) -> str:
        return f"fallback-{_safe(self.without)}"


def manifest_text(manifest: dict) -> str:
    """manifest.json's exact text: sorted keys, so that a rebuild of the same plan is byte-identical."""
    return json.dumps(manifest, indent=1, sort_keys=True) + "\n"


def fallback_entries(builds: list[FallbackBuild]) -> list[dict]:
    """The main manifest's `fallbacks` list: where each fallback manifest is and the sha256 of its text."""
    out = []
    for b in builds:
        if b.manifest is None:
            out.append({"without": b.without, "manifest": None, "sha256": None, "error": b.error})
        else:
            digest = hashlib.sha256(manifest_text(b.manifest).encode("utf-8")).hexdigest()
            out.append({"without": b.without, "manifest": f"{b.folder}/manifest.json", "sha256": digest})
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def build_fragments(ing: Ingested, plan: Plan, pred: Prediction) -> list[EmittedFragment]:
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
        frags.append(EmittedFragment(fid, stage.device, f"{_safe(stage.device)}.{fid}.onnx", tuple(inputs),
                                     tuple(outputs), encoded, pred.stage_ms[k]))
    return frags


def _tile_fragments(ing: Ingested, stage: Stage, k: int, pred: Prediction) -> list[EmittedFragment]:
    """One fragment per tile of every segment of spatial stage k (ids f{stage}s{segment}t{tile})."""
    out = []
    for _, tiles in stage_layout(ing.graph, stage, k):
        for spec, geo in tiles:
            clash = {spec.in_name, spec.out_name} & set(ing.graph.tensors)
            if clash:
                raise RuntimeError(f"tile tensor name {clash.pop()!r} is also a tensor of the model")
            name = f"{_safe(spec.device)}_{spec.fid}"
            encoded = build_tile_model(ing.model, ing.graph, geo, spec.in_name, spec.out_name, name)
            out.append(EmittedFragment(spec.fid, spec.device, f"{_safe(spec.device)}.{spec.fid}.onnx",
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
             region: dict | list | None = None, cut: tuple[tuple[int, int, int], ...] = ()) -> None:
        """A send step (of `region` of `tensor`, stored on dst as `as_name`) and its transfer entry; the
        piece is `graph_tensor` cut to [start, stop) on each (axis, start, stop) of `cut` (all of it when
        cut is empty)."""
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
        for axis, start, stop in cut:
            shape[axis] = stop - start
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize
        self.transfers.append({"tensor": tensor, "src": src, "dst": dst, "shape": shape, "dtype": info.dtype,
                               "bytes": nbytes, "region": region})


def assemble_manifest(ing: Ingested, plan: Plan, pred: Prediction, frags: list[EmittedFragment], cluster_dict: dict,
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
    stages and outputs use it as after a pipeline stage). A grid's tiles are boxes of rows and columns."""
    axes = stage.spatial.axes
    x, y = layout[0][0].input, layout[-1][0].output

    def whole(tensor: str) -> Box:
        return tuple((0, sched.graph.tensors[tensor].shape[ax]) for ax in axes)

    holders = [(stage.device, whole(x), x)]
    for j, (maps, tiles) in enumerate(layout):
        drop = {x} if j == 0 and not keep_input else set()
        _exchange(sched, maps.input, axes, holders, [(t.device, t.in_box, t.in_name) for t, _ in tiles], drop)
        for t, _ in tiles:
            sched.steps[t.device] += [{"op": "run", "fragment": t.fid}, {"op": "free", "tensors": [t.in_name]}]
        holders = [(t.device, t.out_box, t.out_name) for t, _ in tiles]
    _exchange(sched, y, axes, holders, [(stage.device, whole(y), y)])


Box = tuple[tuple[int, int], ...]  # [start, stop) on each tiled axis: rows, or rows and columns


def _box_name(tensor: str, device: str, box: Box) -> str:
    return tile_name(tensor, device, *box[0], box[1] if len(box) > 1 else None)


@dataclass(frozen=True)
class _Move:
    """The part `part` of an exchanged tensor: from src, which stores its box `have` as `held`, to dst,
    which stores it as `piece` (src == dst: a local slice, or nothing when piece is held itself)."""

    src: str
    dst: str
    held: str
    have: Box
    part: Box
    piece: str

    def cut(self, axes: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
        """(axis, start, stop) of the part within the graph tensor, on every tiled axis."""
        return tuple((ax, a, b) for ax, (a, b) in zip(axes, self.part))

    def ranges(self, axes: tuple[int, ...]) -> list[dict]:
        """The part relative to what src holds, on the axes where it is not all of it."""
        return [{"axis": ax, "start": a - h0, "stop": b - h0}
                for ax, (a, b), (h0, h1) in zip(axes, self.part, self.have) if (a, b) != (h0, h1)]

    def region(self, axes: tuple[int, ...]) -> dict | list | None:
        """The send's region: None (all of it), one range, or a list of ranges (a box)."""
        r = self.ranges(axes)
        return None if not r else r[0] if len(r) == 1 else r


def _moves(tensor: str, holders, needs) -> list[_Move]:
    """Every holder's part of every need, named so that a piece that is a whole need is that need."""
    out = []
    for h, have, held in holders:
        for r, need, target in needs:
            part = tuple((max(s, n0), min(e, n1)) for (s, e), (n0, n1) in zip(have, need))
            if any(b <= a for a, b in part):
                continue
            piece = target if part == need else _box_name(tensor, r, part)
            if h == r and part == have and piece != target:
                piece = held  # all of its own rows, one part among several: no copy
            out.append(_Move(h, r, held, have, part, piece))
    return out


def _exchange(sched: _Schedule, tensor: str, axes: tuple[int, ...], holders, needs, drop: set[str] = frozenset()) -> None:
    """Move boxes of `tensor` from holders (device, box, stored name) to needs (device, box, name to
    store): each holder sends every other device the part it has of that device's need (device to
    device, in need order) before it receives, and slices its own; each receiver concatenates its
    pieces in order (see _assemble). Each device then frees what only this exchange used (graph-named
    tensors stay, except those in `drop`)."""
    moves = _moves(tensor, holders, needs)
    targets = {n[2] for n in needs}
    for dev in dict.fromkeys([h[0] for h in holders] + [n[0] for n in needs]):
        for m in moves:
            if m.src == dev != m.dst:
                sched.send(dev, m.dst, m.held, tensor, m.piece, m.region(axes), m.cut(axes))
        mine = sorted((m for m in moves if m.dst == dev), key=lambda m: m.part)
        steps = sched.steps[dev]
        temps = []
        for m in mine:
            if m.src == dev and m.piece != m.held:
                temps += _local_slice(steps, tensor, m, axes)
        steps += [{"op": "recv", "tensor": m.piece, "from": m.src} for m in mine if m.src != dev]
        target = next((n[2] for n in needs if n[0] == dev), None)
        temps += _assemble(steps, tensor, dev, axes, mine, target)
        free = {h[2] for h in holders if h[0] == dev and (h[2] != tensor or h[2] in drop)} | {m.piece for m in mine}
        free |= set(temps)
        if free - targets:
            steps.append({"op": "free", "tensors": sorted(free - targets)})


def _local_slice(steps: list[dict], tensor: str, m: _Move, axes: tuple[int, ...]) -> list[str]:
    """Slice steps cutting a device's own part out of what it holds, one axis at a time (a box: rows
    first, into a temporary named for that band); returns the temporaries."""
    # nothing to cut: a whole-range slice stores the held tensor under the piece's name
    ranges = m.ranges(axes) or [{"axis": axes[0], "start": 0, "stop": m.have[0][1] - m.have[0][0]}]
    src, box, temps = m.held, m.have, []
    for k, r in enumerate(ranges):
        j = axes.index(r["axis"])
        box = box[:j] + (m.part[j],) + box[j + 1:]
        out = m.piece if k == len(ranges) - 1 else _box_name(tensor, m.dst, box)
        steps.append({"op": "slice", "tensor": src, **r, "as": out})
        temps += [out] if out != m.piece else []
        src = out
    return temps


def _assemble(steps: list[dict], tensor: str, dev: str, axes: tuple[int, ...], mine: list[_Move],
              target: str | None) -> list[str]:
    """Concatenate a device's pieces (sorted by box) into its need: along the axis; for a grid, each
    band of equal rows along the width, then the bands along the height. Returns the temporaries."""
    if len(mine) <= 1:
        if mine and mine[0].piece != target:
            raise RuntimeError(f"{dev}: rows of {tensor} arrive as {mine[0].piece}, not {target}")
        return []
    if len(axes) == 1:
        steps.append({"op": "concat", "parts": [m.piece for m in mine], "axis": axes[0], "as": target})
        return []
    bands = [list(band) for _, band in itertools.groupby(mine, key=lambda m: m.part[0])]
    names, temps = [], []
    for band in bands:
        if len(band) == 1:
            names.append(band[0].piece)
            continue
        box = (band[0].part[0], (band[0].part[1][0], band[-1].part[1][1]))
        names.append(target if len(bands) == 1 else _box_name(tensor, dev, box))
        steps.append({"op": "concat", "parts": [m.piece for m in band], "axis": axes[1], "as": names[-1]})
        temps += [names[-1]] if len(bands) > 1 else []
    if len(bands) > 1:
        steps.append({"op": "concat", "parts": names, "axis": axes[0], "as": target})
    return temps


def _relative_or_absolute(path: Path, outdir: Path) -> str:
    """The source model's path as the manifest records it: relative to the manifest's folder if possible."""
    try:
        return os.path.relpath(path.resolve(), outdir.resolve())
    except ValueError:  # different drives (Windows)
        return str(path.resolve())


def _tensor_entry(graph: LayerGraph, t: str) -> dict:
    info = graph.tensors[t]
    return {"name": t, "shape": list(info.shape), "dtype": info.dtype}


def write_output(outdir: Path, manifest: dict, frags: list[EmittedFragment],
                 fallbacks: list[FallbackBuild] = ()) -> None:
    """Write into a temporary sibling folder, then swap it into place: a failure (or SIGTERM/SIGINT, when
    the caller turns them into exceptions) leaves nothing half-written and no temporary folder.

    An existing OUTDIR is replaced only when it is empty or holds exactly an earlier edgec build (see
    check_output_dir); every fragment must load in onnxruntime before the build is swapped in. Each
    fallback build goes to its own subfolder, which `manifest["fallbacks"]` must name (fallback_entries).
    """
    outdir = Path(outdir).resolve()  # `-o .` has no name to put the temporary sibling beside
    if fallbacks and manifest.get("fallbacks") != fallback_entries(list(fallbacks)):
        raise RuntimeError("the manifest's fallbacks do not describe the fallback builds being written")
    check_output_dir(outdir)
    tmp: Path | None = None
    try:
        with _signals_held():  # the folder exists only once `tmp` names it, for the cleanup below
            outdir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.tmp-", dir=outdir.parent))
        builds = [(tmp, outdir, manifest, frags)]
        builds += [(tmp / b.folder, outdir / b.folder, b.manifest, b.frags) for b in fallbacks if b.manifest is not None]
        for folder, final, data, files in builds:
            folder.mkdir(exist_ok=True)
            _write_build(folder, final, data, files)
        for folder, _, _, _ in builds:
            _ensure_runtime_accepts(folder / "manifest.json")
        with _signals_held():  # half a swap would leave the old build beside the new one, or neither in place
            _swap_into_place(tmp, outdir, check_output_dir(outdir))  # checked again: files may have appeared
    except OSError as exc:
        raise UserError(f"cannot write the build: {exc.strerror or exc}", str(outdir)) from None
    finally:
        if tmp is not None and tmp.exists():  # tmp is gone once swapped into place
            shutil.rmtree(tmp, ignore_errors=True)


def _ensure_runtime_accepts(path: Path) -> None:
    """The emitter's postcondition, checked before the build is swapped into place: the runtime's own
    parser (which owns the schema) accepts the manifest as written, schedule included. The fragment
    hashes are not recomputed: they were taken from the very bytes written."""
    try:
        load_manifest(path, check_files=False)
    except InputError as exc:
        raise RuntimeError(f"the emitter wrote a manifest the runtime refuses: {exc}") from None


def _write_build(folder: Path, final: Path, manifest: dict, frags) -> None:
    """One build's fragments and manifest.json into `folder` (which becomes `final` once swapped in)."""
    for f in frags:
        check_interrupted()
        with open(folder / f.file, "wb") as fh:
            fh.writelines(f.encoded.chunks)
    # From the written files: onnxruntime reads them itself, where bytes would need each fragment
    # joined into one more copy (575 MB for VGG-19) first.
    _check_loadable(folder, frags, final, manifest)
    (folder / "manifest.json").write_text(manifest_text(manifest), encoding="utf-8")


def check_output_dir(outdir: Path) -> tuple[str, ...]:
    """The files of the earlier build that OUTDIR holds, as paths relative to it (a fallback's files as
    "fallback-<device>/<file>"); empty if OUTDIR is missing or empty. UserError if OUTDIR is not a folder, or
    holds anything else: the user's files are never replaced."""
    outdir = Path(outdir).resolve()
    if not outdir.name:
        raise UserError("cannot write a build over the root folder", str(outdir))
    if not outdir.exists():
        return ()
    if not outdir.is_dir():
        raise UserError("output path exists and is not a folder", str(outdir))
    try:
        entries = sorted(outdir.iterdir())
        build = _build_files(outdir) if entries else set()
        found, foreign = _walk_build(outdir, entries, build)
    except OSError as exc:
        raise UserError(f"cannot read the output folder: {exc.strerror}", str(outdir)) from None
    if foreign:
        what = "which is not part of the earlier edgec build there" if build else "and is not an edgec build"
        raise UserError(f"output folder holds {foreign[0]!r} {what}; refusing to replace it (move that away or "
                        "choose another output folder)", str(outdir))
    return tuple(found)


def _walk_build(outdir: Path, entries: list[Path], build: set[str]) -> tuple[list[str], list[str]]:
    """(the build's files found, relative paths; what is not the build's: other files, links, folders)."""
    found, foreign = [], []
    folders = {name.split("/")[0] for name in build if "/" in name}
    for e in entries:
        if e.is_symlink():
            foreign.append(e.name)
        elif e.is_dir() and e.name in folders:
            for sub in sorted(e.iterdir()):
                rel = f"{e.name}/{sub.name}"
                (found if rel in build and sub.is_file() and not sub.is_symlink() else foreign).append(rel)
            found.append(f"{e.name}/")
        elif e.is_file() and e.name in build:
            found.append(e.name)
        else:
            foreign.append(e.name)
    return found, foreign


def _build_files(folder: Path) -> set[str]:
    """manifest.json and the fragment files it names, if folder/manifest.json is an edgec manifest; else
    empty. A fallback it names (FOLDER/manifest.json, FOLDER one plain name) adds that folder's build
    files as "FOLDER/<file>"."""
    data = _read_manifest(folder / "manifest.json")
    files = _own_files(data)
    if not files:
        return set()
    for fb in data.get("fallbacks") or ():
        path = fb.get("manifest") if isinstance(fb, dict) else None
        if path is None:
            continue
        sub, _, name = path.partition("/") if isinstance(path, str) else ("", "", "")
        inner = _own_files(_read_manifest(folder / sub / name)) if name == "manifest.json" and _plain(sub) else set()
        if not inner:
            return set()  # a fallback that is not a folder of ours: not a build we wrote
        files |= {f"{sub}/{f}" for f in inner}
    return files


def _read_manifest(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _own_files(data) -> set[str]:
    """manifest.json and the fragment files named by `data`, if it is an edgec manifest; else empty."""
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("fragments"), list):
        return set()
    files = {"manifest.json"}
    for frag in data["fragments"]:
        name = frag.get("file") if isinstance(frag, dict) else None
        if not _plain(name):
            return set()  # a name reaching outside the folder: not a manifest we wrote
        files.add(name)
    return files


def _plain(name) -> bool:
    """A file name of its own, without any folder part."""
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name and "\\" not in name


def _check_loadable(folder: Path, frags: list[EmittedFragment], outdir: Path, manifest: dict) -> None:
    """UserError naming the fragment and onnxruntime's reason if a fragment does not load (e.g. an
    operator of a custom domain): the build would fail on the devices instead. Loading is what is
    checked, so neither graph optimisation nor weight prepacking (half the load time of VGG-19's 575 MB)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    model = os.path.normpath(outdir / manifest["model"]["path"])
    for f in frags:
        check_interrupted()  # the sessions freed here may swallow a signal's first raise
        try:
            ort.InferenceSession(str(folder / f.file), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises several pybind error types
            raise UserError(f"fragment {f.id} for {f.device} ({f.file}) does not load in onnxruntime, so no "
                            f"device could run it: {one_line(exc, 300)}", model) from None


@contextlib.contextmanager
def _signals_held():
    """Hold SIGTERM and SIGINT within (main thread only), then deliver them to the handlers in place before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: pending.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for s in dict.fromkeys(pending):
            signal.raise_signal(s)


def _swap_into_place(tmp: Path, outdir: Path, old_files: tuple[str, ...]) -> None:
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
    _remove_old_build(old, old_files)


def _remove_old_build(old: Path, files: tuple[str, ...]) -> None:
    """Delete the earlier build's files by name, then its fallback folders ("NAME/" entries) and its
    folder: a file that appeared in one after the last check keeps it, which is reported, not deleted."""
    for name in files:
        if not name.endswith("/"):
            (old / name).unlink(missing_ok=True)
    for folder in [old / name for name in files if name.endswith("/")] + [old]:
        try:
            folder.rmdir()
        except OSError:
            logger.warning("kept %s: files appeared in the earlier build while compiling", folder)
