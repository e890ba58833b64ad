"""What compressed transfers gain on real activations: ResNet-50 and VGG-16 tensors at their block cuts.

    python tests/bench/bench_compress.py [--models resnet50 vgg16] [--bandwidths 10 100] [--reps 5]

Runs each model (models/build/NAME.onnx, `python -m models build`) once in onnxruntime on a seeded N(0,1)
input, with the block-cut activations added as graph outputs, then for each tensor and codec measures the
compressed size and this machine's single-thread compress/decompress speeds (best of --reps), checks the
round trip bit for bit, and predicts the transfer time on each link:
    none:  bytes / bandwidth          codec: t_compress + compressed_bytes / bandwidth + t_decompress
`auto` is what runtime.compress.Chooser picks for the tensor (process calibration, after it has seen the
tensor once), timed with the measured numbers. Tables go to stdout as markdown, progress to stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import lz4.frame
import numpy as np
import onnx
import onnxruntime as ort
import zstandard
from onnx import TensorProto, helper

from edgec.models.inputs import example_inputs
from edgec.runtime.wire import compress as C
from edgec.runtime.wire.chooser import Chooser, calibrate
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

ROOT = Path(__file__).resolve().parents[2]

# Block cuts: the tensors a pipeline cut between blocks sends. ResNet-50 (Caffe2 names): the stem's
# max-pool, then the ReLU after each stage's last residual Sum (and one mid-stage). VGG-16: each
# max-pool and the first fully connected ReLU. The model input (dense, as sent to the first device) too.
CUTS = {
    "resnet50": {"r3": "stem maxpool", "r35": "stage 1 out", "r57": "stage 2 block 2", "r77": "stage 2 out",
                 "r139": "stage 3 out", "r171": "stage 4 out"},
    "vgg16": {"maxpool_0": "block 1 pool", "maxpool_1": "block 2 pool", "maxpool_2": "block 3 pool",
              "maxpool_3": "block 4 pool", "maxpool_4": "block 5 pool", "relu_13": "fc6 relu"},
}
CODECS = ("lz4", "zstd")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def activations(name: str, seed: int) -> dict[str, tuple[str, np.ndarray]]:
    """{tensor: (label, array)} for the model input and the CUTS of `name`, from one onnxruntime run."""
    path = ROOT / "models" / "build" / f"{name}.onnx"
    if not path.is_file():
        raise SystemExit(f"bench_compress: {path.relative_to(ROOT)} missing: run `python -m models build`")
    t = time.perf_counter()
    model = onnx.load(path)
    produced = {o for n in model.graph.node for o in n.output}
    missing = [c for c in CUTS[name] if c not in produced]
    if missing:
        raise SystemExit(f"bench_compress: {name} has no tensor(s) {missing}: the model changed; update CUTS")
    for cut in CUTS[name]:
        model.graph.output.append(helper.make_tensor_value_info(cut, TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every cut tensor
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    del model
    feeds = example_inputs(sess, seed=seed)
    outs = sess.run(list(CUTS[name]), feeds)
    log(f"{name}: ran in {time.perf_counter() - t:.1f}s (load + one inference)")
    result = {f"input {k}": ("model input", v) for k, v in feeds.items()}
    result.update({cut: (label, np.ascontiguousarray(out)) for (cut, label), out in zip(CUTS[name].items(), outs)})
    return result


def best_time(fn, reps: int) -> tuple[float, object]:
    best, out = math.inf, None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def measure(arr: np.ndarray, reps: int) -> dict[str, tuple[int, float, float]]:
    """codec -> (compressed bytes, compress s, decompress s), the round trip checked bit for bit."""
    out = {}
    for codec in CODECS:
        t_c, payload = best_time(lambda: C.encode(codec, arr), reps)
        t_d, back = best_time(lambda: C.decode(codec, payload, arr.nbytes), reps)
        assert bytes(back) == arr.tobytes(), f"{codec} round trip changed the data"
        out[codec] = (len(payload), t_c, t_d)
    return out


def transfer_s(nbytes: int, m: tuple[int, float, float] | None, mbps: float) -> float:
    wire = mbps * 1e6 / 8
    if m is None:
        return nbytes / wire
    size, t_c, t_d = m
    return t_c + size / wire + t_d


def variants(arrays: list[np.ndarray], reps: int) -> list[tuple[str, float, float, float]]:
    """Totals over every tensor for codec variants: (name, ratio, compress MB/s, decompress MB/s)."""
    zero = zstandard.ZstdDecompressor()
    cands = {"lz4.block (used)": (lambda a: C.encode("lz4", a), lambda p, n: C.decode("lz4", p, n)),
             "lz4.frame": (lambda a: lz4.frame.compress(a), lambda p, n: lz4.frame.decompress(p))}
    for level in (-1, 1, 3):
        cctx = zstandard.ZstdCompressor(level=level)
        used = " (used)" if level == C.ZSTD_LEVEL else ""
        cands[f"zstd level {level}{used}"] = (lambda a, c=cctx: c.compress(a),
                                             lambda p, n: zero.decompress(p, max_output_size=n))
    rows = []
    for name, (enc, dec) in cands.items():
        raw = comp = tc = td = 0.0
        for arr in arrays:
            view = memoryview(arr.reshape(-1).view(np.uint8))
            t_c, payload = best_time(lambda: enc(view), reps)
            t_d, _ = best_time(lambda: dec(payload, arr.nbytes), reps)
            raw += arr.nbytes
            comp += len(payload)
            tc += t_c
            td += t_d
        rows.append((name, comp / raw, raw / tc / 1e6, raw / td / 1e6))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(CUTS), choices=list(CUTS))
    p.add_argument("--bandwidths", nargs="+", type=float, default=[10.0, 100.0], help="link Mbps (10^6 bit/s)")
    p.add_argument("--reps", type=int, default=5, help="timing repetitions (best of)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    cal = calibrate()
    log(f"calibration: {cal.seconds * 1000:.0f} ms")
    rows = []  # (model, tensor, label, array, measurements)
    for model in args.models:
        for tensor, (label, arr) in activations(model, args.seed).items():
            t = time.perf_counter()
            rows.append((model, tensor, label, arr, measure(arr, args.reps)))
            log(f"  {model} {tensor}: {arr.nbytes / 1e6:.2f} MB measured in {time.perf_counter() - t:.1f}s")

    print(f"### Codecs on block-cut activations (1 thread; lz4 block, zstd level {C.ZSTD_LEVEL}; "
          f"ratio = compressed / raw; MB/s of raw bytes)\n")
    print("| model | tensor | cut | shape | zeros | raw MB | lz4 ratio | lz4 comp MB/s | lz4 dec MB/s "
          "| zstd ratio | zstd comp MB/s | zstd dec MB/s |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model, tensor, label, arr, m in rows:
        cells = []
        for codec in CODECS:
            size, t_c, t_d = m[codec]
            cells += [f"{size / arr.nbytes:.3f}", f"{arr.nbytes / t_c / 1e6:.0f}", f"{arr.nbytes / t_d / 1e6:.0f}"]
        print(f"| {model} | {tensor} | {label} | {'x'.join(map(str, arr.shape))} | {np.mean(arr == 0):.0%} "
              f"| {arr.nbytes / 1e6:.2f} | " + " | ".join(cells) + " |")

    for mbps in args.bandwidths:
        print(f"\n### Predicted transfer time at {mbps:g} Mbps (ms): compress + wire + decompress\n")
        print("| model | tensor | none | lz4 | zstd | auto picks | auto | auto speedup | best |")
        print("|---|---|---:|---:|---:|---|---:|---:|---|")
        speedups: dict[str, list[float]] = {}
        totals: dict[str, list[float]] = {}
        for model, tensor, label, arr, m in rows:
            times = {"none": transfer_s(arr.nbytes, None, mbps)}
            times.update({c: transfer_s(arr.nbytes, m[c], mbps) for c in CODECS})
            chooser = Chooser("auto", mbps, calibration=cal)
            first = chooser.choose(tensor, arr.dtype, arr.nbytes)  # from the dtype's prior
            if first != "none":
                chooser.observe(tensor, first, arr.nbytes, m[first][0])  # what the first transfer teaches
            pick = chooser.choose(tensor, arr.dtype, arr.nbytes)
            best = min(times, key=times.get)
            speedups.setdefault(model, []).append(times["none"] / times[pick])
            tot = totals.setdefault(model, [0.0, 0.0])
            tot[0] += times["none"]
            tot[1] += times[pick]
            print(f"| {model} | {tensor} | {times['none'] * 1e3:.1f} | {times['lz4'] * 1e3:.1f} "
                  f"| {times['zstd'] * 1e3:.1f} | {pick} | {times[pick] * 1e3:.1f} "
                  f"| {times['none'] / times[pick]:.2f}x | {best} |")
        for model, sp in speedups.items():
            none_s, auto_s = totals[model]
            gm = math.exp(sum(math.log(s) for s in sp) / len(sp))
            print(f"| **{model}** | all {len(sp)} | {none_s * 1e3:.1f} | | | | {auto_s * 1e3:.1f} "
                  f"| {none_s / auto_s:.2f}x (geomean {gm:.2f}x) | |")

    print("\n### Codec variants, totals over every tensor above (ratio, compress MB/s, decompress MB/s)\n")
    print("| variant | ratio | comp MB/s | dec MB/s |")
    print("|---|---:|---:|---:|")
    for name, ratio, cs, ds in variants([r[3] for r in rows], args.reps):
        print(f"| {name} | {ratio:.3f} | {cs:.0f} | {ds:.0f} |")
    zstd_version = ".".join(map(str, zstandard.ZSTD_VERSION))
    print(f"\nCalibration ({cal.seconds * 1000:.0f} ms): priors float32 lz4 {cal.priors['float32']['lz4']:.3f}, "
          f"zstd {cal.priors['float32']['zstd']:.3f}; onnxruntime {ort.__version__}, "
          f"lz4 {lz4.library_version_string()}, zstd {zstd_version}")


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
