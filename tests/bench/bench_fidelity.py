"""Prediction fidelity on this host (issue 11, item 4): predicted against measured, one and two local devices,
and whether `edgec profile` agrees with itself.

    python tests/bench/bench_fidelity.py [--parts single,two,stability,testbed,hetero] [--profile HOST.yaml]
                                         [--repeat 10] [--warmup 5] [--rounds 5] [--models resnet50,...]
                                         [--two-models resnet50,...] [--baseline-profile OLD.yaml]
                                         [--testbed-mbps 100,1000] [--pairs 1] [--hetero-models squeezenet,...]
                                         [--hetero-shares 0.9,0.45,0.25] [--hetero-mbps 1000] [--cpu-weight 5000] [--no-recheck] [--quick]
                                         [--folder DIR] [--json FILE]

The default --parts is single,two,stability; testbed and hetero (as root) are asked for by name.

Markdown to stdout, progress to stderr; --json FILE writes every row, the load and the probes.  The targets
are reported, not enforced (exit 0 whenever every command ran): they are for a quiet machine, and on a busy one
the measured times, and the profile itself, move with the other load, so the load is printed beside them.
Not collected by pytest: the name does not start with test_.

Profile (parts single, two and testbed).  This host at 1 thread (`edgec profile --threads 1`), unless --profile
gives a profile made so, with the machine's load around it (load average before and after, and the profile's own
load verdict, its worst timing spread and its warnings).

Parts (each module's docstring says what it measures, how, and its target): single
(fidelity_part_single.py), two (fidelity_part_two.py), stability (fidelity_part_stability.py), testbed
(fidelity_part_testbed.py, deployed by fidelity_testbed.py) and hetero (fidelity_part_hetero.py: devices of
different CPU shares, each profiled in its own cgroup, deployed by fidelity_hetero_cluster.py); their shared plumbing (edgec, profiles, clusters,
compile, run and verify) is fidelity_common.py.

Outputs (parts single and two): after its timed runs, every build measured (each model's single-device build,
each two-device plan) runs once more, untimed, with `edgec run --random-inputs --verify` over 2 requests: its
outputs must match the source model run whole in onnxruntime, or the benchmark stops (a plan that computes
something else has no speed worth reporting).  Verifying apart keeps the timed runs free of the check's cost.
Part testbed verifies every run itself.

Every cluster of parts single, two and testbed says that its devices' workers and the coordinator share this machine (`hosts:`, its cores), as
`edgec run` starts them here: that bounds the throughput the planner predicts by this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import yaml

import fidelity_common  # tests/bench is sys.path[0] when run as a script
from benchlib import recorded
from fidelity_common import (NETWORK, WARMUP, cluster, loadavg, log, model_path, one_thread_figures, profile_host,
                             profile_load, top_level_only)
from fidelity_part_hetero import CPU_WEIGHT as HETERO_CPU_WEIGHT
from fidelity_part_hetero import MBPS as HETERO_MBPS
from fidelity_part_hetero import MODELS as HETERO_MODELS
from fidelity_part_hetero import QUICK_MODELS as HETERO_QUICK_MODELS
from fidelity_part_hetero import SHARES as HETERO_SHARES
from fidelity_part_hetero import bench_hetero, hetero_text, parse_shares
from fidelity_part_single import bench_single, single_table
from fidelity_part_stability import bench_stability, pairs_summary, stability_text
from fidelity_part_testbed import bench_testbed, testbed_text  # puts tests.* on sys.path
from fidelity_part_two import bench_two, two_summary, two_table
from fidelity_testbed import SINGLE_DEVICE, THREADS
from tests import netbed

MODELS = ("resnet50", "vgg16", "inception_v1", "mobilenetv2", "transformer")
TWO_MODELS = ("resnet50", "vgg16", "mobilenetv2")
PARTS = ("single", "two", "stability", "testbed", "hetero")
DEFAULT_PARTS = ("single", "two", "stability")
TESTBED_MBPS = (100, 1000)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--profile", type=Path, help="a profile made with `edgec profile --threads 1` (default: make one)")
    ap.add_argument("--repeat", type=int, default=10, help="requests per measurement at least (median; runs last a second at the predicted rate)")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="untimed requests before each measurement")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds (median): part single, every model in turn; parts two and testbed, alternating "
                    "single/two-device")
    ap.add_argument("--models", default=",".join(MODELS), help="part single: comma-separated names under models/build")
    ap.add_argument("--two-models", default=",".join(TWO_MODELS),
                    help="parts two, testbed and stability (what each profile predicts): comma-separated names "
                    "under models/build")
    ap.add_argument("--testbed-mbps", default=",".join(map(str, TESTBED_MBPS)),
                    help="part testbed: the device link's bandwidths, one testbed each (comma-separated Mbps)")
    ap.add_argument("--baseline-profile", type=Path, help="part two: also predict with this 1-thread profile, "
                    "side by side with the same measurements")
    ap.add_argument("--pairs", type=int, default=1, help="part stability: pairs of back-to-back profiles, one "
                    "after another (each about a minute)")
    ap.add_argument("--hetero-models", help="part hetero: comma-separated names under models/build (default "
                    f"{','.join(HETERO_MODELS)}; with --quick {','.join(HETERO_QUICK_MODELS)})")
    ap.add_argument("--hetero-shares", default=",".join(map(str, HETERO_SHARES)),
                    help="part hetero: each device host's CPU share in cores (a CFS quota), comma-separated")
    ap.add_argument("--hetero-mbps", type=float, default=HETERO_MBPS,
                    help="part hetero: the device links' bandwidth (Mbps, switched)")
    ap.add_argument("--cpu-weight", type=int, default=HETERO_CPU_WEIGHT, metavar="W",
                    help="part hetero: every testbed host's CPU weight (1-10000; 0 leaves the kernel's), so that "
                    "other jobs on a shared machine take less of the hosts' quotas")
    ap.add_argument("--no-recheck", dest="recheck", action="store_false", help="part hetero: do not profile every "
                    "device again after the runs (the check that the machine held still; about as long as the "
                    "profiles before)")
    ap.add_argument("--quick", action="store_true", help="part hetero: profile the devices with `edgec profile "
                    "--quick` (noisier figures, minutes sooner) and default --hetero-models to tiny models")
    ap.add_argument("--folder", type=Path, help="work folder, kept (it grows to several GB: the builds and the "
                    "workers' caches); default: a temporary one, removed at the end")
    ap.add_argument("--json", dest="json_out", type=Path, help="also write every row, the load and the probes as JSON")
    args = ap.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        ap.error(f"--parts {','.join(args.parts)}: choose from {','.join(PARTS)}")
    if args.repeat < 1 or args.rounds < 1 or args.pairs < 1:
        ap.error("--repeat, --rounds and --pairs must be at least 1")
    if args.warmup < 0:
        ap.error("--warmup must be at least 0")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.two_models = [m.strip() for m in args.two_models.split(",") if m.strip()]
    args.testbed_mbps = testbed_bandwidths(ap, args.testbed_mbps)
    try:
        args.hetero_shares = parse_shares(args.hetero_shares, os.cpu_count() or 1)
    except ValueError as exc:
        ap.error(str(exc))
    if not 0 <= args.cpu_weight <= 10_000:
        ap.error(f"--cpu-weight {args.cpu_weight}: 0 (the kernel's) or from 1 to 10000")
    if not 0 < args.hetero_mbps <= netbed.MAX_MBPS:
        ap.error(f"--hetero-mbps {args.hetero_mbps:g}: must be in (0, {netbed.MAX_MBPS:g}]")
    default = HETERO_QUICK_MODELS if args.quick else HETERO_MODELS
    args.hetero_models = [m.strip() for m in (args.hetero_models or ",".join(default)).split(",") if m.strip()]
    two = bool({"two", "testbed", "stability"} & set(args.parts))
    for name in args.models * ("single" in args.parts) + args.two_models * two + \
            args.hetero_models * ("hetero" in args.parts):
        model_path(name)  # a missing model fails now, not after minutes of measuring
    return args


def testbed_bandwidths(ap: argparse.ArgumentParser, text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--testbed-mbps {text}: expected numbers separated by commas")
    if not values or any(not 0 < v <= netbed.MAX_MBPS for v in values):
        ap.error(f"--testbed-mbps {text}: each bandwidth must be in (0, {netbed.MAX_MBPS:g}] Mbps")
    return values


def host_profile(args: argparse.Namespace, folder: Path) -> tuple[Path, dict, dict]:
    """The 1-thread profile parts single, two and testbed predict with; its load record; its document."""
    if args.profile is None:
        log("profiling this host at 1 thread ...")
        path = folder / "host-1t.yaml"
        around = profile_host(path)
    else:
        path, around = args.profile, None
    doc = yaml.safe_load(path.read_text())
    one_thread_figures(doc, path)
    return path, {"profile": str(path), "loadavg_around_profile": around, "cpus": os.cpu_count(), **profile_load(doc)}, doc


def terminated(signum: int, frame) -> None:
    """SIGTERM (a `timeout`, a CI job cancelled) unwinds like Ctrl-C: the testbeds' `with` blocks then stop their
    workers and remove their namespaces and cgroups, and the work folder goes, where the default action would
    leave them all behind."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, terminated)
    fidelity_common.WARMUP = args.warmup  # run_json's untimed requests
    if args.folder is not None:
        args.folder.mkdir(parents=True, exist_ok=True)
        return run_parts(args, args.folder)
    folder = Path(tempfile.mkdtemp(prefix="edgec-fidelity-"))
    try:  # the builds take several GB (VGG-16's fragments, the workers' caches): not left behind
        return run_parts(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_parts(args: argparse.Namespace, folder: Path) -> int:
    out: dict = {"repeat": args.repeat, "warmup": args.warmup, "parts": args.parts, "loadavg_start": loadavg()}
    print(f"# Prediction fidelity: {os.cpu_count()} CPUs, load average at start {out['loadavg_start']}, "
          f"at least {args.repeat} requests per measurement (and a second's worth at the predicted rate) after "
          f"{args.warmup} untimed\n")
    if {"single", "two", "testbed"} & set(args.parts):
        prof, load, doc = host_profile(args, folder)
        out["load"] = load
        print(f"Profile {prof} (1 thread): verdict {load['verdict']}, other processes used "
              f"{load['other_cpus_before']} CPUs before and {load['other_cpus_during']} during; timing spread median "
              f"{load['median_spread']} / worst {load['max_spread']}, unstable timings {len(load['unstable'])}; "
              f"load average around it {load['loadavg_around_profile']}")
        for w in load["warnings"]:
            print(f"Profile warning: {w}")
        one = cluster(folder, "after", prof)
    if "single" in args.parts:
        clusters = {"before": cluster(folder, "before", top_level_only(doc, folder)), "after": one}
        out["single"] = bench_single(args.models, folder, clusters, args.repeat, args.rounds)
        print("\n## Single device, 1 thread\n")
        print(f"Load average during the runs: {[r['loadavg_during'] for r in out['single']]}\n")
        print(single_table(out["single"]))
    if "two" in args.parts:
        two = cluster(folder, "two", prof, devices=2)
        base = None
        if args.baseline_profile is not None:
            one_thread_figures(yaml.safe_load(args.baseline_profile.read_text()), args.baseline_profile)
            base = (cluster(folder, "one-baseline", args.baseline_profile),
                    cluster(folder, "two-baseline", args.baseline_profile, devices=2))
            print(f"Baseline profile {args.baseline_profile}: runtime {yaml.safe_load(args.baseline_profile.read_text()).get('runtime')}")
        out["two"] = bench_two(args.two_models, folder, one, two, args.repeat, args.rounds, base)
        cap = out["two"]["capacity"]
        print(f"\n## Two local devices, 1 thread each ({NETWORK['bandwidth_mbps']} Mbps {NETWORK['medium']}, latency "
              f"{NETWORK['latency_ms']} ms; {args.rounds} alternating rounds, medians)\n")
        rounds = {r["model"]: r["loadavg_rounds"] for r in out["two"]["rows"]}
        print(f"Load average at the start of each round: {'; '.join(f'{m} {v}' for m, v in rounds.items()) or 'n/a'}\n")
        print(two_table(out["two"]["rows"]) + "\n")
        print(two_summary(out["two"]["rows"], out["two"]["unmeasured"], cap))
    if "testbed" in args.parts:
        out["testbed"] = bench_testbed(args.two_models, folder, prof, args.testbed_mbps, args.repeat, args.rounds,
                                       args.warmup)
        print(f"\n## Two devices on a network testbed, a worker at {THREADS} thread each (tests/netbed.py, switched; "
              f"{args.rounds} alternating rounds, medians; single device: {SINGLE_DEVICE})\n")
        print(testbed_text(out["testbed"]))
    if "hetero" in args.parts:
        out["hetero"] = bench_hetero(args.hetero_models, folder, args.hetero_shares, args.hetero_mbps, args.repeat,
                                     args.rounds, args.warmup, args.quick, args.cpu_weight or None,
                                     recheck=args.recheck)
        shares = ", ".join(f"{d} {s:g}" for d, s in out["hetero"].get("shares", {}).items())
        print(f"\n## Devices of different CPU shares on a network testbed ({shares or 'n/a'} cores, a worker at 1 "
              f"thread each, {args.hetero_mbps:g} Mbps switched; {args.rounds} rounds, medians)\n")
        print(hetero_text(out["hetero"]))
    if "stability" in args.parts:
        pairs = [bench_stability(folder, f"pair{k + 1}-" if args.pairs > 1 else "", args.two_models)
                 for k in range(args.pairs)]
        out["stability"] = pairs[0]
        print("\n## `edgec profile --threads 1` twice back to back\n")
        for k, pair in enumerate(pairs):
            print(f"### Pair {k + 1} of {len(pairs)}\n" if len(pairs) > 1 else "", end="")
            print(stability_text(pair) + ("\n" if len(pairs) > 1 else ""))
        if len(pairs) > 1:
            out["stability_pairs"] = pairs
            print(pairs_summary(pairs))
    out["loadavg_end"] = loadavg()
    print(f"\nLoad average at the end: {out['loadavg_end']}")
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(recorded(main))
