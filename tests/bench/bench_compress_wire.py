"""Benchmark (issue 10, item 6): what `edgec run --compress` gains on a shaped link between two workers.

Run (as root, with iproute2; see tests/netbed.py):

    python tests/bench/bench_compress_wire.py [--model resnet50] [--mbps 10[,1000]] [--plan-mbps 100]
                                              [--modes none,zstd,auto] [--repeat 10] [--rounds 3] [--json FILE]

Setup, for each bandwidth in --mbps: a tests/netbed.py testbed with an unshaped coordinator host and two device
hosts whose link is shaped to that bandwidth; an `edgec worker --threads 1` on each device host, with only its
own secret key (README's three steps). The model is compiled as a two-stage pipeline (`--strategy pipeline
--objective throughput`, both devices `profiles/rpi5.yaml`) for a --plan-mbps network: at 10 Mbps the planner
would cut ResNet-50 after its global pool (8 KB, nothing to compress), at 100 Mbps it cuts mid-network (a
784 KB activation), the case where compression matters. The manifest's network is then set to the testbed's
bandwidth, so that `auto` judges the link that is really there.

For each mode: `edgec run --inflight 1 --repeat N --verify --compress MODE --json --output FILE` from the
coordinator host, --rounds times, the modes interleaved (this machine is shared: load that comes and goes
lands on every mode alike). Reported per request (the warm-up request included in the byte counts): median latency and
throughput; the device-to-device bytes raw and as sent (counted by the workers: their bytes_sent[_raw] less the
model outputs, which go to the coordinator raw); the bytes the device hosts put on their shaped links (tbf
counters: frames with TCP/IP/Ethernet headers, acknowledgements included); the sender's compress and the
receiver's decompress time. Every mode's outputs must equal `none`'s bit for bit.

Markdown to stdout, progress to stderr; exit 0 when every run verified and matched `none`, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: tests.* are imported from the checkout
    sys.path.insert(0, str(ROOT))

from edgec import models  # noqa: E402
from edgec.runtime.wire.compress import MODES  # noqa: E402
from tests import netbed  # noqa: E402
from tests.e2e.netbed_cluster import (ClusterError, cluster_doc, deal_keys, keygen, run_json, shaped_bytes,  # noqa: E402
                                      start_workers, write_yaml)
from tests.netbed import Testbed  # noqa: E402
import benchlib  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

DEVICES = ("dev-a", "dev-b")
PORT = 7100
THREADS = 1
PROFILE = ROOT / "profiles" / "rpi5.yaml"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def output_bytes(report: dict) -> int:
    return sum(int(np.prod(o["shape"], dtype=np.int64)) * np.dtype(o["dtype"]).itemsize for o in report["outputs"])


def set_network(manifest: Path, mbps: float) -> None:
    """The runtime's network description (what `auto` and --emulate read) made to match the testbed."""
    doc = json.loads(manifest.read_text())
    doc["network"]["bandwidth_mbps"] = mbps
    for link in doc["network"]["links"]:
        link["bandwidth_mbps"] = mbps
    manifest.write_text(json.dumps(doc, indent=1))


class Bench:
    def __init__(self, tb: Testbed, tmp: Path, coord_keys: Path, mbps: float, args: argparse.Namespace):
        self.tb, self.tmp, self.coord_keys, self.mbps, self.args = tb, tmp, coord_keys, mbps, args

    def compile(self) -> Path:
        plan_cluster = write_yaml(self.tmp / f"plan-{self.mbps:g}.yaml",
                                  cluster_doc(self.tb, {d: str(PROFILE) for d in DEVICES}, self.args.plan_mbps, PORT))
        out = self.tmp / f"{self.args.model}-{self.mbps:g}"
        summary, seconds = run_json(self.tb, "coord", ["compile", str(models.ensure(self.args.model)), "--devices",
                                                       str(plan_cluster), "-o", str(out), "--strategy", "pipeline",
                                                       "--objective", "throughput"], timeout=1800)
        busy = [d["name"] for d in summary["devices"] if d["fragments"]]
        if len(busy) != 2:
            raise ClusterError(f"the plan uses {busy}, not both devices: nothing crosses the link")
        set_network(out / "manifest.json", self.mbps)
        log(f"  compiled in {seconds:.1f} s for {self.args.plan_mbps:g} Mbps: {summary['bytes_transferred']} B "
            f"between the devices per request; the manifest's network set to {self.mbps:g} Mbps")
        return out

    def run(self, build: Path, mode: str, round_: int) -> dict:
        before = {d: shaped_bytes(self.tb, d) for d in DEVICES}
        outputs = self.tmp / f"out-{self.mbps:g}-{mode}-{round_}.npz"
        report, seconds = run_json(self.tb, "coord", ["run", str(build), "--keys", str(self.coord_keys),
                                                      "--random-inputs", "--verify", "--inflight", "1", "--repeat",
                                                      str(self.args.repeat), "--compress", mode, "--output",
                                                      str(outputs)], timeout=180 + 60 * self.args.repeat)
        links = sum(shaped_bytes(self.tb, d) - before[d] for d in DEVICES)
        if not report["verify"]["passed"]:
            raise ClusterError(f"{mode}: outputs did not verify: {report['verify']}")
        devices = report["devices"].values()
        requests = max(d.get("requests", 0) for d in devices)
        outs = output_bytes(report) * requests  # sent raw to the coordinator by the collecting device
        raw = sum(d.get("bytes_sent_raw", 0) for d in devices) - outs
        wire = sum(d.get("bytes_sent", 0) for d in devices) - outs
        log(f"  {mode}: {seconds:.1f} s, median latency {report['latency_ms']:.1f} ms, {wire / requests / 1e3:.1f} "
            f"of {raw / requests / 1e3:.1f} kB per request sent, verified")
        return {"latencies_ms": report["latencies_ms"], "throughput_ips": report["throughput_ips"],
                "requests": requests, "raw": raw, "sent": wire, "links": links,
                "compress_ms": sum(d.get("compress_ms", 0.0) for d in devices),
                "decompress_ms": sum(d.get("decompress_ms", 0.0) for d in devices),
                "sends_compressed": sum(d.get("sends_compressed", 0) for d in devices), "outputs": str(outputs)}

    def measure(self) -> list[dict]:
        """Every mode in every round, the order rotated each round: on a shared machine, load that comes
        and goes then lands on every mode alike."""
        build = self.compile()
        modes = self.args.modes
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for round_ in range(self.args.rounds):
            for mode in modes[round_ % len(modes):] + modes[:round_ % len(modes)]:
                runs[mode].append(self.run(build, mode, round_))
        rows = [self.combine(mode, runs[mode]) for mode in modes]
        base = runs.get("none")
        for row in rows:
            row["bitwise_equal_to_none"] = None if base is None else all(
                _same_npz(r["outputs"], base[0]["outputs"]) for r in runs[row["mode"]])
            row["speedup_vs_none"] = None if base is None else rows[modes.index("none")]["latency_ms"] / row["latency_ms"]
        return rows

    def combine(self, mode: str, runs: list[dict]) -> dict:
        requests = sum(r["requests"] for r in runs)
        latencies = [ms for r in runs for ms in r["latencies_ms"]]
        return {"mode": mode, "mbps": self.mbps, "latency_ms": statistics.median(latencies),
                "latencies_ms": latencies, "throughput_ips": statistics.median(r["throughput_ips"] for r in runs),
                "requests": requests, **{f"{k}_per_request": sum(r[k] for r in runs) / requests
                                         for k in ("raw", "sent", "links", "compress_ms", "decompress_ms")},
                "sends_compressed": sum(r["sends_compressed"] for r in runs)}


def _same_npz(a: str, b: str) -> bool:
    with np.load(a) as x, np.load(b) as y:
        return set(x.files) == set(y.files) and all(
            x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]) for k in x.files)


def bench_bandwidth(mbps: float, tmp: Path, args: argparse.Namespace) -> list[dict]:
    with Testbed(["coord", *DEVICES], mbps, unshaped=["coord"]) as tb:
        keygen(tb, "coord", tmp / "keys", DEVICES)
        dealt = deal_keys(tmp / "keys", tmp / "machines", ["coordinator", *DEVICES])
        workers = start_workers(tb, {d: dealt[d] for d in DEVICES}, tmp, port=PORT, threads=THREADS)
        try:
            log(f"{args.model} at {mbps:g} Mbps (load average {loadavg()})")
            return Bench(tb, tmp, dealt["coordinator"], mbps, args).measure()
        except ClusterError as exc:
            tails = {n: w.log().strip().splitlines()[-5:] for n, w in workers.items()}
            raise ClusterError(f"{exc}\nworker logs: {json.dumps(tails, indent=1)}") from None
        finally:
            for w in workers.values():
                w.stop()


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def table(rows: list[dict]) -> str:
    head = ("| Mbps | --compress | latency ms (median) | vs none | req/s | kB raw/req | kB sent/req | sent/raw "
            "| kB on links/req | compress ms/req | decompress ms/req | = none |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['mbps']:g} | {r['mode']} | {_f(r['latency_ms'], '.1f')} | {_f(r['speedup_vs_none'], '.2f')}x "
                     f"| {_f(r['throughput_ips'], '.2f')} | {_f(r['raw_per_request'] / 1e3, '.1f')} "
                     f"| {_f(r['sent_per_request'] / 1e3, '.1f')} "
                     f"| {_f(r['sent_per_request'] / r['raw_per_request'] if r['raw_per_request'] else math.nan, '.2f')} "
                     f"| {_f(r['links_per_request'] / 1e3, '.1f')} | {_f(r['compress_ms_per_request'], '.1f')} "
                     f"| {_f(r['decompress_ms_per_request'], '.1f')} | {'yes' if r['bitwise_equal_to_none'] else 'NO'} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50", help="a model of edgec.models (default resnet50)")
    ap.add_argument("--mbps", default="10", help="comma-separated bandwidths of the device link (default 10)")
    ap.add_argument("--plan-mbps", type=float, default=100.0,
                    help="the bandwidth the plan is compiled for: it decides where the model is cut (default 100)")
    ap.add_argument("--modes", default="none,zstd,auto", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--repeat", type=int, default=10, help="timed requests per run (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every mode, interleaved (default 3)")
    ap.add_argument("--json", dest="json_file", help="also write the rows here")
    args = ap.parse_args(argv)
    args.mbps_list = [float(x) for x in args.mbps.split(",")]
    args.modes = [m.strip() for m in args.modes.split(",")]
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        ap.error(f"--modes: {bad[0]!r} is not one of {', '.join(MODES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = netbed.unavailable_reason()
    if reason:
        log(f"cannot build the testbed: {reason}")
        return 1
    rows, started = [], time.perf_counter()
    log(f"load average before: {loadavg()}")
    with tempfile.TemporaryDirectory(prefix="bench-compress-") as tmp:
        for mbps in args.mbps_list:
            folder = Path(tmp) / f"{mbps:g}"
            folder.mkdir()
            try:
                rows += bench_bandwidth(mbps, folder, args)
            except ClusterError as exc:
                log(f"{mbps:g} Mbps: FAILED: {exc}")
                return 1
        ok = all(r["bitwise_equal_to_none"] is not False for r in rows)
        print(f"{args.model}, two-stage pipeline planned for {args.plan_mbps:g} Mbps, `edgec run --inflight 1 "
              f"--repeat {args.repeat}` x {args.rounds} interleaved rounds (latency: median of all), workers at "
              f"--threads 1; load average after: {loadavg()}, "
              f"{time.perf_counter() - started:.0f} s in all\n")
        print(table(rows))
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(benchlib.recorded(main))
