"""Per-node times of a real model (`edgec profile --model`): onnxruntime's profiler, mapped back to the
original graph's nodes (see the package docstring for the rules), on the CPU provider or, with `--providers`,
on an accelerator (claims.py says which nodes the CPU provider runs then, and how names map at basic)."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from edgec.runtime.errors import InputError, one_line
from edgec.runtime.manifest.load import file_sha256
from edgec.runtime.providers import CPU, Provider, ort_providers

from .timing import sig as _sig

__all__ = ["measure_layers", "measure_layers_on", "check_model", "node_keys", "kernel_events", "NodeMap", "node_map", "basic_graph",
           "ACCELERATED"]

_WARMUP = 2  # runs before the timed ones
ACCELERATED = "\x00accelerator"  # a run's accelerator time before it is shared among its nodes


def node_keys(model: onnx.ModelProto) -> list[str]:
    """Unique node names as edgec knows them: the node's own name, else `<op_type>_<index>` in the file;
    a repeat gets `_<index>` appended (again while it still repeats an earlier key). Measured per-node
    tables (`edgec profile --model`) use these keys, and the compiler's ingest names nodes by them."""
    keys, seen = [], set()
    for i, n in enumerate(model.graph.node):
        k = n.name or f"{n.op_type}_{i}"
        while k in seen:
            k = f"{k}_{i}"
        seen.add(k)
        keys.append(k)
    return keys


def _map_optimized(orig: onnx.ModelProto, keys: list[str], opt: onnx.ModelProto) -> dict[str, str]:
    """Optimised node name -> original node key (see the module docstring for the rules)."""
    names = set(keys)
    by_key = dict(zip(keys, orig.graph.node))
    producer: dict[str, str] = {}
    for k, n in zip(keys, orig.graph.node):
        for t in n.output:
            if t:
                producer[t] = k
    consumers: dict[str, list] = {}
    for n in opt.graph.node:
        for t in n.input:
            consumers.setdefault(t, []).append(n)

    def same_kind(a: str, b: str) -> bool:
        a, b = a.removeprefix("Fused"), b.removeprefix("Fused")
        return a == b

    def head_of_fusion(k: str, op_type: str) -> str:
        """A fused node named after its last output (e.g. Conv+Relu -> "<relu output>_nchwc") belongs
        to the operator that starts the fusion: walk up first inputs (at most 3 nodes) to a node of
        the optimised node's kind."""
        node, steps = by_key[k], 0
        while not same_kind(node.op_type, op_type) and steps < 3 and node.input and node.input[0] in producer:
            node_key = producer[node.input[0]]
            node, steps = by_key[node_key], steps + 1
            if same_kind(node.op_type, op_type):
                return node_key
        return k

    def direct(n) -> str | None:
        if n.name in names:
            return n.name
        head = n.name.split("/", 1)[0]
        if head in names:
            return head
        tensor = n.name[: -len("_nchwc")] if n.name.endswith("_nchwc") else None
        if tensor in producer:
            return head_of_fusion(producer[tensor], n.op_type)
        for t in n.output:
            if t in producer:
                return head_of_fusion(producer[t], n.op_type)
        return None

    mapping: dict[str, str] = {}
    for n in opt.graph.node:
        k = direct(n)
        if k is None:  # walk downstream to the first node that maps
            frontier, visited = list(n.output), set()
            while frontier and k is None:
                t = frontier.pop(0)
                for c in consumers.get(t, []):
                    if c.name in visited:
                        continue
                    visited.add(c.name)
                    k = direct(c)
                    if k is not None:
                        break
                    frontier.extend(c.output)
        mapping[n.name] = k if k is not None else n.name
    return mapping


_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class KernelEvent:
    """One kernel run of a profiler trace: onnxruntime's node name, its provider, its op type and its time."""

    name: str
    provider: str
    op_name: str
    ts: float
    dur_ms: float


def kernel_events(events: Iterable[dict]) -> Iterator[KernelEvent]:
    """The `<node>_kernel_time` events of a profiler trace (onnxruntime's JSON, as a list of dicts)."""
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith(_SUFFIX):
            continue
        args = e.get("args") or {}
        yield KernelEvent(name[: -len(_SUFFIX)], args.get("provider", CPU), args.get("op_name", ""),
                          float(e.get("ts", 0)), float(e.get("dur", 0)) / 1000.0)


@dataclass(frozen=True)
class NodeMap:
    """onnxruntime's node names at ORT_ENABLE_BASIC -> the original graph's node keys (nodes.node_keys)."""

    keys: tuple[str, ...]  # the original graph's, in file order
    names: dict[str, str]  # a named node of the basic-optimised graph -> its original key
    unnamed: dict[str, frozenset[str]]  # op type -> the keys of the unnamed nodes of that type

    def keys_of(self, event: KernelEvent) -> frozenset[str]:
        """The original nodes an event of the CPU provider ran (none when it maps to nothing of the graph)."""
        if event.name in self.names:
            return frozenset({self.names[event.name]})
        if event.name in self.keys:
            return frozenset({event.name})
        return self.unnamed.get(event.op_name, frozenset())


def node_map(model: onnx.ModelProto, keys: Sequence[str], basic: onnx.ModelProto) -> NodeMap:
    """The NodeMap of `model` (its nodes named by `keys`) from `basic`, its graph as a CPU-only session optimised
    it at ORT_ENABLE_BASIC."""
    basic = onnx.ModelProto.FromString(basic.SerializeToString())
    placeholder: dict[str, str] = {}
    for i, n in enumerate(basic.graph.node):
        if not n.name:  # a name of its own, which no key has, for _map_optimized
            n.name = f"\x00{n.op_type}\x00{i}"
            placeholder[n.name] = n.op_type
    mapping = _map_optimized(model, list(keys), basic)
    known = set(keys)
    names = {n: k for n, k in mapping.items() if n not in placeholder and k in known}
    unnamed: dict[str, set[str]] = {}
    for n, op in placeholder.items():
        if mapping.get(n) in known:
            unnamed.setdefault(op, set()).add(mapping[n])
    return NodeMap(tuple(keys), names, {op: frozenset(ks) for op, ks in unnamed.items()})


def basic_graph(data: bytes | str, tmp: str) -> onnx.ModelProto:
    """The graph a CPU-only session makes of the model (bytes or a path) at ORT_ENABLE_BASIC (its structure only)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = os.path.join(tmp, "basic.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "basic.weights")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(data, so, providers=[CPU])
    return onnx.load(os.path.join(tmp, "basic.onnx"), load_external_data=False)



def _feeds(sess: ort.InferenceSession, path: Path) -> dict[str, np.ndarray]:
    """Random float / zero integer inputs; symbolic or unknown dimensions become 1."""
    feeds = {}
    rng = np.random.default_rng(0)
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
        dtype = _ORT_TYPES.get(inp.type)
        if dtype is None:
            raise InputError(f"{path}: input {inp.name!r} has unsupported type {inp.type}")
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[inp.name] = np.zeros(shape, dtype=dtype)
    return feeds


def check_model(model_path: str | Path) -> None:
    """InputError (one line) unless the model is a file that onnxruntime loads and random inputs can be made
    for: what measure_layers needs, checked in a second or so before minutes of measuring."""
    path = Path(model_path)
    if not path.is_file():
        raise InputError(f"{path}: no such ONNX file")
    _, model = _read(path)
    keys = node_keys(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        if keys != [n.name for n in model.graph.node]:  # onnxruntime refuses repeated names: as measure_layers runs it
            named = onnx.load(str(path))
            for k, n in zip(keys, named.graph.node):
                n.name = k
            sess = ort.InferenceSession(named.SerializeToString(), so, providers=["CPUExecutionProvider"])
        else:
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except InputError:
        raise
    except Exception as e:  # onnxruntime's pybind errors, protobuf's, onnx's: no common base
        raise InputError(f"{path}: onnxruntime cannot load the model: {one_line(e, 200)}") from None
    _feeds(sess, path)


def _read(path: Path) -> tuple[str, onnx.ModelProto]:
    """(sha256 of the file, its graph without external weights), or InputError."""
    try:
        digest = file_sha256(path)
        model = onnx.load(str(path), load_external_data=False)  # graph structure only
    except OSError as e:
        raise InputError(f"{path}: cannot read model: {e.strerror or e}") from None
    except Exception as e:  # protobuf DecodeError and friends
        raise InputError(f"{path}: not an ONNX model: {one_line(e, 200) or type(e).__name__}") from None
    if not model.graph.node:
        raise InputError(f"{path}: not an ONNX model with a graph (no nodes)")
    return digest, model


def measure_layers(
    model_path: str | Path, threads: int | None = None, runs: int = 5, progress: Callable[[str], None] | None = None
) -> tuple[str, dict[str, float]]:
    """(sha256 of the model file, {node name: median kernel ms}) on the CPU provider (measure_layers_on)."""
    digest, table, _ = measure_layers_on(model_path, threads, runs, progress)
    return digest, table


def measure_layers_on(
    model_path: str | Path, threads: int | None = None, runs: int = 5, progress: Callable[[str], None] | None = None,
    providers: Sequence[Provider] | None = None, cpu_table: dict[str, float] | None = None,
) -> tuple[str, dict[str, float], frozenset[str] | None]:
    """(sha256 of the model file, {node name: median kernel ms}, the nodes the CPU provider ran) from
    onnxruntime's profiler.

    Runs the model `runs` times after 2 warm-up runs, with random inputs (dimensions that are not
    fixed become 1).  The optimised graph is written to a temporary folder (weights included) to map
    fused and renamed nodes back to the original ones.  Without `providers` (or with the CPU's alone) the
    session is the runtime's (ORT_ENABLE_ALL, the CPU provider) and the third item is None.  With others
    (claims.py): the session runs at ORT_ENABLE_BASIC on them, the CPU provider's nodes keep their own times,
    and each run's accelerator time (its subgraphs' events) is shared among the nodes the CPU did not run in
    proportion to their times in `cpu_table` (the same model on the CPU provider alone; evenly where it has
    none): the profiler times a subgraph, not its nodes."""
    accelerated = bool(providers) and any(p.name != CPU for p in providers)
    path = Path(model_path)
    digest, model = _read(path)
    keys = node_keys(model)
    warmup = _WARMUP
    with tempfile.TemporaryDirectory(prefix="edgec-profile-") as tmp:
        run_path = str(path)
        if keys != [n.name for n in model.graph.node]:  # unnamed or repeated names: run a renamed copy
            named = onnx.load(str(path))
            for k, n in zip(keys, named.graph.node):
                n.name = k
            run_path = os.path.join(tmp, "named.onnx")
            # weights inline for an accelerator: OpenVINO's (1.24.1) failed to read a copy with external weights
            onnx.save_model(named, run_path, save_as_external_data=not accelerated, all_tensors_to_one_file=True,
                            location="named.weights")
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        if accelerated:  # claims.py: the claims as at the default level, the CPU nodes under their own names
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        else:
            so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
            so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.weights")
            so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        if threads:
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
        try:
            sess = ort.InferenceSession(run_path, so, providers=ort_providers(providers) if accelerated else [CPU])
            nodes = node_map(model, keys, basic_graph(run_path, tmp)) if accelerated else None
        except Exception as e:
            raise InputError(f"{path}: onnxruntime cannot load the model: {one_line(e, 200)}") from None
        feeds = _feeds(sess, path)
        for i in range(warmup + runs):
            sess.run(None, feeds)
            if progress:
                progress(f"  model run {i + 1}/{warmup + runs}")
        events = json.loads(Path(sess.end_profiling()).read_text())
        mapping: dict[str, str] = {}
        if not accelerated:
            nodes = None
            try:
                opt = onnx.load(os.path.join(tmp, "optimized.onnx"), load_external_data=False)
                mapping = _map_optimized(model, keys, opt)
            except Exception:  # no optimised graph: keep onnxruntime's names
                mapping = {}
    run_spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    run_spans = run_spans[warmup:]
    per_run: list[dict[str, float]] = [dict() for _ in run_spans]
    cpu_run: set[str] = set()
    for e in kernel_events(events):
        i = next((i for i, (a, b) in enumerate(run_spans) if a <= e.ts <= b), None)
        if i is None:
            continue
        if nodes is None:
            owners = [mapping.get(e.name, e.name)]
        elif e.provider == CPU:
            owners = sorted(nodes.keys_of(e))
            cpu_run.update(owners)
        else:
            owners = [ACCELERATED]
        for key in owners:
            per_run[i][key] = per_run[i].get(key, 0.0) + e.dur_ms / len(owners)
    if nodes is not None:
        per_run = [_share_accelerated(r, [k for k in keys if k not in cpu_run], cpu_table or {}) for r in per_run]
    table = {k: 0.0 for k in keys}
    measured = set().union(*per_run) if per_run else set()
    for k in measured:
        table[k] = _sig(statistics.median(r.get(k, 0.0) for r in per_run), 4)
    return digest, table, (frozenset(cpu_run) if nodes is not None else None)


def _share_accelerated(run: dict[str, float], claimed: list[str], cpu_table: dict[str, float]) -> dict[str, float]:
    """One run's table with its accelerator time given to the `claimed` nodes, in proportion to their CPU times."""
    total = run.pop(ACCELERATED, 0.0)
    if not claimed or total == 0.0:
        return run
    weights = [cpu_table.get(k, 0.0) for k in claimed]
    whole = sum(weights)
    if whole <= 0.0:
        weights, whole = [1.0] * len(claimed), float(len(claimed))
    return run | {k: run.get(k, 0.0) + total * w / whole for k, w in zip(claimed, weights)}


_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
