"""What a halo exchange costs inside a plan, against what the planner prices it at (issue 11: the spatial plans'
exchanges).

    python tests/bench/bench_exchange.py [--channels 64,128,224,320] [--bytes 64,114688] [--requests 300]
                                         [--runs-before 1] [--profile HOST.yaml] [--json FILE]

Markdown to stdout, progress to stderr.  Not collected by pytest: the name does not start with test_.  Nothing
is enforced: it measures what the cost model does not yet price.

An exchange step, as a spatial stage has one between two segments: two local workers (1 thread each) each run a
fragment, send H bytes to the other, wait for the other's H bytes, then run a second fragment; a third message
tells the first worker that the second is done.  The same build without the exchange (the same inputs, so the
same request cost) runs alternately with it, one request each in turn, for --requests requests; the step is
the difference of their median latencies.  The fragments are two 3x3 convolutions on 14x14 maps of C channels
(`--channels`; the profile's run-figure fragment at 128), so C sets the working set a fragment streams:
2 x C^2 x 36 bytes of weights.  --runs-before N runs the first fragment N times before the exchange: more
time before it, the same working set.

Priced: what the planner charges that step, one transfer of H bytes between two devices of the profile (its
`runtime:` message figures) on the 10000 Mbps switched network that bench_fidelity's part two gives local
workers: message_ms + H x (message_ms_per_mb / 10^6 + the wire).  --profile: a profile with runtime figures
(`edgec profile --threads 1`); without it, this host is profiled first (about 30 s).

Measured 2026-11-26 on the 2-core machine (H = 64 B): the step grows with the fragment's working set, not its
time (C = 128 run six times before the exchange, 6 ms, cost what C = 128 run once does), from 0.10 ms after
0.29 MB of weights to about 0.6 ms after 7.4 MB and more, where one figure (message_ms, about 0.31 ms here)
prices every message.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from edgec.compiler.cluster import load_cluster, load_profile
from edgec.compiler.errors import UserError
from edgec.compiler.cost.network import NetworkModel
from edgec.runtime.profile import fixed  # the profile's own two-worker builds: _manifest, _relu, _evict
from edgec.runtime.coordinator.pool import WorkerPool
from edgec.runtime.manifest.load import load_manifest
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

EDGEC = [sys.executable, "-m", "edgec.compiler"]  # `edgec profile`, as bench_fidelity runs it
NETWORK = {"bandwidth_mbps": 10000, "latency_ms": 0, "medium": "switched"}  # as bench_fidelity's part two
WARMUP = 20  # requests of each build before the timed ones
MAP = fixed.EVICT_SHAPE[2:]  # 14 x 14


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def weight_bytes(channels: int) -> int:
    return 2 * channels * channels * 9 * 4


def build(folder: Path, channels: int, halo: int, exchange: bool, runs_before: int = 1) -> Path:
    """The two-worker build of the module docstring; returns its manifest.json.  Inputs: x (64 bytes, the
    request's output comes from it), e (the fragments' input), h (the H bytes each worker sends)."""
    a, b, small = fixed._A, fixed._B, fixed.SMALL_BYTES
    path = fixed._manifest(folder, fixed._relu(folder, small // 4), [a, b], small // 4, [], {})
    doc = json.loads(path.read_text())
    frags = {k: fixed._evict(folder, dev, k, channels) for k, dev in (("a1", a), ("a2", a), ("b1", b), ("b2", b))}
    doc["inputs"] += [{"name": "e", "shape": [1, channels, *MAP], "dtype": "float32"},
                      {"name": "h", "shape": [1, halo // 4], "dtype": "float32"}]
    doc["fragments"] += list(frags.values())

    def transfer(tensor: str, src: str, dst: str, nbytes: int) -> dict:
        return {"tensor": tensor, "src": src, "dst": dst, "shape": [1, nbytes // 4], "dtype": "float32",
                "bytes": nbytes, "region": None}

    def run(key: str) -> list:
        return [{"op": "run", "fragment": key}, {"op": "free", "tensors": frags[key]["outputs"]}]

    doc["transfers"] = [transfer("x", b, a, small)]
    swap_a = swap_b = []
    if exchange:
        doc["transfers"] += [transfer("h", a, b, halo), transfer("h", b, a, halo)]
        swap_a = [{"op": "send", "tensor": "h", "to": b, "as": "ha"}, {"op": "recv", "tensor": "hb", "from": b}]
        swap_b = [{"op": "send", "tensor": "h", "to": a, "as": "hb"}, {"op": "recv", "tensor": "ha", "from": a}]
    host = [{"op": "recv", "tensor": t, "from": "@host"} for t in ("x", "e", "h")]
    doc["steps"] = {
        a: [*host, *run("a1") * runs_before, *swap_a, *run("a2"), {"op": "recv", "tensor": "fin", "from": b},
            {"op": "run", "fragment": "f0"}, {"op": "send", "tensor": "y", "to": "@host"}],
        b: [*host, *run("b1") * runs_before, *swap_b, *run("b2"), {"op": "send", "tensor": "x", "to": a, "as": "fin"}],
    }
    path.write_text(json.dumps(doc))
    return path


def measure(channels: int, halo: int, requests: int, runs_before: int = 1) -> dict:
    """Median latencies of the build without and with the exchange, one request of each in turn."""
    rng = np.random.default_rng(0)
    feeds = {"x": np.ones((1, fixed.SMALL_BYTES // 4), np.float32),
             "e": rng.standard_normal((1, channels, *MAP), dtype=np.float32) * 0.5,
             "h": np.ones((1, halo // 4), np.float32)}
    with tempfile.TemporaryDirectory(prefix="edgec-exchange-") as tmp:
        folders = [Path(tmp) / "without", Path(tmp) / "with"]
        for f in folders:
            f.mkdir()
        manifests = [load_manifest(build(folders[0], channels, halo, False, runs_before)),
                     load_manifest(build(folders[1], channels, halo, True, runs_before))]
        with WorkerPool(manifests[0], threads=1, timeout=60.0) as without, \
                WorkerPool(manifests[1], threads=1, timeout=60.0) as with_:
            clusters = (without, with_)
            for _ in range(WARMUP):
                for c in clusters:
                    c.infer(feeds)
            times: tuple[list, list] = ([], [])
            for _ in range(requests):
                for c, out in zip(clusters, times):
                    t = time.perf_counter()
                    c.infer(feeds)
                    out.append((time.perf_counter() - t) * 1e3)
    without_ms, with_ms = statistics.median(times[0]), statistics.median(times[1])
    return {"channels": channels, "weight_bytes": weight_bytes(channels), "halo_bytes": halo, "runs_before": runs_before,
            "without_ms": without_ms, "with_ms": with_ms, "step_ms": with_ms - without_ms}


def host_profile(folder: Path) -> Path:
    path = folder / "host-1t.yaml"
    log("profiling this host at 1 thread (edgec profile --threads 1)")
    done = subprocess.run([*EDGEC, "profile", "--threads", "1", "-o", str(path)], stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"edgec profile --threads 1: exit {done.returncode}")
    return path


def pricer(profile: Path, folder: Path):
    """H bytes -> the planner's price of one transfer between two devices of `profile` on NETWORK."""
    doc = {"devices": [{"name": n, "profile": str(profile.resolve()), "threads": 1} for n in ("a", "b")],
           "network": NETWORK}
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    net = NetworkModel(load_cluster(path))
    return lambda nbytes: net.transfer_ms(nbytes, "a", "b")


def table(rows: list[dict]) -> str:
    lines = ["| C | weights MB | halo bytes | without ms | with ms | step ms | priced ms | step / priced |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['channels']} | {r['weight_bytes'] / 1e6:.2f} | {r['halo_bytes']} | {r['without_ms']:.3f} | "
                     f"{r['with_ms']:.3f} | {r['step_ms']:.3f} | {r['priced_ms']:.3f} | "
                     f"{r['step_ms'] / r['priced_ms']:.2f} |")
    return "\n".join(lines)


def int_list(ap: argparse.ArgumentParser, text: str, name: str, lo: int, multiple: int = 1) -> list[int]:
    """A comma-separated list of integers of at least `lo`, each a multiple of `multiple` (else argparse's error:
    one line after the usage, exit 2)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        ap.error(f"--{name}: a comma-separated list of integers, got {text!r}")
    if not values or any(v < lo or v % multiple for v in values):
        ap.error(f"--{name}: every value must be at least {lo}" + (f" and a multiple of {multiple}" if multiple > 1
                                                                   else "") + f", got {text!r}")
    return values


def checked_profile(ap: argparse.ArgumentParser, path: Path) -> None:
    """--profile must load and hold the runtime's message figures, which the price is made of (without them
    the planner prices the wire alone, and so would this)."""
    try:
        prof = load_profile(str(path))
    except UserError as exc:
        ap.error(f"--profile: {exc}")
    if not prof.runtime:
        ap.error(f"--profile: {path} has no runtime: figures (message_ms ...); make one with `edgec profile`")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--channels", default="64,128,224,320", help="the fragments' channels C (comma-separated)")
    ap.add_argument("--bytes", default="64,114688", help="halo sizes H in bytes, multiples of 4 (comma-separated)")
    ap.add_argument("--requests", type=int, default=300, help="timed requests of each build (median)")
    ap.add_argument("--runs-before", type=int, default=1, help="runs of the first fragment before the exchange")
    ap.add_argument("--profile", type=Path, help="a profile with runtime figures (default: profile this host)")
    ap.add_argument("--json", dest="json_out", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    channels = int_list(ap, args.channels, "channels", 1)
    sizes = int_list(ap, args.bytes, "bytes", 4, multiple=4)  # float32 elements
    if args.requests < 1 or args.runs_before < 1:
        ap.error("--requests and --runs-before must be at least 1")
    if args.profile is not None:
        checked_profile(ap, args.profile)
    if args.json_out is not None and not args.json_out.resolve().parent.is_dir():
        ap.error(f"--json: folder {args.json_out.resolve().parent} does not exist")
    with tempfile.TemporaryDirectory(prefix="edgec-exchange-bench-") as tmp:
        profile = args.profile or host_profile(Path(tmp))
        price = pricer(profile, Path(tmp))
        rows = []
        for c in channels:
            for h in sizes:
                log(f"C = {c} ({weight_bytes(c) / 1e6:.2f} MB of weights per fragment), H = {h} bytes: "
                    f"{args.requests} requests of each build")
                row = measure(c, h, args.requests, args.runs_before)
                row["priced_ms"] = price(h)
                log(f"  step {row['step_ms']:.3f} ms, priced {row['priced_ms']:.3f} ms")
                rows.append(row)
    print("# Halo exchange steps in a plan against their price (two local workers, 1 thread each)\n")
    print(table(rows))
    if args.json_out:
        args.json_out.write_text(json.dumps({"profile": str(profile), "network": NETWORK, "requests": args.requests,
                                             "runs_before": args.runs_before, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
