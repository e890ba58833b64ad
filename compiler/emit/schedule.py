"""The manifest: each device's steps (runs, sends and receives, the tiles' scatter, halo exchange and gather)
and the transfer list, around the fragments of a Plan."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgec.runtime import MANIFEST_FORMAT, MANIFEST_VERSION
from edgec.runtime.manifest.types import HOST

from ..cost import Prediction, crossing_tensors
from ..graph import LayerGraph
from ..ingest import Ingested
from ..plan_types import Plan, Stage
from ..spatial.tiles import stage_layout, tile_name
from .fragments import EmittedFragment

__all__ = ["assemble_manifest"]


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
    """The manifest: per stage, its device receives the stage's inputs and the tensors it passes on, runs
    its fragment (a spatial stage: scatters, runs tiles with halo exchange, gathers; see _spatial_steps)
    and sends what leaves; the messages between stages are `pred.hops`, the ones `pred` timed.

    A transfer entry describes its send step: `tensor` is the name on the sender (a tile tensor's name
    says which rows of which graph tensor it holds, see tile_name), `region` the send's region of it."""
    graph = ing.graph
    stage_dev = [s.device for s in plan.stages]
    crossing = crossing_tensors(plan, graph)
    into = {(t, b): stage_dev[a] for t, a, b in pred.hops}  # (tensor, stage) -> the device it comes from
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
        passed_on = [t for t, a, b in pred.hops if b == k and t not in inputs]
        for t in (*inputs, *passed_on):
            src = HOST if t in graph.inputs else into[t, k]
            if src != dev:  # consecutive stages on one device share its store
                sched.steps[dev].append({"op": "recv", "tensor": t, "from": src})
            if src == HOST and t in graph.outputs and t not in out_dev:  # an input that is also an output
                sched.send(dev, HOST, t, t)
                out_dev[t] = dev
        if layout is None:
            sched.steps[dev].append({"op": "run", "fragment": f"f{k}"})
        else:
            later = {t for s in plan.stages[k + 1:] if s.device == dev for i in range(s.lo, s.hi) for t in graph.layers[i].inputs}
            _spatial_steps(sched, stage, layout, keep_input=inputs[0] in later, order=pred.send_order.get(k))
        _stage_sends(sched, dev, outputs, [(t, d) for t, d in _burst(pred, stage_dev, k) if d != dev])
        out_dev.update((t, dev) for t in outputs if t in graph.outputs)
    _passthrough_outputs(sched, graph, plan.stages[0].device, out_dev)
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


def _passthrough_outputs(sched: _Schedule, graph: LayerGraph, dev: str, out_dev: dict[str, str]) -> None:
    """Model inputs that are also outputs and that no layer reads: `dev` receives each from the host and
    returns it, first thing (an input a layer reads is returned where it arrives, in assemble_manifest)."""
    steps = []
    for t in graph.outputs:
        if t not in out_dev and t in graph.inputs:
            steps += [{"op": "recv", "tensor": t, "from": HOST}, {"op": "send", "tensor": t, "to": HOST},
                      {"op": "free", "tensors": [t]}]
            out_dev[t] = dev
    sched.steps[dev][:0] = steps


def _burst(pred: Prediction, stage_dev: list[str], k: int) -> list[tuple[str, str]]:
    """(tensor, device) of stage k's messages in the order `pred` timed them: its hops in `hops` order,
    or as `pred.burst_order` reorders them (the contention-aware order, order.py order_bursts)."""
    burst = [(t, stage_dev[b]) for t, a, b in pred.hops if a == k]
    order = pred.burst_order.get(k)
    return burst if order is None else [burst[i] for i in order]


def _stage_sends(sched: _Schedule, dev: str, outputs, sends: list[tuple[str, str]]) -> None:
    """A stage's sends after it runs: its messages to other devices (`sends`: (tensor, device), what it
    produced and what it passes on) as one burst in the order the cost model times them, placed where
    the first of its outputs that leaves appears; each graph output to the host where it appears."""
    sent = {t for t, _ in sends}
    for t in outputs:
        if t in sent and sends:
            for tensor, dst in sends:
                sched.send(dev, dst, tensor, tensor)
            sends = []
        if t in sched.graph.outputs:
            sched.send(dev, HOST, t, t)
    for tensor, dst in sends:  # the stage only passes tensors on
        sched.send(dev, dst, tensor, tensor)


def _spatial_steps(sched: _Schedule, stage: Stage, layout, keep_input: bool, order=None) -> None:
    """Scatter the stage input's rows from the stage's device to the first segment's tiles (then drop the
    whole input unless a later stage there reads it), run the segments with halo exchange between them,
    and gather the last segment's output whole on the stage's device under its graph name (so later
    stages and outputs use it as after a pipeline stage). A grid's tiles are boxes of rows and columns.
    `order`: the send order of each exchange that the prediction timed (Prediction.send_order), or None
    for tile order."""
    axes = stage.spatial.axes
    x, y = layout[0][0].input, layout[-1][0].output

    def whole(tensor: str) -> Box:
        return tuple((0, sched.graph.tensors[tensor].shape[ax]) for ax in axes)

    holders = [(stage.device, whole(x), x)]
    for j, (maps, tiles) in enumerate(layout):
        drop = {x} if j == 0 and not keep_input else set()
        _exchange(sched, maps.input, axes, holders, [(t.device, t.in_box, t.in_name) for t, _ in tiles], drop,
                  None if order is None else order[j])
        for t, _ in tiles:
            sched.steps[t.device] += [{"op": "run", "fragment": t.fid}, {"op": "free", "tensors": [t.in_name]}]
        holders = [(t.device, t.out_box, t.out_name) for t, _ in tiles]
    _exchange(sched, y, axes, holders, [(stage.device, whole(y), y)], order=None if order is None else order[-1])


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
    rank: tuple[int, int] = (0, 0)  # (holder index, need index) in the exchange's lists

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
    for e, (h, have, held) in enumerate(holders):
        for n, (r, need, target) in enumerate(needs):
            part = tuple((max(s, n0), min(e, n1)) for (s, e), (n0, n1) in zip(have, need))
            if any(b <= a for a, b in part):
                continue
            piece = target if part == need else _box_name(tensor, r, part)
            if h == r and part == have and piece != target:
                piece = held  # all of its own rows, one part among several: no copy
            out.append(_Move(h, r, held, have, part, piece, (e, n)))
    return out


def _exchange(sched: _Schedule, tensor: str, axes: tuple[int, ...], holders, needs, drop: set[str] = frozenset(),
              order=None) -> None:
    """Move boxes of `tensor` from holders (device, box, stored name) to needs (device, box, name to
    store): each holder sends every other device the part it has of that device's need (device to
    device, in need order, or per holder in `order`'s: the needs' indices, see order.py) before it
    receives, and slices its own; each receiver concatenates its pieces in order (see _assemble). Each
    device then frees what only this exchange used (graph-named tensors stay, except those in `drop`)."""
    moves = _moves(tensor, holders, needs)
    if order is not None:
        moves.sort(key=lambda m: (m.rank[0], order[m.rank[0]].index(m.rank[1])))
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
