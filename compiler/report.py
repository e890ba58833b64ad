"""Reports: the stable JSON summaries of compile/inspect/simulate and their human-readable tables."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgec.runtime import MANIFEST_FORMAT
from edgec.runtime.errors import InputError
from edgec.runtime.manifest.types import (Alternative, Fallback, Manifest, Recv, Region, Regions, Send, Transfer,
                                          region_ranges)
from edgec.runtime.manifest.load import load_alternative, load_fallback, parse_manifest, read_manifest_json

from .errors import UserError
from .cost.memory import device_memory_bytes
from .plan.views import pareto_info, stages_view
from .plan_types import Plan
from .text import fit, table
from .units import MiB

__all__ = ["idle_devices_hint", "compile_summary", "format_compile", "inspect_summary", "format_inspect",
           "format_simulation", "ManifestFile", "load_manifest_json", "read_plan", "read_layer_names", "plan_summary",
           "format_plan"]


def compile_summary(result, outdir: Path, seconds: float) -> dict:
    """The `edgec compile --json` object (keys are stable; documented by docs/gen/jsonout.py)."""
    graph = result.ingested.graph
    plan, pred = result.chosen.plan, result.chosen.prediction
    frags = {f["device"]: [] for f in result.manifest["fragments"]}
    for f in result.manifest["fragments"]:
        frags[f["device"]].append(f["file"])
    devices = []
    need = device_memory_bytes(plan, graph, result.cost.generate)
    run_on = result.cluster if result.chosen.cost is None else result.chosen.cost.cluster  # its power modes
    for dev in run_on.devices:
        devices.append({"name": dev.name, "profile": dev.profile.name, "fragments": frags.get(dev.name, []),
                        "memory_mb": round(need.get(dev.name, 0) / MiB, 3),
                        "memory_available_mb": round(dev.usable_bytes / MiB, 3),
                        "predicted_busy_ms": round(pred.busy_ms.get(dev.name, 0.0), 4),
                        "predicted_energy_mj": _device_energy(pred, dev.name),
                        "mode": dev.run_mode})
    return {
        "manifest": str(Path(outdir) / "manifest.json"),
        "model": str(result.ingested.path),
        "strategy": result.chosen.strategy,
        "objective": plan.objective,
        "predicted_latency_ms": round(pred.latency_ms, 4),
        "predicted_throughput_ips": round(pred.throughput_ips, 4),
        "predicted_energy_mj": _rounded(pred.energy_mj),
        "energy": None if pred.energy is None else pred.energy.to_dict(),
        "bytes_transferred": pred.bytes_transferred,
        "compile_seconds": round(seconds, 3),
        "timings": {k: round(v, 4) for k, v in result.timings.items()},
        "layers": len(graph.layers),
        "blocks": len(graph.blocks),
        "devices": devices,
        "stages": stages_view(plan, [layer.name for layer in graph.layers]),
        "candidates": result.manifest["candidates"],
        "runners_up": result.manifest["runners_up"],
        "fallbacks": [_fallback_summary(b, Path(outdir)) for b in result.fallbacks],
        "alternatives": [_alternative_summary(b, Path(outdir)) for b in result.alternatives],
        "alternatives_missing": result.alternatives_missing,
        "planning": [_planning(c) for c in result.candidates],
        **(_pareto_summary(result) if result.pareto is not None else {}),
        **(_generate_summary(pred.generation) if pred.generation is not None else {}),
    }


def _generate_summary(g: dict) -> dict:
    """compile --generate's keys: the per-token figures (cost/evaluate.py _per_token) and what they are priced at."""
    return {"predicted_tokens_per_s": round(g["tokens_per_s"], 4), "predicted_tpot_ms": round(g["tpot_ms"], 4),
            "predicted_ttft_ms": round(g["ttft_ms"], 4),
            "generate": {"prompt_len": g["prompt_len"], "max_context": g["max_context"],
                         "priced_past": g["priced_past"], "token_ms": round(g["token_ms"], 4)}}


def _pareto_summary(result) -> dict:
    """compile --pareto's keys (plan/views.py pareto_info)."""

    return pareto_info(result.pareto, result.pareto_energy, result.ingested.graph)


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _device_energy(pred, device: str) -> float | None:
    """A device's energy per request: None when the plan leaves it out or its power is unknown."""
    e = None if pred.energy is None else pred.energy.devices.get(device)
    return None if e is None else round(e.total_mj, 4)


def _energy_text(mj: float | None) -> str:
    return "energy unknown (a device has no power_w)" if mj is None else f"{mj:.3f} mJ"


def _planning(c) -> dict:
    """One planner's search figures (compiler/plan/stats.py UNITS names the units of `work`). `group`: the
    planners that ran together and share these figures (auto's spatial and hybrid share their searches)."""
    stats = c.stats or {"seconds": 0.0, "group": [c.strategy], "work": {}, "detail": {}}
    return {"strategy": c.strategy, "seconds": round(stats["seconds"], 4), "group": list(stats["group"]),
            "work": dict(stats["work"]), "detail": dict(stats["detail"])}


def _fallback_summary(build, outdir: Path) -> dict:
    """One --fallbacks build: where it is and what it predicts, or why there is none."""
    without = build.info["without"]
    if build.manifest is None:
        return {"without": without, "manifest": None, "error": build.error}
    return {"without": without, "manifest": str(outdir / build.folder / "manifest.json"), "error": None,
            **_build_plan(build.manifest)}


def _alternative_summary(build, outdir: Path) -> dict:
    """One alternative build (--keep or --shifts): where it is, what it predicts and, for a boundary shift of
    the chosen plan, what it changes (`variant`; None for a --keep plan)."""
    return {"manifest": str(outdir / build.folder / "manifest.json"), **_build_plan(build.manifest),
            "predicted_energy_mj": build.manifest["predicted"].get("energy_mj"), "variant": build.info.get("variant")}


def _build_plan(m: dict) -> dict:
    """An extra build's strategy, working devices and predictions, from its manifest."""
    return {"strategy": m["plan"]["strategy"], "devices": [d for d, steps in m["steps"].items() if steps],
            "predicted_latency_ms": m["predicted"]["latency_ms"],
            "predicted_throughput_ips": m["predicted"]["throughput_ips"]}


def format_compile(s: dict) -> str:
    rows = [[c["strategy"], c["latency_ms"], c["throughput_ips"], "chosen" if c["strategy"] == s["strategy"] else
             ("" if c["feasible"] else "pruned" if c.get("pruned") else "infeasible")] for c in s["candidates"]]
    dev_rows = [[d["name"], d["profile"], ", ".join(d["fragments"]) or "-", d["memory_mb"], d["memory_available_mb"],
                 d["predicted_busy_ms"], d.get("predicted_energy_mj"), d.get("mode")] for d in s["devices"]]
    stage_rows = [[i, st["device"], f"{st['layers'][0]}-{st['layers'][1] - 1}", st["first_layer"], st["last_layer"],
                   _tiling(st)] for i, st in enumerate(s["stages"])]
    return fit("\n\n".join([
        f"{s['model']}: {s['layers']} layers in {s['blocks']} serial blocks; objective {s['objective']}",
        table(["strategy", "latency ms", "throughput/s", ""], rows),
        table(["stage", "device", "layers", "first", "last", "tiles"], stage_rows),
        table(["device", "profile", "fragments", "memory MB", "available MB", "busy ms", "energy mJ", "mode"], dev_rows),
        f"predicted latency {s['predicted_latency_ms']:.3f} ms, throughput {s['predicted_throughput_ips']:.3f}/s, "
        f"{_energy_text(s.get('predicted_energy_mj'))} per input, "
        f"{s['bytes_transferred']} bytes transferred per input; compiled in {s['compile_seconds']:.2f} s\n"
        f"wrote {s['manifest']}",
        *([_generate_text(s)] if "predicted_tokens_per_s" in s else []),
        *([_fallback_table(s["fallbacks"])] if s.get("fallbacks") else []),
        *([_alternative_table(s["alternatives"])] if s.get("alternatives") else []),
        *([f"--keep: {s['alternatives_missing']} fewer alternative(s) than asked: no more plans of the frontier qualify"]
          if s.get("alternatives_missing") else []),
        *([_pareto_table(s)] if "pareto" in s else []),
    ]))


def _generate_text(s: dict) -> str:
    g = s["generate"]
    return (f"generation: {s['predicted_tokens_per_s']:.2f} tokens/s with sequences in flight, "
            f"{s['predicted_tpot_ms']:.3f} ms per output token for one, first token after {s['predicted_ttft_ms']:.3f} ms "
            f"(prompt {g['prompt_len']}); decode steps priced at past {g['priced_past']}, caches counted at "
            f"max context {g['max_context']}")


# Why the objective's best plan leaves devices out, as the hint after compile says it.
_IDLE_WHY = {
    "latency": "the plans found using them predict slower requests (transfers outweigh shared compute); "
               "--objective throughput plans for streamed requests",
    "throughput": "no plan found using them predicts more requests per second",
    "energy": "leaving them out predicts the least energy within --sla-ms",
}


def idle_devices_hint(s: dict) -> str | None:
    """One short line when the chosen plan leaves devices of the cluster idle: which, and why the objective
    chose so. None when the plan uses every device."""
    idle = [d["name"] for d in s["devices"] if not d["fragments"]]
    if not idle:
        return None
    names = ", ".join(idle[:3]) + (f" and {len(idle) - 3} more" if len(idle) > 3 else "")
    ran = s.get("candidates") or []
    why = (_IDLE_WHY[s["objective"]] if len(ran) != 1 else
           f"--strategy {s['strategy']} planned it so (--strategy auto weighs every planner's plans)")
    return f"{len(idle)} of {len(s['devices'])} devices idle ({names}): {why}"


def _alternative_table(alternatives: list[dict]) -> str:
    """The alternative plans (compile --keep and --shifts, inspect of a manifest that has them), in order."""
    rows = [[a.get("strategy") or "-", a.get("variant"), ", ".join(a.get("devices") or []) or "-",
             a.get("predicted_latency_ms"), a.get("predicted_throughput_ips"), a.get("predicted_energy_mj"),
             a["manifest"] if not a.get("error") else f"broken: {a['error']}"] for a in alternatives]
    return "alternative plans (compile --keep and --shifts; each folder is a build `edgec run` runs):\n" + table(
        ["strategy", "variant", "devices", "latency ms", "throughput/s", "energy mJ", "manifest"], rows)


def _pareto_table(s: dict) -> str:
    """compile --pareto's frontier, one row per plan: its strategy, devices in stage order and figures."""
    rows = [[p["strategy"], " > ".join(st["device"] for st in p["stages"]), p["predicted_latency_ms"],
             p["predicted_throughput_ips"], p["predicted_energy_mj"]] for p in s["pareto"]]
    note = " (energy left out: a device has no power_w)" if s["pareto_energy_unknown"] else ""
    return f"Pareto frontier over {', '.join(s['pareto_axes'])}{note}:\n" + table(
        ["strategy", "stages", "latency ms", "throughput/s", "energy mJ"], rows)


def _fallback_table(fallbacks: list[dict]) -> str:
    """The fallback plans (compile --fallbacks, inspect of a manifest that has them), one row each."""
    rows = [[f["without"], f.get("strategy") or "-", ", ".join(f.get("devices") or []) or "-",
             f.get("predicted_latency_ms"), f.get("predicted_throughput_ips"), f["manifest"] or f"none: {f['error']}"]
            for f in fallbacks]
    return "fallback plans (used by `edgec run` when a device stops answering):\n" + table(
        ["without", "strategy", "devices", "latency ms", "throughput/s", "manifest"], rows)


def _tiling(st: dict) -> str:
    """A stage's spatial structure in one cell: per segment, its layers and each device's rows."""
    sp = st.get("spatial")
    if not sp:
        return "-"
    segs = ["L{}-{} ".format(g["layers"][0], g["layers"][1] - 1)
            + " ".join(f"{t['device']}[{_span(t)}]" for t in g["tiles"]) for g in sp["segments"]]
    return f"{_axis(sp)}: " + "; ".join(segs)


def _span(tile: dict) -> str:
    return _span_text(tile["rows"], tile.get("cols"))


def _span_text(rows, cols) -> str:
    """A tile's rows "a:b", or a grid tile's rows and columns "a:b,c:d"."""
    (a, b) = rows
    return f"{a}:{b}" if cols is None else f"{a}:{b},{cols[0]}:{cols[1]}"


def _axis(sp: dict) -> str:
    return _axis_text(sp["axis"], any(t.get("cols") is not None for g in sp["segments"] for t in g["tiles"]))


def _axis_text(axis: str, grid: bool) -> str:
    """A spatial stage's tiled axis; a grid (tiles with columns) cuts height and width."""
    return "height x width" if grid else axis


def inspect_summary(ing, cost) -> dict:
    g = ing.graph
    layers = []
    for layer in g.layers:
        entry = {"index": layer.index, "name": layer.name, "ops": list(layer.op_types), "class": layer.cost_class,
                 "spatial_type": layer.spatial_type, "flops": layer.flops, "param_bytes": layer.param_bytes,
                 "input_bytes": layer.input_bytes, "output_bytes": layer.output_bytes,
                 "outputs": [{"name": t, "shape": list(g.tensors[t].shape)} for t in layer.outputs if t in g.tensors]}
        if cost is not None:
            entry["ms"] = {d: round(float(cost.layer_ms[layer.index, j]), 5) for j, d in enumerate(cost.devices)}
            entry["memory_bytes"] = layer.param_bytes + g.footprint_bytes[layer.index]
        layers.append(entry)
    out = {"model": str(ing.path), "sha256": ing.sha256, "inputs": list(g.inputs), "outputs": list(g.outputs),
           "total_flops": g.total_flops, "total_param_bytes": g.total_param_bytes, "block_cuts": list(g.block_cuts),
           "pipeline_cuts": [{"cut": c, "tensors": list(g.live_across(c))} for c in g.pipeline_cuts], "layers": layers}
    if cost is not None:
        out["devices"] = [{"name": d, "measured": m, "total_ms": round(float(cost.layer_ms[:, j].sum()), 4)}
                          for j, (d, m) in enumerate(zip(cost.devices, cost.measured))]
    return out


def format_inspect(s: dict) -> str:
    devs = [d["name"] for d in s.get("devices", [])]
    rows = [[l["index"], l["name"][:32], "+".join(l["ops"])[:28], l["class"], l["spatial_type"], l["flops"] / 1e6,
             l["param_bytes"] / MiB, l["output_bytes"] / MiB, *[l["ms"][d] for d in devs]] for l in s["layers"]]
    head = f"{s['model']}: {len(s['layers'])} layers, {s['total_flops'] / 1e9:.3f} GFLOP, {s['total_param_bytes'] / MiB:.1f} MB of weights"
    body = table(["#", "layer", "ops", "class", "type", "MFLOP", "param MB", "out MB", *[f"{d} ms" for d in devs]], rows)
    cuts = s["block_cuts"]
    head += f"\nblock cuts: {', '.join(map(str, cuts)) or 'none'} ({len(cuts) + 1} serial blocks)"
    several = [f"{c['cut']} ({' + '.join(c['tensors'])})" for c in s.get("pipeline_cuts", []) if len(c["tensors"]) > 1]
    if several:
        head += f"\npipeline cuts carrying several tensors: {', '.join(several)}"
    tail = "\n".join(f"{d['name']}: {d['total_ms']:.3f} ms for the whole model" + (" (measured)" if d["measured"] else "")
                     for d in s.get("devices", []))
    return fit("\n".join(x for x in (head, body, tail) if x))


@dataclass(frozen=True)
class ManifestFile:
    """A manifest read for inspect and simulate: the runtime's parsed Manifest, and what the runtime does not
    keep as written: the model's path as recorded (Manifest.model_path is resolved), the `plan` section
    (free-form to the runtime; read_plan reads it) and the layer names it indexes."""

    manifest: Manifest
    model_path: str
    plan: Any
    layers: Any = None  # the manifest's `layers`: the names its plan's lo and hi index (read_layer_names)


class _PlanReader:
    """Checks of what inspect reads beside the runtime's schema; the first thing that does not fit is a
    UserError naming the manifest and the JSON location."""

    def __init__(self, path: Path):
        self.path = path

    def need(self, ok: bool, where: str, what: str) -> None:
        if not ok:
            raise UserError(f"not a valid edgec manifest: {where}: expected {what}", str(self.path))

    def obj(self, v: Any, where: str, what: str = "an object") -> dict:
        self.need(isinstance(v, dict), where, what)
        return v


def read_plan(data: Any, path: Path) -> Plan:
    """The plan section `data` of the manifest at `path` (Plan.to_dict), read back by Plan.from_dict;
    UserError at the first thing that does not fit. The runtime ignores this section, so this is its only
    check."""
    try:
        return Plan.from_dict(data)
    except ValueError as exc:
        raise UserError(f"not a valid edgec manifest: {exc}", str(path)) from None


def read_layer_names(data: Any, plan: Plan, path: Path) -> list[str]:
    """The manifest's `layers` (the layer names its plan's lo and hi index); UserError when it is not a
    list of strings covering every layer the plan names."""
    _PlanReader(path).need(isinstance(data, list) and all(isinstance(n, str) for n in data)
                           and len(data) >= max(s.hi for s in plan.stages), "layers",
                           "a list of the model's layer names, one per layer the plan places")
    return data


def read_predicted_energy(predicted: dict, path: Path) -> dict[str | None, float | None]:
    """The manifest's predicted energy per request (key None) and per device (by name), each a number >= 0 or
    None (unknown); UserError at the first value that is not. The runtime does not read these figures."""
    r = _PlanReader(path)

    def mj(d: dict, where: str) -> float | None:
        v = d.get("energy_mj")
        r.need(v is None or (type(v) in (int, float) and math.isfinite(v) and v >= 0), f"{where}.energy_mj",
               "a number >= 0 or null")
        return v

    out: dict[str | None, float | None] = {None: mj(predicted, "predicted")}
    devices = r.obj(predicted.get("devices", {}), "predicted.devices")
    for name, entry in devices.items():
        out[name] = mj(r.obj(entry, f"predicted.devices.{name}"), f"predicted.devices.{name}")
    return out


def _exchange_kind(t: Transfer, passed_on: set[tuple[str, str, str]]) -> str:
    """scatter: rows of a whole tensor to a tile; halo: rows of one tile to a neighbour; gather: a whole
    tile to the device that assembles the tensor; transfer: a whole tensor between pipeline stages;
    forward: a whole tensor that a pipeline stage received and passes on (`_passed_on`)."""
    tiled = "@" in t.tensor
    if t.region is not None:
        return "halo" if tiled else "scatter"
    if tiled:
        return "gather"
    return "forward" if (t.src, t.dst, t.tensor) in passed_on else "transfer"


def _passed_on(m: Manifest) -> set[tuple[str, str, str]]:
    """(src, dst, tensor) of every send of a tensor its sender received, under the same name."""
    received = {(dev, s.tensor) for dev, steps in m.steps.items() for s in steps if isinstance(s, Recv)}
    return {(dev, s.to, s.tensor) for dev, steps in m.steps.items() for s in steps
            if isinstance(s, Send) and s.name == s.tensor and (dev, s.tensor) in received}


def _region_json(region: Regions | None) -> dict | list | None:
    """A region as the manifest writes it: one range object, or a list of them (a box)."""
    if region is None:
        return None
    ranges = [{"axis": x.axis, "start": x.start, "stop": x.stop} for x in region_ranges(region)]
    return ranges[0] if isinstance(region, Region) else ranges


def plan_summary(doc: ManifestFile) -> dict:
    """What a manifest's plan does: stages, each spatial segment's tiles (device, rows, fragment) and
    every tensor that crosses a link, classified (scatter, halo, gather, transfer, forward): all the
    tensors of a cut that carries several, one row each."""
    m = doc.manifest
    plan = read_plan(doc.plan, m.path)
    stages = stages_view(plan, read_layer_names(doc.layers, plan, m.path))
    by_device: dict[str, list] = {}
    for f in m.fragments.values():
        by_device.setdefault(f.device, []).append(f)
    tiles = []
    for si, st in enumerate(plan.stages):
        for gi, seg in enumerate(st.spatial.segments if st.spatial else ()):
            for t in seg.tiles:
                suffix = f"@{t.device}[{_span_text((t.start, t.stop), t.cols)}]"
                frag = next((f.id for f in by_device.get(t.device, [])
                             if any(o.endswith(suffix) for o in f.outputs) and f.id.startswith(f"f{si}s{gi}t")), None)
                entry = {"stage": si, "segment": gi, "layers": [seg.lo, seg.hi], "axis": _axis(stages[si]["spatial"]),
                         "device": t.device, "rows": [t.start, t.stop], "fragment": frag}
                tiles.append(entry | ({"cols": list(t.cols)} if t.cols is not None else {}))
    energy = read_predicted_energy(m.predicted, m.path)
    passed_on = _passed_on(m)
    exchanges = [{"kind": _exchange_kind(t, passed_on), "src": t.src, "dst": t.dst, "tensor": t.tensor,
                  "region": _region_json(t.region), "bytes": t.bytes} for t in m.transfers]
    totals: dict[str, int] = {}
    for e in exchanges:
        totals[e["kind"]] = totals.get(e["kind"], 0) + e["bytes"]
    return {"manifest": str(m.path), "model": doc.model_path, "strategy": plan.strategy,
            "stages": stages,
            "tiles": tiles, "exchanges": exchanges, "bytes_by_kind": totals, "predicted": m.predicted,
            "predicted_energy_mj": energy.get(None),
            "devices": [{"name": d.name, "profile": d.profile, "mode": d.mode, "predicted_energy_mj": energy.get(d.name)}
                        for d in m.devices],
            "fallbacks": _listed_fallbacks(m),
            "alternatives": [_listed_alternative(a, replace(m, path=m.path.absolute())) for a in m.alternatives]}


def _listed_fallbacks(m: Manifest) -> list[dict]:
    main = replace(m, path=m.path.absolute())  # the fallbacks' errors name the manifest by its absolute path
    return [_listed_fallback(fb, main) for fb in m.fallbacks]


def _listed_fallback(fb: Fallback, main: Manifest) -> dict:
    """A manifest's fallback entry for inspect, with the fallback's plan read from its manifest: its
    strategy, working devices and predictions; `error` says when that file is missing or not the one
    recorded (the runtime, which checks the same, would refuse to run the build)."""
    out = {"without": fb.without, "manifest": fb.manifest, "sha256": fb.sha256, "error": fb.error}
    if fb.manifest is None:
        return out
    try:
        m = load_fallback(main, fb, check_files=False)
    except InputError as exc:
        return out | {"error": str(exc)}
    return out | {"strategy": (read_manifest_json(m.path).get("plan") or {}).get("strategy"),
                  "devices": [d for d in m.device_names if m.steps.get(d)],
                  "predicted_latency_ms": m.predicted.get("latency_ms"),
                  "predicted_throughput_ips": m.predicted.get("throughput_ips")}


def _listed_alternative(alt: Alternative, main: Manifest) -> dict:
    """A manifest's alternative entry for inspect, with the working devices read from its manifest; `error`
    says why the runtime would refuse it (load_alternative: outside the build folder, missing, not the one
    recorded, not a manifest it reads, or another model or devices); the entry's strategy and predictions
    are what the main manifest recorded."""
    out = {"manifest": alt.manifest, "sha256": alt.sha256, "strategy": alt.strategy, "variant": alt.variant,
           "predicted_latency_ms": alt.predicted["latency_ms"], "predicted_throughput_ips": alt.predicted["throughput_ips"],
           "predicted_energy_mj": alt.predicted["energy_mj"], "error": None}
    try:
        m = load_alternative(main, alt)
    except InputError as exc:
        return out | {"error": str(exc)}
    return out | {"devices": [d for d in m.device_names if m.steps.get(d)]}


def format_plan(s: dict) -> str:
    stage_rows = []
    for i, st in enumerate(s["stages"]):
        sp = st.get("spatial")
        how = (f"{len(sp['segments'])} segment(s) tiled by {_axis(sp)} over {', '.join(sp['devices'])}"
               if sp else "whole layers")
        stage_rows.append([i, st["device"], f"{st['layers'][0]}-{st['layers'][1] - 1}", st["first_layer"], st["last_layer"], how])
    grid = any("cols" in t for t in s["tiles"])
    cols = [[f"{t['cols'][0]}:{t['cols'][1]}" if "cols" in t else "all"] if grid else [] for t in s["tiles"]]
    tile_rows = [[t["stage"], t["segment"], f"{t['layers'][0]}-{t['layers'][1] - 1}", t["axis"], t["device"],
                  f"{t['rows'][0]}:{t['rows'][1]}", *c, t["fragment"]] for t, c in zip(s["tiles"], cols)]
    ex_rows = [[e["kind"], e["src"], e["dst"], e["tensor"], _region_text(e["region"]), e["bytes"]] for e in s["exchanges"]]
    parts = [f"{s['manifest']}: strategy {s['strategy']}, model {s['model']}",
             table(["stage", "device", "layers", "first", "last", "how"], stage_rows)]
    if tile_rows:
        heads = ["stage", "segment", "layers", "axis", "device", "rows", *(["cols"] if grid else []), "fragment"]
        parts.append(table(heads, tile_rows))
    if ex_rows:
        parts.append(table(["kind", "from", "to", "tensor", "region", "bytes"], ex_rows))
    parts.append("bytes per input: " + (", ".join(f"{k} {v}" for k, v in sorted(s["bytes_by_kind"].items())) or "none"))
    if any(d["mode"] or d["predicted_energy_mj"] is not None for d in s.get("devices", [])):
        parts.append(table(["device", "profile", "mode", "energy mJ"],
                           [[d["name"], d["profile"], d["mode"] or "-", d["predicted_energy_mj"]] for d in s["devices"]]))
        parts.append(f"predicted energy per input: {_energy_text(s.get('predicted_energy_mj'))}")
    if s.get("fallbacks"):
        parts.append(_fallback_table([f | {"manifest": f["manifest"] if f["error"] is None else None}
                                      for f in s["fallbacks"]]))
    if s.get("alternatives"):
        parts.append(_alternative_table(s["alternatives"]))
    return fit("\n\n".join(parts))


def _region_text(region: dict | list | None) -> str:
    """ "H a:b", "W a:b", or a box's ranges "H a:b W c:d"; "all" for the whole tensor."""
    if region is None:
        return "all"
    return " ".join(f"{'H' if r['axis'] == 2 else 'W'} {r['start']}:{r['stop']}"
                    for r in (region if isinstance(region, list) else [region]))


def format_simulation(sim: dict) -> str:
    rows = [[e["device"], e["kind"], e["what"], e["start_ms"], e["end_ms"]] for e in sim["timeline"]]
    devs = [[d, v["busy_ms"], v["finish_ms"], v.get("predicted_energy_mj")] for d, v in sim["devices"].items()]
    return fit("\n\n".join([
        table(["device", "kind", "what", "start ms", "end ms"], rows),
        table(["device", "busy ms", "finish ms", "energy mJ"], devs),
        f"predicted latency {sim['latency_ms']:.3f} ms, {_energy_text(sim.get('predicted_energy_mj'))} per input; "
        f"{sim['bytes_transferred']} bytes between devices per input",
    ]))


def load_manifest_json(path: Path) -> ManifestFile:
    """A manifest for inspect and simulate, read under the runtime's size and depth limits and parsed and
    validated by the runtime (schema and schedule; the fragment files are not read)."""
    if not Path(path).exists():  # the compiler's wording, which `edgec inspect/simulate` users know
        raise UserError("no such manifest", str(path))
    try:
        data = read_manifest_json(path)
    except InputError as exc:  # its message already names the file
        raise UserError(str(exc)) from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise UserError("not an edgec manifest (format is not edgec.manifest)", str(path))
    try:  # the runtime owns the schema: inspect and simulate read only manifests that it would run
        manifest = parse_manifest(data, path)
    except InputError as exc:
        raise UserError(str(exc)) from None
    return ManifestFile(manifest, data["model"]["path"], data.get("plan"), data.get("layers"))
