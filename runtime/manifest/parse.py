"""Manifest JSON -> dataclasses, with one-line errors naming the manifest and the JSON location."""

from __future__ import annotations

import logging
import math
import os
import reprlib
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Iterable

from .. import MANIFEST_FORMAT, MANIFEST_VERSION
from ..errors import InputError
from ..providers import CPU_ONLY, Provider
from .generate import check_generate, parse_generate, parse_state
from .types import (GENERATE_VERSION, DTYPES, OBJECTIVES, Alternative, Concat, Device, Fallback, Fragment, Free, Link, Manifest, Network,
                    OutputSpec, RuntimeCosts, Recv, Region, Regions, Run, Send, Slice, Step, TensorSpec, Transfer)

__all__ = ["build_manifest", "Reader"]

logger = logging.getLogger(__name__)

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 80, 80, 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4
_show = _REPR.repr  # a value quoted in a message: bounded even for huge, deep or alias-shared values


def build_manifest(data: Any, path: str | Path) -> tuple[Manifest, "Reader"]:
    """Manifest from decoded JSON, checking keys, types and duplicates (the schedule is checked separately)."""
    r = Reader(Path(path))
    top = r.obj(data, "manifest")
    fmt, version = r.get(top, "format", "manifest"), r.get(top, "version", "manifest")
    if fmt != MANIFEST_FORMAT:
        r.fail("manifest", f"format is {_show(fmt)}, expected {MANIFEST_FORMAT!r}")
    if version not in (MANIFEST_VERSION, GENERATE_VERSION) or isinstance(version, bool):
        r.fail("manifest", f"unsupported version {_show(version)} (this runtime reads versions {MANIFEST_VERSION} "
                           f"and {GENERATE_VERSION})")
    generative = version == GENERATE_VERSION
    if generative != ("generate" in top):
        r.fail("manifest", f"version {version} {'needs a' if generative else 'takes no'} `generate` block")
    model = r.obj(r.get(top, "model", "manifest"), "model")
    model_path = Path(r.str(model, "path", "model"))
    devices = tuple(_device(r, d, f"devices[{i}]") for i, d in enumerate(r.list(top, "devices", "manifest")))
    manifest = Manifest(
        path=Path(path),
        model_path=model_path if model_path.is_absolute() else Path(os.path.normpath(Path(path).parent / model_path)),
        model_sha256=r.str(model, "sha256", "model"),
        inputs=tuple(_tensor(r, t, f"inputs[{i}]") for i, t in enumerate(r.list(top, "inputs", "manifest"))),
        outputs=tuple(_output(r, t, f"outputs[{i}]") for i, t in enumerate(r.list(top, "outputs", "manifest"))),
        devices=devices,
        network=_network(r, r.obj(r.get(top, "network", "manifest"), "network"), [d.name for d in devices]),
        fragments=_fragments(r, r.list(top, "fragments", "manifest"), generative),
        transfers=tuple(_transfer(r, t, f"transfers[{i}]") for i, t in enumerate(r.list(top, "transfers", "manifest"))),
        steps=_steps(r, r.obj(r.get(top, "steps", "manifest"), "steps")),
        predicted={} if top.get("predicted") is None else r.obj(top["predicted"], "predicted"),
        fallbacks=_fallbacks(r, top.get("fallbacks"), {d.name for d in devices}),
        alternatives=_alternatives(r, top.get("alternatives")),
        objective=_objective(top.get("plan")),
        generate=parse_generate(r, top["generate"]) if generative else None,
    )
    for where, names in (("devices", manifest.device_names), ("inputs", [t.name for t in manifest.inputs]),
                         ("outputs", [t.name for t in manifest.outputs])):
        dup = _first_duplicate(names)
        if dup is not None:
            r.fail(where, f"duplicate name {_show(dup)}")
    if generative:
        check_generate(r, manifest)
    return manifest, r


def _first_duplicate(names: Iterable[str]) -> str | None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            return n
        seen.add(n)
    return None


class Reader:
    """Typed access to decoded JSON; every failure names the manifest and the JSON location."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, problem: str):
        raise InputError(f"{self.path}: {where}: {problem}")

    def obj(self, value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"expected an object, got {type(value).__name__}")
        return value

    def get(self, d: dict, key: str, where: str) -> Any:
        if key not in d:
            self.fail(where, f"missing key {key!r}")
        return d[key]

    def str(self, d: dict, key: str, where: str) -> str:
        v = self.get(d, key, where)
        if not isinstance(v, str) or not v:
            self.fail(f"{where}.{key}", "expected a non-empty string")
        return v

    def int(self, d: dict, key: str, where: str, minimum: int | None = None) -> int:
        v = self.get(d, key, where)
        if not isinstance(v, int) or isinstance(v, bool) or (minimum is not None and v < minimum):
            self.fail(f"{where}.{key}", f"expected an integer{f' >= {minimum}' if minimum is not None else ''}, got {_show(v)}")
        return v

    def num(self, d: dict, key: str, where: str, positive: bool = False) -> float:
        v = self.get(d, key, where)
        if (not isinstance(v, (int, float)) or isinstance(v, bool) or not _finite(v) or v < 0
                or (positive and v == 0)):
            self.fail(f"{where}.{key}", f"expected a finite number {'> 0' if positive else '>= 0'}, got {_show(v)}")
        return float(v)

    def list(self, d: dict, key: str, where: str) -> list:
        v = self.get(d, key, where)
        if not isinstance(v, list):
            self.fail(f"{where}.{key}", "expected a list")
        return v

    def names(self, d: dict, key: str, where: str) -> tuple[str, ...]:
        v = self.list(d, key, where)
        if not all(isinstance(n, str) and n for n in v):
            self.fail(f"{where}.{key}", "expected a list of non-empty strings")
        return tuple(v)

    def shape(self, d: dict, where: str) -> tuple[int, ...]:
        v = self.list(d, "shape", where)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
            self.fail(f"{where}.shape", f"expected a list of integers >= 0, got {_show(v)}")
        return tuple(v)

    def dtype(self, d: dict, where: str) -> str:
        v = self.str(d, "dtype", where)
        if v not in DTYPES:
            self.fail(f"{where}.dtype", f"unknown dtype {_show(v)} (known: {', '.join(sorted(DTYPES))})")
        return v


def _finite(v: int | float) -> bool:
    """NaN and infinity (which Python's json reads) are not figures; nor is an integer beyond float range."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _tensor(r: Reader, d: Any, where: str) -> TensorSpec:
    d = r.obj(d, where)
    return TensorSpec(r.str(d, "name", where), r.shape(d, where), r.dtype(d, where))


def _output(r: Reader, d: Any, where: str) -> OutputSpec:
    t = _tensor(r, d, where)
    return OutputSpec(t.name, t.shape, t.dtype, r.str(d, "device", where))


def _device(r: Reader, d: Any, where: str) -> Device:
    d = r.obj(d, where)
    name = r.str(d, "name", where)
    if name.startswith("@"):
        r.fail(f"{where}.name", f"{_show(name)}: device names may not start with '@'")
    address = r.get(d, "address", where)
    if address is not None and not isinstance(address, str):
        r.fail(f"{where}.address", "expected a string or null")
    threads = r.int(d, "threads", where, minimum=1) if d.get("threads") is not None else None
    power = _pair(r, d, "power_w", ("idle", "busy"), where)
    radio = _pair(r, d, "radio_nj_per_byte", ("tx", "rx"), where)
    mode = r.str(d, "mode", where) if d.get("mode") is not None else None
    return Device(name, r.str(d, "profile", where), r.num(d, "memory_mb", where), address, threads,
                  *power, *radio, mode, _providers(r, d.get("providers"), f"{where}.providers"))


def _providers(r: Reader, raw: Any, where: str) -> tuple[Provider, ...]:
    """A device's optional `providers`: a non-empty list of {name, options?} objects, names unique, options a
    {string: string} object; absent or null: the CPU provider alone (manifests before providers existed)."""
    if raw is None:
        return CPU_ONLY
    if not isinstance(raw, list) or not raw:
        r.fail(where, "expected a non-empty list")
    out = []
    for i, entry in enumerate(raw):
        w = f"{where}[{i}]"
        entry = r.obj(entry, w)
        unknown = sorted(set(entry) - {"name", "options"})
        if unknown:
            r.fail(w, f"unknown key {_show(unknown[0])} (expected name, options)")
        options = r.obj(entry.get("options") or {}, f"{w}.options")
        if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in options.items()):
            r.fail(f"{w}.options", "expected an object of strings")
        out.append(Provider(r.str(entry, "name", w), tuple(options.items())))
    dup = _first_duplicate(p.name for p in out)
    if dup is not None:
        r.fail(where, f"{_show(dup)} is listed twice")
    return tuple(out)


def _pair(r: Reader, d: dict, key: str, names: tuple[str, str], where: str) -> tuple[float | None, float | None]:
    """An optional {name: number >= 0 or null} object of two figures (a device's power or radio energy)."""
    if d.get(key) is None:
        return None, None
    obj = r.obj(d[key], f"{where}.{key}")
    return tuple(None if obj.get(n) is None else r.num(obj, n, f"{where}.{key}") for n in names)


def _network(r: Reader, d: dict, devices: list[str]) -> Network:
    n_devices = len(devices)
    medium = r.str(d, "medium", "network")
    if medium not in ("switched", "shared"):
        r.fail("network.medium", f"expected 'switched' or 'shared', got {_show(medium)}")
    links = []
    for i, lk in enumerate(r.list(d, "links", "network")):
        w = f"network.links[{i}]"
        lk = r.obj(lk, w)
        links.append(Link(r.str(lk, "a", w), r.str(lk, "b", w), r.num(lk, "bandwidth_mbps", w, positive=True),
                          r.num(lk, "latency_ms", w)))
    if n_devices == 1 and r.get(d, "bandwidth_mbps", "network") is None and r.get(d, "latency_ms", "network") is None:
        # One device and no network: no device-to-device send can exist (the schedule check refuses a
        # device talking to itself), so "no hop" figures are never used to delay anything.
        return Network(math.inf, 0.0, medium, tuple(links), _costs(r, d.get("costs"), devices))
    return Network(r.num(d, "bandwidth_mbps", "network", positive=True), r.num(d, "latency_ms", "network"),
                   medium, tuple(links), _costs(r, d.get("costs"), devices))


_COST_KEYS = ("message_ms", "message_ms_per_mb", "request_ms")


def _costs(r: Reader, raw: Any, devices: list[str]) -> dict[str, RuntimeCosts]:
    """network.costs (optional): {device: {message_ms, message_ms_per_mb, request_ms}}, each a number >= 0,
    every key required, for devices of the manifest."""
    if raw is None:
        return {}
    out = {}
    for name, entry in r.obj(raw, "network.costs").items():
        where = f"network.costs.{name}"
        if name not in devices:
            r.fail("network.costs", f"{_show(name)} is not a device of the manifest")
        entry = r.obj(entry, where)
        unknown = sorted(set(entry) - set(_COST_KEYS))
        if unknown:
            r.fail(where, f"unknown key {_show(unknown[0])} (expected {', '.join(_COST_KEYS)})")
        out[name] = RuntimeCosts(*(r.num(entry, k, where) for k in _COST_KEYS))
    return out


def _fragments(r: Reader, items: list, generative: bool = False) -> dict[str, Fragment]:
    out: dict[str, Fragment] = {}
    for i, d in enumerate(items):
        w = f"fragments[{i}]"
        d = r.obj(d, w)
        if "state" in d and not generative:
            r.fail(f"{w}.state", "state belongs to a generative build (version 2)")
        frag = Fragment(r.str(d, "id", w), r.str(d, "device", w), r.str(d, "file", w), r.str(d, "sha256", w),
                        r.names(d, "inputs", w), r.names(d, "outputs", w), r.num(d, "predicted_ms", w),
                        parse_state(r, d.get("state"), f"{w}.state"))
        if frag.id in out:
            r.fail("fragments", f"duplicate fragment id {_show(frag.id)}")
        _check_inside(r, frag.file, f"{w}.file")
        out[frag.id] = frag
    return out


def _fallbacks(r: Reader, items: Any, devices: set[str]) -> tuple[Fallback, ...]:
    """The optional `fallbacks` list (absent in manifests compiled without --fallbacks): one entry per device
    the plan uses, each naming the manifest planned without it, or why there is none."""
    out: dict[str, Fallback] = {}
    for w, d in _entries(r, items, "fallbacks"):
        without = r.str(d, "without", w)
        if without not in devices:
            r.fail(f"{w}.without", f"unknown device {_show(without)}")
        if without in out:
            r.fail("fallbacks", f"two entries without device {_show(without)}")
        if r.get(d, "manifest", w) is None:
            error = d.get("error")
            if not isinstance(error, str) or not error or d.get("sha256") is not None:
                r.fail(w, "without a manifest, expected sha256 null and an error saying why")
            out[without] = Fallback(without, None, None, error)
            continue
        out[without] = Fallback(without, *_build_file(r, d, w))
    return tuple(out.values())


def _entries(r: Reader, items: Any, key: str) -> list[tuple[str, dict]]:
    """(where, object) of each entry of an optional list of objects under `key` (absent or null: none)."""
    if items is None:
        return []
    if not isinstance(items, list):
        r.fail(key, "expected a list")
    return [(f"{key}[{i}]", r.obj(d, f"{key}[{i}]")) for i, d in enumerate(items)]


def _objective(plan: Any) -> str | None:
    """What the plan was compiled for, from the free-form `plan` section when it says (run --adapt's default)."""
    objective = plan.get("objective") if isinstance(plan, dict) else None
    return objective if objective in OBJECTIVES else None


def _alternatives(r: Reader, items: Any) -> tuple[Alternative, ...]:
    """The optional `alternatives` list (absent in manifests compiled without --keep or --shifts): the other
    plans kept, best first, then the chosen plan's boundary shifts, each naming its manifest and repeating its
    strategy and predicted figures; a shift's optional `variant` says what it changes."""
    out: dict[str, Alternative] = {}
    for w, d in _entries(r, items, "alternatives"):
        file, sha = _build_file(r, d, w)
        if file in out:
            r.fail("alternatives", f"two entries name {_show(file)}")
        pred = r.obj(r.get(d, "predicted", w), f"{w}.predicted")
        energy = r.get(pred, "energy_mj", f"{w}.predicted")
        out[file] = Alternative(file, sha, r.str(d, "strategy", w), {
            "latency_ms": r.num(pred, "latency_ms", f"{w}.predicted"),
            "throughput_ips": r.num(pred, "throughput_ips", f"{w}.predicted"),
            "energy_mj": None if energy is None else r.num(pred, "energy_mj", f"{w}.predicted")},
            None if d.get("variant") is None else r.str(d, "variant", w))
    return tuple(out.values())


def _build_file(r: Reader, d: dict, w: str) -> tuple[str, str]:
    """An extra build's (fallback's or alternative's) manifest path, inside the build folder, and its sha256."""
    file = r.str(d, "manifest", w)
    _check_inside(r, file, f"{w}.manifest")
    sha = r.str(d, "sha256", w)
    if len(sha) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha):
        r.fail(f"{w}.sha256", "expected 64 hexadecimal digits")
    return file, sha.lower()


def _check_inside(r: Reader, file: str, where: str) -> None:
    """A fragment (or fallback or alternative manifest) file is named relative to the build folder and stays inside it: a
    manifest must not make a worker read (or the coordinator send) /etc/shadow or ../../secret.onnx."""
    p = PurePosixPath(file)
    if p.is_absolute() or PureWindowsPath(file).is_absolute() or ".." in p.parts or "\\" in file or "\0" in file:
        r.fail(where, f"{_show(file)} is not a path inside the build folder (relative, without '..')")


def _range(r: Reader, d: Any, where: str) -> Region:
    d = r.obj(d, where)
    region = Region(r.int(d, "axis", where), r.int(d, "start", where, 0), r.int(d, "stop", where, 0))
    if region.start >= region.stop:
        r.fail(where, f"start {region.start} must be < stop {region.stop}")
    return region


def _region(r: Reader, d: Any, where: str) -> Regions:
    """One range object, or a non-empty list of them on distinct axes (a box, e.g. a 2-D tile)."""
    if not isinstance(d, list):
        return _range(r, d, where)
    if not d:
        r.fail(where, "expected at least one range")
    ranges = tuple(_range(r, x, f"{where}[{i}]") for i, x in enumerate(d))
    axes = [x.axis for x in ranges]
    if len(set(axes)) != len(axes):
        r.fail(where, f"two ranges on one axis ({axes})")
    return ranges


def _transfer(r: Reader, d: Any, where: str) -> Transfer:
    d = r.obj(d, where)
    region = r.get(d, "region", where)
    return Transfer(r.str(d, "tensor", where), r.str(d, "src", where), r.str(d, "dst", where),
                    r.shape(d, where), r.dtype(d, where), r.int(d, "bytes", where, 0),
                    None if region is None else _region(r, region, f"{where}.region"))


_STEP_KEYS = {
    "run": ({"fragment"}, set()),
    "send": ({"tensor", "to"}, {"region", "as"}),
    "recv": ({"tensor", "from"}, set()),
    "slice": ({"tensor", "axis", "start", "stop", "as"}, set()),
    "concat": ({"parts", "axis", "as"}, set()),
    "free": ({"tensors"}, set()),
}


def _steps(r: Reader, d: dict) -> dict[str, tuple[Step, ...]]:
    out = {}
    for device, items in d.items():
        if not isinstance(items, list):
            r.fail(f"steps.{device}", "expected a list of steps")
        out[device] = tuple(_step(r, s, f"steps.{device}[{i}]") for i, s in enumerate(items))
    return out


def _step(r: Reader, d: Any, where: str) -> Step:
    d = r.obj(d, where)
    op = d.get("op")
    if not isinstance(op, str) or op not in _STEP_KEYS:
        r.fail(where, f"unknown op {_show(op)} (known: {', '.join(_STEP_KEYS)})")
    required, optional = _STEP_KEYS[op]
    extra = set(d) - required - optional - {"op"}
    if extra:
        r.fail(where, f"unknown key(s) {', '.join(sorted(map(repr, extra)))} for op {op!r}")
    if op == "run":
        return Run(r.str(d, "fragment", where))
    if op == "recv":
        return Recv(r.str(d, "tensor", where), r.str(d, "from", where))
    if op == "send":
        region = d.get("region")
        return Send(r.str(d, "tensor", where), r.str(d, "to", where),
                    None if region is None else _region(r, region, f"{where}.region"),
                    r.str(d, "as", where) if d.get("as") is not None else None)
    if op == "slice":
        sl = Slice(r.str(d, "tensor", where), r.int(d, "axis", where), r.int(d, "start", where, 0),
                   r.int(d, "stop", where, 0), r.str(d, "as", where))
        if sl.start >= sl.stop:
            r.fail(where, f"start {sl.start} must be < stop {sl.stop}")
        return sl
    if op == "concat":
        parts = r.names(d, "parts", where)
        if not parts:
            r.fail(f"{where}.parts", "expected at least one part")
        return Concat(parts, r.int(d, "axis", where), r.str(d, "as", where))
    return Free(r.names(d, "tensors", where))
