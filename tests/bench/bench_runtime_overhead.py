"""Overhead benchmark: a one-device manifest under `run --repeat N` vs plain onnxruntime, same threads."""

# Usage: python tests/bench/bench_runtime_overhead.py [--repeat 20] [--threads 0] [--rounds 3] [--folder DIR]
# Builds a ResNet-18-like conv net (random weights, ~1.8 GFLOPs) with onnx.helper and a one-device
# manifest for it, then prints the median latency of plain onnxruntime and of `python -m runtime`,
# alternating rounds, and finally an interleaved in-process comparison (robust on a shared machine).
# Not collected by pytest: the name does not start with test_.

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]

from edgec.runtime.device.executor import session_options
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)


def resnet18_like(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, n = [], [], [0]

    def conv(x, cin, cout, k, stride, relu=True):
        n[0] += 1
        w, b, y = f"w{n[0]}", f"b{n[0]}", f"c{n[0]}"
        scale = np.sqrt(2.0 / (cin * k * k))
        inits.append(numpy_helper.from_array((rng.standard_normal((cout, cin, k, k)) * scale).astype(np.float32), w))
        inits.append(numpy_helper.from_array(np.zeros(cout, np.float32), b))
        nodes.append(helper.make_node("Conv", [x, w, b], [y], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4))
        if not relu:
            return y
        nodes.append(helper.make_node("Relu", [y], [y + "r"]))
        return y + "r"

    def block(x, cin, cout, stride):
        y = conv(conv(x, cin, cout, 3, stride), cout, cout, 3, 1, relu=False)
        skip = x if (cin == cout and stride == 1) else conv(x, cin, cout, 1, stride, relu=False)
        n[0] += 1
        nodes.append(helper.make_node("Add", [y, skip], [f"a{n[0]}"]))
        nodes.append(helper.make_node("Relu", [f"a{n[0]}"], [f"a{n[0]}r"]))
        return f"a{n[0]}r"

    x = conv("data", 3, 64, 7, 2)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        x = block(block(x, cin, cout, stride), cout, cout, 1)
        cin = cout
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"]), helper.make_node("Flatten", ["gap"], ["feat"]),
              helper.make_node("Gemm", ["feat", "fc_w", "fc_b"], ["prob"])]
    inits += [numpy_helper.from_array((rng.standard_normal((512, 1000)) * 0.04).astype(np.float32), "fc_w"),
              numpy_helper.from_array(np.zeros(1000, np.float32), "fc_b")]
    graph = helper.make_graph(nodes, "resnet18_like", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 224, 224])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1000])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def write_case(folder: Path) -> Path:
    data = resnet18_like().SerializeToString()
    (folder / "model.onnx").write_bytes(data)
    (folder / "dev.f0.onnx").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    manifest = {
        "format": "edgec.manifest", "version": 1, "model": {"path": "model.onnx", "sha256": sha},
        "inputs": [{"name": "data", "shape": [1, 3, 224, 224], "dtype": "float32"}],
        "outputs": [{"name": "prob", "shape": [1, 1000], "dtype": "float32", "device": "dev"}],
        "devices": [{"name": "dev", "profile": "host", "memory_mb": 4096, "address": None}],
        "network": {"bandwidth_mbps": 1000.0, "latency_ms": 0.0, "medium": "switched", "links": []},
        "fragments": [{"id": "f0", "device": "dev", "file": "dev.f0.onnx", "sha256": sha, "inputs": ["data"],
                       "outputs": ["prob"], "predicted_ms": 50.0}],
        "transfers": [],
        "steps": {"dev": [{"op": "recv", "tensor": "data", "from": "@host"}, {"op": "run", "fragment": "f0"},
                          {"op": "send", "tensor": "prob", "to": "@host"}]},
    }
    path = folder / "manifest.json"
    path.write_text(json.dumps(manifest, sort_keys=True), encoding="utf-8")
    return path


def plain_ort_ms(model: Path, repeat: int, threads: int) -> list[float]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), session_options(threads), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    sess.run(None, {"data": x})
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        sess.run(None, {"data": x})
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def runtime_ms(manifest: Path, repeat: int, threads: int) -> list[float]:
    cmd = [sys.executable, "-m", "edgec.runtime", str(manifest), "--random-inputs", "--repeat", str(repeat), "--json"]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)["latencies_ms"]


def interleaved_ms(manifest: Path, repeat: int, threads: int) -> tuple[list[float], list[float]]:
    """Plain onnxruntime and the runtime alternately, request by request, so that load from other
    processes on a shared machine hits both alike. The pause matters: after Run(), plain onnxruntime's
    pool threads keep spinning for tens of ms (the workers stop them) and would slow whatever runs next."""
    import onnxruntime as ort

    from edgec.runtime.coordinator.pool import WorkerPool
    from edgec.runtime.manifest.load import load_manifest

    m = load_manifest(manifest)
    sess = ort.InferenceSession(str(m.model_path), session_options(threads), providers=["CPUExecutionProvider"])
    x = {"data": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    plain, ours = [], []
    with WorkerPool(m, threads=threads or None) as cluster:
        cluster.infer(x)
        sess.run(None, x)
        for _ in range(repeat):
            time.sleep(0.1)
            start = time.perf_counter()
            sess.run(None, x)
            plain.append((time.perf_counter() - start) * 1000.0)
            time.sleep(0.1)
            ours.append(cluster.infer(x)[1])
    return plain, ours


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="0 = onnxruntime's default (what a one-device run uses)")
    p.add_argument("--rounds", type=int, default=3, help="alternate plain/runtime this many times")
    p.add_argument("--folder")
    args = p.parse_args()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="edgec-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    manifest = write_case(folder)
    for r in range(args.rounds):
        plain = statistics.median(plain_ort_ms(folder / "model.onnx", args.repeat, args.threads))
        ours = statistics.median(runtime_ms(manifest, args.repeat, args.threads))
        print(f"round {r + 1}: plain onnxruntime {plain:.2f} ms, edgec run {ours:.2f} ms, ratio {ours / plain:.3f}")
    plain, ours = (statistics.median(t) for t in interleaved_ms(manifest, args.repeat, args.threads))
    print(f"interleaved: plain onnxruntime {plain:.2f} ms, runtime {ours:.2f} ms, ratio {ours / plain:.3f}")


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
