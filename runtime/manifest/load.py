"""The edgec manifest (format "edgec.manifest", version 1; version 2 for a generative build): loading, validation, and the JSON written back.
The schema is documented here; its dataclasses are in types.py, the parser in parse.py.

manifest.json is a UTF-8 JSON object (written with sorted keys). Relative paths are relative to the
folder that holds manifest.json. Keys (all required unless marked optional; unknown top-level keys
are ignored):

  format      "edgec.manifest"
  version     1, or 2 for a generative build (`edgec compile --generate`: the keys below plus `generate` and
              each fragment's `state`; a runtime that reads only version 1 refuses it, since it would feed
              the caches from the host and run one pass). A version-2 manifest describes one step of a
              sequence: prefill (all the prompt's tokens) or decode (one token); `inputs`, `outputs` and the
              steps are the step's, with the shapes of a decode step at generate.priced_past.
  model       {"path": str, "sha256": hex str}: the source model, used only by `--verify`.
  inputs      [{"name": str, "shape": [int >= 0, ...], "dtype": str}]: the model inputs the host feeds.
              dtype is a numpy name: float16 float32 float64 int8 int16 int32 int64 uint8 uint16 uint32
              uint64 bool.
  outputs     [{"name": str, "shape": [...], "dtype": str, "device": str}]: the model outputs and the
              device that sends each one to the host (the received arrays must match shape and dtype).
  devices     [{"name": str, "profile": str, "memory_mb": number, "address": str or null}]. Names are
              unique and must not start with "@" ("@host" is the coordinator). `address`
              (tcp://HOST:PORT) is where `edgec run` reaches the device's `edgec worker`; a device
              without one runs in a worker process that `edgec run` starts on this machine. An
              optional `"threads": int >= 1` is the intra-op thread count the plan priced the device at;
              a local worker runs that many unless `edgec run --threads` says otherwise. An optional
              "providers": [{"name": str, "options": {str: str}}, ...] (non-empty, names unique) lists the
              onnxruntime execution providers its sessions are created with, in order (absent: the CPU's
              alone); a worker whose onnxruntime lacks one is refused at the start (runtime/providers.py).
              Optional, informational (the runtime does not act on them; `edgec simulate` prices energy
              with them): "power_w": {"idle", "busy": W >= 0 or null}, "radio_nj_per_byte": {"tx", "rx":
              nJ per byte >= 0 or null}, and "mode": str, the profile's power mode the device must run in
              for the predicted figures to hold (absent: the profile has one).
  network     {"bandwidth_mbps": number > 0, "latency_ms": number >= 0, "medium": "switched" | "shared",
               "links": [{"a": device, "b": device, "bandwidth_mbps": number > 0, "latency_ms": number >= 0}],
               optional "costs": {device: {"message_ms", "message_ms_per_mb", "request_ms": number >= 0}}}
              Megabits per second. A link entry (unordered pair) overrides the default for that pair.
              `costs` are the runtime's own costs each device's profile measured (`edgec profile`): a message
              between a and b adds the mean of their message_ms plus bytes / 1e6 x the mean of their
              message_ms_per_mb; a device without an entry costs 0.
              With exactly one device, bandwidth_mbps and latency_ms may both be null: there is no network
              (a cluster file without one); the runtime then treats every hop as free.
              Used only by `--emulate` (device/emulate.py, the planner's model): a device-to-device message takes
              bytes * 8 / (bandwidth_mbps * 1e6) s + latency_ms of its pair's link (x --dilate K); a device's
              consecutive sends leave one after another on its uplink ("switched") or on the one channel all
              devices share, first come first served ("shared"), and the device's next step waits for them;
              transfers to and from "@host" are not delayed.
  fragments   [{"id": str, "device": str, "file": str, "sha256": hex str, "inputs": [str], "outputs": [str],
                "predicted_ms": number >= 0}]: one ONNX file each; ids unique. `file` is a relative path
              inside the build folder (no "..", not absolute; it must not resolve outside the folder through
              a symbolic link either). `inputs`/`outputs` are the
              fragment's graph input/output names (the tensor-store names it reads and writes); `inputs`
              must equal the graph's inputs and `outputs` be among its outputs (checked when a worker
              loads it). `--emulate` pads each run of the fragment to `predicted_ms` (x --dilate K).
  transfers   [{"tensor": str, "src": device, "dst": device, "shape": [...], "dtype": str, "bytes": int >= 0,
                "region": null | region}]: a summary of the device-to-device sends: each entry names a send
              step (of `tensor` on src, to dst, with that region), whose shape and dtype it must match.
  region      the part of a tensor a send moves: one range {"axis": int, "start": int, "stop": int}
              (elements [start, stop) along axis), or a non-empty list of such ranges on distinct axes,
              the box they span (a 2-D tile: [{"axis": 2, ...}, {"axis": 3, ...}]; added after the first
              version-1 manifests, which only hold the single-range form: both forms parse).
  steps       {device: [step, ...]}: each device's program, executed in order once per request. A device
              without an entry does nothing. Step objects (no other keys allowed):
                {"op": "run", "fragment": id}        feed the fragment's inputs from the device's tensor
                                                     store; store its outputs under their names. The
                                                     fragment must belong to this device.
                {"op": "send", "tensor": t, "to": device | "@host", "region"?: region, "as"?: name}
                                                     send the stored tensor (or its region: the slice
                                                     [start:stop) along each range's axis); the receiver
                                                     stores it under `as` (default: t).
                {"op": "recv", "tensor": name, "from": device | "@host"}
                                                     wait for `name` of this request from that sender.
                {"op": "slice", "tensor": t, "axis": int, "start": int, "stop": int, "as": name}
                {"op": "concat", "parts": [names], "axis": int, "as": name}
                {"op": "free", "tensors": [names]}   drop tensors from the store.
              Region ranges and slices need 0 <= start < stop <= the axis's size;
              concat needs at least one part.
  fragments[].state  version 2 only, optional (a fragment whose layers hold no cache has none):
              [{"input": str, "output": str, "dtype": str, "shape": [int >= 0, ...], "axis": int,
                "max_length": int >= 1}]: the fragment's `output` at one step of a sequence is its `input` at
              the next, kept on the fragment's device (never sent, never a model input or output; each name
              the state of one fragment). Before a sequence's first step the input is empty: zeros of `shape`
              and `dtype`, whose `axis` (the growing one, the past length) is 0. It grows by the step's tokens
              along `axis`, to at most `max_length` (= generate.max_context). The schedule checks treat a
              state input as in the store when its fragment runs.
  generate    version 2 only, required: {"prompt_len": int >= 1, "max_context": int > prompt_len,
               "priced_past": int >= 0, "phases": {"prefill"|"decode": {"seq": int >= 1, "past": int >= 0}},
               "token": {"input": str, "dtype": str},
               "logits": {"output": str, "fragment": id}, "feeds": {input: "token" | "positions" | "mask"},
               "shapes": {tensor: [int >= 0 | "seq" | "past" | "total", ...]}}
              `prompt_len` and `max_context` are what the plan was priced for (the time to first token of a
              prompt of prompt_len; every cache counted in memory at max_context: a sequence may not grow
              beyond it), `priced_past` the past a decode step was priced at, (prompt_len + max_context - 1) //
              2 (the mean of one generation); `phases` the steps the plan was priced at (prefill: seq =
              prompt_len, past = 0; decode: seq = 1, past = priced_past; a sequence's steps may run at any seq and
              past with seq + past <= max_context). `logits` is the model output the token is chosen from and the
              fragment that gives it (on the last stage); the chosen token id goes back as `token.input`
              (shape [1, 1] at a decode step) to the first stage. `feeds` says how each model input of a step
              is made from the step's tokens (seq: how many, past: how many before them): "token" the token
              ids, "positions" past .. past + seq - 1 (int64, [1, seq]), "mask" ones of [1, past + seq] (int64).
              `shapes` gives each model input's, the logits' and each state tensor's dimensions: a fixed size,
              or the role of one that changes per step ("seq", "past", "total" = past + seq); the batch is 1.
  predicted   optional {"latency_ms": number, "throughput_ips": number, "devices": {device: {...}}};
              optional "energy_mj" (per request, null when a device has no power figures), and per
              device "energy_mj". A generative build's are per output token (latency_ms: a sequence's time per
              output token, throughput_ips: tokens per second with sequences in flight), and it adds "tpot_ms",
              "tokens_per_s", "ttft_ms" (the prefill of prompt_len tokens), "token_ms" (the token id's way back
              to the first stage), "priced_past", "prompt_len" and "max_context".
  plan        optional, free-form; the runtime reads only `plan.objective` when it is "latency", "throughput" or
              "energy" (what the plan was compiled for: `edgec run --adapt` re-costs kept plans by it). The
              compiler writes its Plan there (compiler/plan_types.py Plan.to_dict: strategy, objective, stages
              with layer indices lo/hi and spatial groups, modes), and beside it `candidates` (every planner's
              outcome and predicted figures), `runners_up` (the chosen planner's next-best plans) and
              `layers` (the layer names lo/hi index), which the runtime ignores too.
  fallbacks   optional (written by `edgec compile --fallbacks`; absent or null: none)
              [{"without": device, "manifest": str or null, "sha256": hex str or null, "error"?: str}]: for each
              device the plan uses, the plan of the same model on the cluster without that device. `manifest`
              is the fallback's manifest.json, a relative path inside the build folder (the compiler writes
              "fallback-<device>/manifest.json", a complete build of its own), and `sha256` that file's hash.
              When no plan fits the devices left, `manifest` and `sha256` are null and `error` says why.
              `edgec run` switches to a device's fallback when the device stops answering (see coordinator/failover.py).
  alternatives optional (written by `edgec compile --keep N` and `--shifts`; absent or null: none)
              [{"manifest": str, "sha256": hex str, "strategy": str,
                "predicted": {"latency_ms": number, "throughput_ips": number, "energy_mj": number or null},
                "variant"?: str or null}]:
              other plans of the same model on the same cluster: first the best N of the Pareto frontier
              after the chosen plan (--keep, best first by the compile's objective), then the chosen plan's
              boundary shifts (--shifts: one layer moved across one boundary between neighbouring pipeline
              stages, DGPAS's adjacent scheduling). `manifest` is a relative path inside the
              build folder (the compiler writes "alt-<k>/manifest.json", a complete build of its own that
              `edgec run` runs like any other), `sha256` that file's hash; `strategy` and `predicted` repeat
              what that manifest records. `variant` (optional; absent or null for a --keep plan) says in one
              human-readable line what a variant of the chosen plan changes, e.g. "shift stage 0|1 boundary
              +1 layer (layer 7 'conv3' to pi-a)": stages numbered from 0 as in `plan.stages`, +1 when stage
              k takes stage k+1's first layer, -1 when stage k+1 takes stage k's last. `load_alternative`
              loads one, checked against this manifest. `edgec run --adapt` switches between them (coordinator/adapt.py).

Validation (each failure is an InputError "<manifest path>: <problem>", one line): the file's size
(at most 64 MiB) and nesting (at most 64 levels); format and version; numbers finite;
missing keys and wrong types; duplicate device names, fragment ids, input or output names; a step that
names an unknown op, fragment, device or tensor (dataflow is checked in order: a tensor must be in the
device's store when a step reads it, and a name may not be stored twice without a free); every send
matches exactly one recv and vice versa, on (src, dst, name-as-received); a recv from "@host" names a
model input; every model output is sent to "@host" exactly once, by its declared device; in version 2,
the generate block against the rest (its token input is a model input fed "token", every model input has
a feed, the logits are a model output of the named fragment) and each state entry (an input and output of
its fragment, neither a model input nor output, of one fragment only, max_length <= max_context); the schedule
cannot deadlock (sends never block); each fragment file exists and matches its sha256 (checked before any
session loads it); and, when the coordinator loads a build (load_manifest with check_files, and every
fallback or alternative build loaded with check_files, as `edgec run` does before switching to one), every tensor against the fragments' own graph signatures (signatures.py):
each fragment input's shape and dtype as it reaches the device (a model input as `inputs` declares it, a
fragment output as its graph declares it, a received tensor as sent, cut by regions and slices, joined by
concats; a region or slice past the end of its axis is refused), each model output as `outputs` declares it,
and each `transfers` entry against the send it describes (src, dst, tensor and region), its shape, dtype and
bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Iterable

from .. import MANIFEST_FORMAT, MANIFEST_VERSION
from ..errors import InputError
from ..providers import CPU_ONLY
from .parse import build_manifest
from .types import (GENERATE_VERSION, Alternative, Concat, Fallback, Fragment, Generate, Manifest, Recv, Region,
                    Regions, Run, Send, Slice, StateSpec, Step, TensorSpec, region_ranges)
from .schedule import validate_schedule
from .signatures import check_signatures

__all__ = ["load_manifest", "load_fallback", "load_alternative", "read_manifest_json", "decode_manifest_json",
           "parse_manifest", "check_fragment_files", "check_fragment_paths", "file_sha256", "manifest_json",
           "MAX_MANIFEST_BYTES", "MAX_JSON_DEPTH"]

logger = logging.getLogger(__name__)

# A ResNet-50 manifest on four devices is about 1 MiB; 64 MiB leaves room for far larger plans while a
# wrong (or hostile) file of gigabytes is refused before it is read.
MAX_MANIFEST_BYTES = 64 << 20
# The compiler writes at most about 10 levels (plan.stages[].spatial.segments[].tiles[].rows).
MAX_JSON_DEPTH = 64


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_manifest(path: str | Path, *, check_files: bool = True, devices: Iterable[str] | None = None,
                  generative: bool = False) -> Manifest:
    """Read, parse and validate manifest.json; with check_files, verify fragment files (of `devices` only,
    when given) exist and match their sha256, and (all devices) that the manifest's tensors agree with the
    fragments' own graph inputs and outputs (signatures.py). A generative build (version 2) is refused unless
    the caller runs sequences step by step (`generative`): run as one pass per request, its caches would be
    missing."""
    path = Path(path).absolute()
    manifest = parse_manifest(read_manifest_json(path), path)
    if manifest.generate is not None and not generative:
        raise InputError(f"{path}: a generative build (compiled with --generate, manifest version 2) runs a "
                         "sequence step by step with its caches kept on the devices, not one pass per request")
    if check_files:
        check_fragment_files(manifest, devices)
        if devices is None:
            check_signatures(manifest)
    return manifest


def load_fallback(manifest: Manifest, fb: Fallback, *, check_files: bool = True) -> Manifest:
    """The fallback manifest `fb` of `manifest`, checked against it: the file lies inside the build folder and
    has the recorded sha256, and the plan runs the same model (inputs and outputs) on devices of `manifest`
    other than `fb.without`. With check_files, its fragment files are verified
    (see load_manifest); without, only that they exist, which is cheap enough to do before every run."""
    where = f"{manifest.path}: fallback without {fb.without}"
    if fb.manifest is None:
        raise InputError(f"{where}: none was compiled ({fb.error})")
    return _load_extra_build(manifest, fb.manifest, fb.sha256, where, "--fallbacks", fb.without, check_files)


def load_alternative(manifest: Manifest, alt: Alternative, *, check_files: bool = False) -> Manifest:
    """The alternative plan `alt` of `manifest` (compile --keep or --shifts), checked against it as
    load_fallback checks a fallback: inside the build folder, the recorded sha256, the same model (inputs
    and outputs), and only devices of `manifest`. With check_files, its fragment files are verified (see
    load_manifest); without (the default: cheap enough to list every alternative, as inspect does), only
    that they exist."""
    where = f"{manifest.path}: alternative {alt.manifest}"
    return _load_extra_build(manifest, alt.manifest, alt.sha256, where, "--keep or --shifts", None, check_files)


def _load_extra_build(main: Manifest, file: str, sha256: str, where: str, option: str, without: str | None,
                      check_files: bool) -> Manifest:
    """The build `file` (relative to `main`'s folder) that `main` lists as a fallback or an alternative: read
    from inside the build folder, with the recorded sha256, parsed, and planning the same model as `main` on
    its devices (but `without`). `where` names the entry in every error; `option` is the compile option that
    writes such builds."""
    path = main.folder / file
    try:
        inside = path.resolve().is_relative_to(main.folder.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise InputError(f"{where}: {file!r} is outside the build folder {main.folder}")
    try:
        raw = path.read_bytes()[:MAX_MANIFEST_BYTES + 1]
    except OSError as exc:
        raise InputError(f"{where}: cannot read {file} ({exc.strerror or exc}); compile again with "
                         f"{option}, or run without them") from None
    if hashlib.sha256(raw).hexdigest() != sha256:
        raise InputError(f"{where}: {file} sha256 mismatch; the file was changed after compiling")
    extra = parse_manifest(decode_manifest_json(raw, path), path.absolute())
    _check_same_model(main, extra, without, where)
    if check_files:
        check_fragment_files(extra)
        check_signatures(extra)
    else:
        check_fragment_paths(extra, extra.fragments.values())
        for frag in extra.fragments.values():
            if not extra.fragment_path(frag).is_file():
                raise InputError(f"{extra.path}: fragment {frag.id}: file {frag.file} not found in {extra.folder}")
    return extra


def _check_same_model(main: Manifest, extra: Manifest, without: str | None, where: str) -> None:
    """A request re-run on a fallback or an alternative must mean the same thing: same inputs and outputs,
    same model, on devices of `main` (but `without`)."""
    if extra.model_sha256 != main.model_sha256:
        raise InputError(f"{where}: plans another model (sha256 {extra.model_sha256[:12]}...)")
    if _specs(extra.inputs) != _specs(main.inputs) or _specs(extra.outputs) != _specs(main.outputs):
        raise InputError(f"{where}: its model inputs or outputs differ from this manifest's")
    known = {d.name for d in main.devices}
    for d in extra.devices:
        if d.name == without:
            raise InputError(f"{where}: names device {d.name!r}, which it must do without")
        if d.name not in known:
            raise InputError(f"{where}: names device {d.name!r}, not in this manifest")


def _specs(tensors: Iterable[TensorSpec]) -> list[tuple]:
    return [(t.name, t.shape, t.dtype) for t in tensors]


def read_manifest_json(path: str | Path) -> Any:
    """Decoded JSON of a manifest file, or InputError naming `path` as given. The file is refused unread
    beyond MAX_MANIFEST_BYTES, and JSON nested deeper than MAX_JSON_DEPTH is refused: the decoder
    recurses per level, and so would every later use of such a value (its repr in a message, say)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: manifest not found") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read manifest ({exc.strerror or exc})") from None
    return decode_manifest_json(raw, path)


def decode_manifest_json(raw: bytes, path: str | Path) -> Any:
    """Decoded JSON of a manifest's bytes (read from `path`, or received by a worker), with the same limits."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise InputError(f"{path}: manifest is larger than {MAX_MANIFEST_BYTES >> 20} MiB, the limit for a manifest")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: cannot read manifest ({exc})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except ValueError as exc:  # an integer literal beyond Python's digit limit
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested more than {MAX_JSON_DEPTH} levels deep") from None
    if _depth_exceeds(data, MAX_JSON_DEPTH):
        raise InputError(f"{path}: JSON nested more than {MAX_JSON_DEPTH} levels deep")
    return data


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether decoded JSON nests containers more than `limit` deep (iterative: no recursion to overflow)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > limit:
                return True
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def check_fragment_files(manifest: Manifest, devices: Iterable[str] | None = None) -> None:
    """Raise InputError unless every fragment file (of `devices`, when given) lies inside the build folder,
    exists and has its sha256. Messages name the file, never a hash of what it holds."""
    wanted = None if devices is None else set(devices)
    frags = [f for f in manifest.fragments.values() if wanted is None or f.device in wanted]
    check_fragment_paths(manifest, frags)
    for frag in frags:
        file = manifest.fragment_path(frag)
        if not file.is_file():
            raise InputError(f"{manifest.path}: fragment {frag.id}: file {frag.file} not found in {manifest.folder}")
        if file_sha256(file) != frag.sha256.lower():
            raise InputError(f"{manifest.path}: fragment {frag.id}: {frag.file} sha256 mismatch (the manifest "
                             f"expects {frag.sha256[:12]}...); the file was changed after compiling")


def check_fragment_paths(manifest: Manifest, frags: Iterable[Fragment]) -> None:
    """Every fragment file must resolve (symbolic links followed) to a path inside the build folder."""
    folder = manifest.folder.resolve()
    for frag in frags:
        try:
            inside = manifest.fragment_path(frag).resolve().is_relative_to(folder)
        except (OSError, RuntimeError):  # a symlink loop
            inside = False
        if not inside:
            raise InputError(f"{manifest.path}: fragment {frag.id}: file {frag.file!r} is outside the build "
                             f"folder {manifest.folder}")


def manifest_json(m: Manifest) -> bytes:
    """The manifest as JSON bytes that parse back to `m` (what a coordinator sends its workers)."""
    net = m.network
    no_network = net.bandwidth_mbps == float("inf")
    doc = {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION if m.generate is None else GENERATE_VERSION,
        "model": {"path": str(m.model_path), "sha256": m.model_sha256},
        "inputs": [_spec(t) for t in m.inputs],
        "outputs": [{**_spec(o), "device": o.device} for o in m.outputs],
        "devices": [{"name": d.name, "profile": d.profile, "memory_mb": d.memory_mb, "address": d.address}
                    | ({"threads": d.threads} if d.threads is not None else {})
                    | ({"providers": [p.to_json() for p in d.providers]} if d.providers != CPU_ONLY else {})
                    for d in m.devices],
        "network": {"bandwidth_mbps": None if no_network else net.bandwidth_mbps,
                    "latency_ms": None if no_network else net.latency_ms, "medium": net.medium,
                    "links": [{"a": lk.a, "b": lk.b, "bandwidth_mbps": lk.bandwidth_mbps, "latency_ms": lk.latency_ms}
                              for lk in net.links]}
                   | ({"costs": {d: vars(c) for d, c in net.costs.items()}} if net.costs else {}),
        "fragments": [{"id": f.id, "device": f.device, "file": f.file, "sha256": f.sha256, "inputs": list(f.inputs),
                       "outputs": list(f.outputs), "predicted_ms": f.predicted_ms}
                      | ({"state": [_state_json(st) for st in f.state]} if f.state else {})
                      for f in m.fragments.values()],
        "transfers": [{"tensor": t.tensor, "src": t.src, "dst": t.dst, "shape": list(t.shape), "dtype": t.dtype,
                       "bytes": t.bytes, "region": _region_json(t.region)} for t in m.transfers],
        "steps": {dev: [_step_json(s) for s in steps] for dev, steps in m.steps.items()},
        "predicted": m.predicted,
    }
    if m.generate is not None:
        doc["generate"] = _generate_json(m.generate)
    return json.dumps(doc, allow_nan=False).encode()


def _state_json(st: StateSpec) -> dict:
    return {"input": st.input, "output": st.output, "dtype": st.dtype, "shape": list(st.shape), "axis": st.axis,
            "max_length": st.max_length}


def _generate_json(g: Generate) -> dict:
    return {"prompt_len": g.prompt_len, "max_context": g.max_context, "priced_past": g.priced_past,
            "token": {"input": g.token_input, "dtype": g.token_dtype},
            "logits": {"output": g.logits_output, "fragment": g.logits_fragment}, "feeds": dict(g.feeds),
            "phases": {name: dict(pin) for name, pin in g.phases.items()},
            "shapes": {name: list(dims) for name, dims in g.shapes.items()}}


def _spec(t: TensorSpec) -> dict:
    return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}


def _region_json(region: Regions | None):
    if region is None:
        return None
    ranges = [{"axis": r.axis, "start": r.start, "stop": r.stop} for r in region_ranges(region)]
    return ranges[0] if isinstance(region, Region) else ranges


def _step_json(step: Step) -> dict:
    if isinstance(step, Run):
        return {"op": "run", "fragment": step.fragment}
    if isinstance(step, Recv):
        return {"op": "recv", "tensor": step.tensor, "from": step.src}
    if isinstance(step, Send):
        out = {"op": "send", "tensor": step.tensor, "to": step.to}
        if step.region is not None:
            out["region"] = _region_json(step.region)
        if step.as_name is not None:
            out["as"] = step.as_name
        return out
    if isinstance(step, Slice):
        return {"op": "slice", "tensor": step.tensor, "axis": step.axis, "start": step.start, "stop": step.stop,
                "as": step.as_name}
    if isinstance(step, Concat):
        return {"op": "concat", "parts": list(step.parts), "axis": step.axis, "as": step.as_name}
    return {"op": "free", "tensors": list(step.tensors)}


def parse_manifest(data: Any, path: str | Path) -> Manifest:
    """Build a Manifest from decoded JSON and validate it, schedule included (no file access)."""
    manifest, reader = build_manifest(data, path)
    validate_schedule(manifest, reader.fail)
    return manifest
