"""`edgec profile`: measure this machine with onnxruntime micro-benchmarks and write a device profile.

`measure_host()` builds small ONNX models with onnx.helper and times them with onnxruntime's CPU
execution provider (warm-up first, then the median of several runs):

  - conv            a 3x3 Conv, 128 -> 128 channels on 56x56 (0.92 GFLOP)
  - depthwise_conv  a 3x3 depthwise Conv, 96 channels on 112x112 (memory-heavy, as in MobileNets)
  - gemm            a 512x1024 by 1024x1024 MatMul (1.07 GFLOP)
  - other           the slower of a ConvTranspose (2x upsampling) and a batch-1 LSTM: ops without a
                    GEMM-shaped fast path
  - memory_gbps     an elementwise Add of two 8M-float tensors: (2 inputs + 1 output) bytes / time
  - op_overhead_us  fixed cost per ONNX node, the larger of
                    (a) the dispatch floor: (200 tiny Relu nodes - 1) / 199, and
                    (b) small layers: a chain of 50 (3x3 Conv 16 ch on 28x28 -> Relu) pairs against one
                    pair, less the Conv FLOPs at the measured conv rate, per original node (98):
                    dispatch + thread-pool sync + small-layer inefficiency

Memory comes from /proc/meminfo (MemTotal; usable_memory_fraction = MemAvailable / MemTotal at
profiling time, rounded down to 0.05), or os.sysconf where there is no /proc.  runtime_overhead_mb is
the resident set of this Python process (python + numpy + onnx + onnxruntime with one small session)
before the large benchmarks run.  Power cannot be measured here: pass power_idle_w / power_busy_w, or
they are written as null (= unknown).

With a model: `layers: {<sha256 of the model file>: {<onnx node name>: ms}}`, the median over a few
runs of each node's kernel time from onnxruntime's profiler (SessionOptions.enable_profiling), with
the default optimisation level (ORT_ENABLE_ALL), as the runtime would run it.  onnxruntime fuses and
renames nodes (Conv+Relu -> one FusedConv, NCHWc layout nodes named <output tensor>_nchwc, Reorder
nodes); each optimised node's time is given to the original node it came from (same name; the name
before the first '/'; the producer of the tensor in "<tensor>_nchwc" or of its output, walked back to
the operator of the same kind that starts a fusion, e.g. the Conv of a fused Conv+Relu; else the first
mappable node downstream).  Every node of the original graph is listed: nodes that were folded,
eliminated or fused into another get 0.0, so summing node times per layer gives the layer's time.
Nodes without a name are keyed "<op_type>_<index in graph.node>".
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime as ort
import yaml
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.cluster import validate_profile_dict
from edgec.compiler.errors import UserError
from edgec.compiler.ingest import file_sha256, node_keys

__all__ = ["measure_host", "write_profile", "measure_layers"]

_IR_VERSION = 8  # opset 17 needs IR >= 8; old enough for any onnxruntime >= 1.14
_OPSET = 17


# --------------------------------------------------------------------------------------------------
# Model building and timing


def _model(nodes, inputs, outputs, inits=()) -> bytes:
    g = helper.make_graph(nodes, "bench", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="edgec-profile")
    m.ir_version = _IR_VERSION
    return m.SerializeToString()


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _session(model: bytes, threads: int | None, opt=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = opt
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _time(sess: ort.InferenceSession, feeds: dict, runs: int, warmup: int, budget_s: float) -> float:
    """Median wall time of one run in seconds (warm-up runs first; stops early past the budget,
    after at least 3 timed runs)."""
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    start = time.perf_counter()
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
        if len(times) >= 3 and time.perf_counter() - start > budget_s:
            break
    return statistics.median(times)


def _sig(x: float, digits: int = 3) -> float:
    """Round to `digits` significant figures: measured figures carry no more precision than that."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


# --------------------------------------------------------------------------------------------------
# Host facts


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return info
    for line in text.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            k, v = k.strip(), v.strip()
            if k and v and k not in info:
                info[k] = v
    physical = set()
    cur: dict[str, str] = {}
    for block in text.split("\n\n"):
        cur = {}
        for line in block.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                cur[k.strip()] = v.strip()
        if "core id" in cur:
            physical.add((cur.get("physical id", "0"), cur["core id"]))
    if physical:
        info["_physical_cores"] = str(len(physical))
    return info


def _meminfo_mb() -> tuple[float, float | None]:
    """(MemTotal, MemAvailable) in MB (MiB); MemAvailable None when unknown."""
    try:
        fields = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, _, v = line.partition(":")
            parts = v.split()
            if parts:
                fields[k] = float(parts[0]) / 1024.0  # kB -> MiB
        if "MemTotal" in fields:
            return fields["MemTotal"], fields.get("MemAvailable")
    except OSError:
        pass
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    try:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / 2**20
    except (ValueError, OSError):
        avail = None
    return total, avail


def _rss_mb() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    try:
        import resource

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r / 1024.0 if platform.system() != "Darwin" else r / 2**20
    except Exception:
        return None


def _host_name() -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", socket.gethostname()).strip("-.")
    return name or "host"


_ARM_PARTS = {
    "0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1", "0xd0d": "Cortex-A77", "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78",
    "0xd42": "Cortex-A78AE", "0xd44": "Cortex-X1", "0xd46": "Cortex-A510", "0xd47": "Cortex-A710",
    "0xd48": "Cortex-X2", "0xd49": "Neoverse-N2", "0xd4d": "Cortex-A715", "0xd4e": "Cortex-X3",
    "0xd80": "Cortex-A520", "0xd81": "Cortex-A720", "0xd82": "Cortex-X4",
}


def _cpu_summary() -> str | None:
    """"4x Cortex-A76 @ 2.4 GHz" from /proc/cpuinfo CPU part and cpufreq, on Arm; None elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    parts: dict[str, int] = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k.strip() == "CPU part":
            name = _ARM_PARTS.get(v.strip().lower(), f"Arm part {v.strip()}")
            parts[name] = parts.get(name, 0) + 1
    if not parts:
        return None
    freqs: dict[str, float] = {}
    try:
        for f in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
            freqs[f.parent.parent.name] = int(f.read_text().strip()) / 1e6
    except (OSError, ValueError):
        pass
    top = f" @ up to {max(freqs.values()):.2f} GHz" if freqs else ""
    return " + ".join(f"{n}x {p}" for p, n in parts.items()) + top


def _board_model(cpu: dict[str, str]) -> str | None:
    try:
        model = Path("/proc/device-tree/model").read_text(errors="replace").strip("\x00\n ")
        if model:
            return model
    except OSError:
        pass
    return cpu.get("Model")


def _describe(cpu: dict[str, str], mem_mb: float, threads_used: int) -> str:
    board = _board_model(cpu)
    arm = _cpu_summary()
    model = cpu.get("model name") or cpu.get("Hardware") or cpu.get("cpu model") or platform.processor()
    cpu_txt = arm or model or "unknown CPU"
    logical = os.cpu_count() or 0
    phys = cpu.get("_physical_cores")
    cores = f"{phys} cores / {logical} threads" if phys else f"{logical} CPUs"
    head = f"{board}, " if board else ""
    return (
        f"{head}{cpu_txt} ({platform.machine()}, {cores}), {mem_mb / 1024:.1f} GB RAM, {platform.system()}; "
        f"onnxruntime {ort.__version__} CPU EP fp32, {threads_used} intra-op threads"
    )


# --------------------------------------------------------------------------------------------------
# Micro-benchmarks


def _bench_conv(rng, threads, quick, runs, budget):
    c, hw = (64, 28) if quick else (128, 56)
    w = numpy_helper.from_array(_rand(rng, c, c, 3, 3) * 0.05, "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [_vi("x", (1, c, hw, hw))], [_vi("y", (1, c, hw, hw))], [w])
    flops = 2 * c * c * 9 * hw * hw
    t = _time(_session(model, threads), {"x": _rand(rng, 1, c, hw, hw)}, runs, 2, budget)
    return flops / t / 1e9


def _bench_depthwise(rng, threads, quick, runs, budget):
    c, hw = (32, 56) if quick else (96, 112)
    w = numpy_helper.from_array(_rand(rng, c, 1, 3, 3) * 0.1, "w")
    model = _model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=c)], [_vi("x", (1, c, hw, hw))], [_vi("y", (1, c, hw, hw))], [w]
    )
    flops = 2 * c * 9 * hw * hw
    t = _time(_session(model, threads), {"x": _rand(rng, 1, c, hw, hw)}, runs, 2, budget)
    return flops / t / 1e9


def _bench_gemm(rng, threads, quick, runs, budget):
    m, k, n = (256, 512, 512) if quick else (512, 1024, 1024)
    b = numpy_helper.from_array(_rand(rng, k, n) * 0.05, "b")
    model = _model([helper.make_node("MatMul", ["a", "b"], ["y"])], [_vi("a", (m, k))], [_vi("y", (m, n))], [b])
    t = _time(_session(model, threads), {"a": _rand(rng, m, k)}, runs, 2, budget)
    return 2 * m * k * n / t / 1e9


def _bench_other(rng, threads, quick, runs, budget):
    """(gflops of ConvTranspose, gflops of LSTM)."""
    # ConvTranspose, 2x2 kernel stride 2: c_in -> c_out, hw -> 2hw
    ci, co, hw = (32, 32, 28) if quick else (128, 64, 56)
    w = numpy_helper.from_array(_rand(rng, ci, co, 2, 2) * 0.05, "w")
    model = _model(
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])],
        [_vi("x", (1, ci, hw, hw))],
        [_vi("y", (1, co, 2 * hw, 2 * hw))],
        [w],
    )
    flops = 2 * ci * co * 4 * hw * hw
    t = _time(_session(model, threads), {"x": _rand(rng, 1, ci, hw, hw)}, runs, 2, budget)
    g_convt = flops / t / 1e9
    # LSTM, batch 1: per step 4 gates x (input + recurrent) matrix-vector products
    seq, inp, hid = (16, 128, 128) if quick else (32, 256, 256)
    W = numpy_helper.from_array(_rand(rng, 1, 4 * hid, inp) * 0.05, "W")
    R = numpy_helper.from_array(_rand(rng, 1, 4 * hid, hid) * 0.05, "R")
    model = _model(
        [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hid)],
        [_vi("x", (seq, 1, inp))],
        [_vi("y", (seq, 1, 1, hid))],
        [W, R],
    )
    flops = seq * 2 * 4 * hid * (inp + hid)
    t = _time(_session(model, threads), {"x": _rand(rng, seq, 1, inp)}, runs, 2, budget)
    return g_convt, flops / t / 1e9


def _bench_memory(rng, threads, quick, runs, budget):
    n = (2 if quick else 8) * 2**20
    model = _model([helper.make_node("Add", ["a", "b"], ["y"])], [_vi("a", (n,)), _vi("b", (n,))], [_vi("y", (n,))])
    feeds = {"a": _rand(rng, n), "b": _rand(rng, n)}
    t = _time(_session(model, threads), feeds, runs, 2, budget)
    return 3 * 4 * n / t / 1e9


def _conv_relu_chain(pairs: int, w) -> bytes:
    c = _CHAIN_CH
    names = ["x"] + [f"t{i}" for i in range(2 * pairs - 1)] + ["y"]
    nodes = []
    for i in range(pairs):
        nodes.append(helper.make_node("Conv", [names[2 * i], "w"], [names[2 * i + 1]], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [names[2 * i + 1]], [names[2 * i + 2]], name=f"relu{i}"))
    shape = (1, c, _CHAIN_HW, _CHAIN_HW)
    return _model(nodes, [_vi("x", shape)], [_vi("y", shape)], [w])


_CHAIN_PAIRS, _CHAIN_CH, _CHAIN_HW = 50, 16, 28


def _time_op_chains(rng, threads, quick, runs, budget) -> tuple[float, float]:
    """Seconds for a chain of 50 (small 3x3 Conv -> Relu) pairs (100 nodes) and for one pair."""
    w = numpy_helper.from_array(_rand(rng, _CHAIN_CH, _CHAIN_CH, 3, 3) * 0.1, "w")
    feeds = {"x": _rand(rng, 1, _CHAIN_CH, _CHAIN_HW, _CHAIN_HW)}
    reps = max(runs * 3, 15)
    t_long = _time(_session(_conv_relu_chain(_CHAIN_PAIRS, w), threads), feeds, reps, 3, budget)
    t_short = _time(_session(_conv_relu_chain(1, w), threads), feeds, reps, 3, budget)
    return t_long, t_short


def _relu_chain(length: int) -> bytes:
    names = ["x"] + [f"t{i}" for i in range(length - 1)] + ["y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"relu{i}") for i in range(length)]
    return _model(nodes, [_vi("x", (1, 16))], [_vi("y", (1, 16))])


def _dispatch_floor_us(rng, threads, runs, budget) -> float:
    """Microseconds per node of a 200-node chain of tiny Relu nodes over a 1-node chain: the pure
    dispatch cost, with graph optimisation off so nothing folds the chain."""
    feeds = {"x": _rand(rng, 1, 16)}
    off = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reps = max(runs * 3, 15)
    t_long = _time(_session(_relu_chain(200), threads, off), feeds, reps, 5, budget)
    t_short = _time(_session(_relu_chain(1), threads, off), feeds, reps, 5, budget)
    return max((t_long - t_short) / 199, 0.0) * 1e6


def _op_overhead_us(t_long: float, t_short: float, conv_gflops: float) -> float:
    """Fixed cost per original ONNX node at small layer sizes: the extra time of 49 (Conv 16->16 on
    28x28 -> Relu) pairs, less their Conv FLOPs at the measured (large) conv rate, divided by their 98
    nodes.  Layers this small are parallelised, so the figure holds dispatch, intra-op thread-pool
    synchronisation and small-layer inefficiency: what a layer costs beyond FLOPs / gflops.  The chain
    runs with the default optimisation level, so Conv+Relu fuse as in the runtime; dividing by the
    original node count gives the overhead per node the cost model counts."""
    extra_pairs = _CHAIN_PAIRS - 1
    flop_s = extra_pairs * 2 * _CHAIN_CH * _CHAIN_CH * 9 * _CHAIN_HW * _CHAIN_HW / (conv_gflops * 1e9)
    return max((t_long - t_short - flop_s) / (2 * extra_pairs), 0.0) * 1e6


# --------------------------------------------------------------------------------------------------
# Per-node times of a real model


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


def _feeds(sess: ort.InferenceSession, path: Path) -> dict[str, np.ndarray]:
    """Random float / zero integer inputs; symbolic or unknown dimensions become 1."""
    feeds = {}
    rng = np.random.default_rng(0)
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
        dtype = _ORT_TYPES.get(inp.type)
        if dtype is None:
            raise UserError(f"input {inp.name!r} has unsupported type {inp.type}", path=str(path))
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[inp.name] = np.zeros(shape, dtype=dtype)
    return feeds


def measure_layers(
    model_path: str | Path, threads: int | None = None, runs: int = 5, progress: Callable[[str], None] | None = None
) -> tuple[str, dict[str, float]]:
    """(sha256 of the model file, {node name: median kernel ms}) from onnxruntime's profiler.

    Runs the model `runs` times after 2 warm-up runs, with random inputs (dimensions that are not
    fixed become 1).  The optimised graph is written to a temporary folder (weights included) to map
    fused and renamed nodes back to the original ones."""
    path = Path(model_path)
    try:
        digest = file_sha256(path)
        model = onnx.load(str(path), load_external_data=False)  # graph structure only
    except OSError as e:
        raise UserError(f"cannot read model: {e.strerror or e}", path=str(path)) from None
    except Exception as e:  # protobuf DecodeError and friends
        raise UserError(f"not an ONNX model: {str(e).splitlines()[0] if str(e) else type(e).__name__}", path=str(path)) from None
    keys = node_keys(model)
    warmup = 2
    with tempfile.TemporaryDirectory(prefix="edgec-profile-") as tmp:
        run_path = str(path)
        if keys != [n.name for n in model.graph.node]:  # unnamed or repeated names: run a renamed copy
            named = onnx.load(str(path))
            for k, n in zip(keys, named.graph.node):
                n.name = k
            run_path = os.path.join(tmp, "named.onnx")
            onnx.save_model(named, run_path, save_as_external_data=True, all_tensors_to_one_file=True, location="named.weights")
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.weights")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        if threads:
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
        try:
            sess = ort.InferenceSession(run_path, so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise UserError(f"onnxruntime cannot load the model: {str(e).splitlines()[0]}", path=str(path)) from None
        feeds = _feeds(sess, path)
        for i in range(warmup + runs):
            sess.run(None, feeds)
            if progress:
                progress(f"  model run {i + 1}/{warmup + runs}")
        events = json.loads(Path(sess.end_profiling()).read_text())
        try:
            opt = onnx.load(os.path.join(tmp, "optimized.onnx"), load_external_data=False)
            mapping = _map_optimized(model, keys, opt)
        except Exception:  # no optimised graph: keep onnxruntime's names
            mapping = {}
    run_spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    run_spans = run_spans[warmup:]
    per_run: list[dict[str, float]] = [dict() for _ in run_spans]
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        node = e["name"][: -len("_kernel_time")]
        key = mapping.get(node, node)
        for i, (a, b) in enumerate(run_spans):
            if a <= e["ts"] <= b:
                per_run[i][key] = per_run[i].get(key, 0.0) + e["dur"] / 1000.0
                break
    table = {k: 0.0 for k in keys}
    measured = set().union(*per_run) if per_run else set()
    for k in measured:
        table[k] = _sig(statistics.median(r.get(k, 0.0) for r in per_run), 4)
    return digest, table


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


# --------------------------------------------------------------------------------------------------
# Public API


def measure_host(
    model_path: str | None = None,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    quick: bool = False,
    power_idle_w: float | None = None,
    power_busy_w: float | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Measure this machine and return a profile dict in the profile file format.

    threads: onnxruntime intra-op threads (None: onnxruntime's default, one per physical core).
    quick: smaller benchmarks and fewer runs (about a second; for tests, noisier figures).
    power_idle_w / power_busy_w: watts from a meter, if the caller has them; None is written as null.
    """
    say = progress or (lambda s: None)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise UserError(f"threads must be a positive integer, got {threads!r}")
    rng = np.random.default_rng(0)
    cpu = _cpuinfo()
    mem_total, mem_avail = _meminfo_mb()
    threads_used = threads or int(cpu.get("_physical_cores") or os.cpu_count() or 1)
    runs, budget = (3, 0.3) if quick else (9, 2.0)
    started = time.perf_counter()

    say(f"profiling {_host_name()}: onnxruntime {ort.__version__}, {threads_used} threads{' (quick)' if quick else ''}")
    floor_us = _dispatch_floor_us(rng, threads, runs, budget)
    t_long, t_short = _time_op_chains(rng, threads, quick, runs, budget)
    rss = _rss_mb()  # python + numpy + onnx + onnxruntime with small sessions, before the large benchmarks
    conv = _bench_conv(rng, threads, quick, runs, budget)
    small_us = _op_overhead_us(t_long, t_short, conv)
    overhead_us = max(floor_us, small_us)
    say(f"  per-operator overhead  {overhead_us:8.1f} us (dispatch floor {floor_us:.1f} us, small layers {small_us:.1f} us)")
    say(f"  conv                   {conv:8.1f} GFLOP/s")
    dw = _bench_depthwise(rng, threads, quick, runs, budget)
    say(f"  depthwise conv         {dw:8.1f} GFLOP/s")
    gemm = _bench_gemm(rng, threads, quick, runs, budget)
    say(f"  gemm                   {gemm:8.1f} GFLOP/s")
    g_convt, g_lstm = _bench_other(rng, threads, quick, runs, budget)
    say(f"  other: ConvTranspose   {g_convt:8.1f} GFLOP/s, LSTM {g_lstm:.1f} GFLOP/s")
    mem = _bench_memory(rng, threads, quick, runs, budget)
    say(f"  memory (elementwise)   {mem:8.1f} GB/s")

    frac = 0.75
    if mem_avail is not None and mem_total > 0:
        frac = max(0.05, math.floor(mem_avail / mem_total * 20) / 20)
    runtime_mb = math.ceil((rss or 100.0) / 10) * 10
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    host = _host_name()
    threads_txt = f"{threads_used} threads" + ("" if threads else " (onnxruntime default)")
    sources = [
        f"edgec profile on {host} at {stamp}, onnxruntime {ort.__version__}, {threads_txt}"
        + (" (quick mode: small benchmarks, noisy)" if quick else ""),
        "gflops: median of timed onnxruntime runs after warm-up; conv = 3x3 Conv 128->128 ch on 56x56, "
        "depthwise_conv = 3x3 depthwise Conv 96 ch on 112x112, gemm = MatMul 512x1024x1024, "
        "other = slower of ConvTranspose 2x2/s2 and batch-1 LSTM; FLOPs = 2 x MACs"
        + (" (quick mode uses smaller shapes)" if quick else ""),
        "memory_gbps: elementwise Add of two 8M-float tensors, (2 inputs + 1 output) bytes / median time"
        if not quick
        else "memory_gbps: elementwise Add of two 2M-float tensors (may partly fit in cache), (2 inputs + 1 output) bytes / median time",
        "op_overhead_us: the larger of (a) the dispatch floor, (200-node tiny Relu chain - 1 node) / 199, and (b) small layers, "
        "(chain of 50 x [3x3 Conv 16 ch on 28x28 -> Relu] - one pair - their Conv FLOPs at the measured conv rate) / 98 nodes, "
        "default optimisation (Conv+Relu fuse as in the runtime)",
        "memory_mb: MemTotal; usable_memory_fraction: MemAvailable/MemTotal at profiling time, rounded down to 0.05; "
        "runtime_overhead_mb: resident set of the profiling process (python+numpy+onnx+onnxruntime, one small session)",
        "power_w: not measurable by edgec profile; "
        + ("given by the caller" if power_idle_w is not None or power_busy_w is not None else "null = unknown"),
    ]
    layers: dict[str, dict[str, float]] = {}
    if model_path is not None:
        say(f"  per-node times of {model_path}")
        digest, table = measure_layers(model_path, threads=threads, runs=3 if quick else 5, progress=progress)
        layers[digest] = table
        sources.append(
            f"layers: onnxruntime profiler kernel times (median of {3 if quick else 5} runs, ORT_ENABLE_ALL), "
            f"keyed by ONNX node name, of {Path(model_path).name} (sha256 {digest[:12]}...)"
        )
    say(f"  done in {time.perf_counter() - started:.1f} s")
    profile = {
        "name": name or host,
        "description": _describe(cpu, mem_total, threads_used),
        "memory_mb": int(round(mem_total)),
        "usable_memory_fraction": frac,
        "runtime_overhead_mb": runtime_mb,
        "op_overhead_us": _sig(max(overhead_us, 0.1), 2),
        "gflops": {
            "conv": _sig(conv),
            "depthwise_conv": _sig(dw),
            "gemm": _sig(gemm),
            "other": _sig(min(g_convt, g_lstm)),
        },
        "memory_gbps": _sig(mem),
        "power_w": {"idle": power_idle_w, "busy": power_busy_w},
        "sources": sources,
        "layers": layers,
    }
    return profile


class _Dumper(yaml.SafeDumper):
    pass


def _flow_small_dicts(dumper, data):
    flow = len(data) <= 2 and all(isinstance(v, (int, float, type(None))) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=flow)


_Dumper.add_representer(dict, _flow_small_dicts)


def write_profile(profile: dict[str, Any], path: str | Path) -> None:
    """Write a profile dict as YAML, atomically (temp file in the same folder + os.replace).

    The dict is validated first (UserError on a problem), so what is written loads with load_profile."""
    p = Path(path)
    validate_profile_dict(profile, str(p))
    text = yaml.dump(profile, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16)
    folder = p.parent if str(p.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise UserError(f"cannot write profile: {e.strerror or e}", path=str(p)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UserError(f"cannot write profile: {e.strerror or e}", path=str(p)) from None
