"""Benchmark (issue 43, item 6): a decoder LM across devices, planned, measured on the testbed, and pipelined.

Run (parts 2 and 3 as root, with iproute2 and cgroups; see tests/netbed.py and tests/netbed_limits.py):

    python tests/bench/bench_generate.py [--quick] [--parts plan,measure,inflight] [--model lm500m]
        [--models-dir DIR] [--max-context N] [--prompt-len P] [--json FILE]

lm500m is built only on request (`python -m edgec.models build -o DIR --only lm500m`); --models-dir (or
$EDGEC_MODELS_DIR) says where.  --quick plans tinylm and runs shorter generations.

1. plan (compile only): --model (lm500m; tinylm with --quick) priced for `--generate` at --max-context and
   --prompt-len on two clusters of shipped profiles at 100 Mbps: 2x rpi5 + 2x rpi4 + phone ("hetero"), and the
   same profiles with memory_mb overridden so that no single device holds the model and its caches at
   --max-context ("split-only"; each device gets 45% of what the whole model needs).  For each objective
   (latency: time per output token of one sequence; throughput: tokens/s with sequences in flight) `auto`,
   `ring-memory` and `equal-layers`, all on the same cost table (compiler/plan's registry, as `edgec compile`
   plans): predicted tokens/s (of one sequence, 1000 / TPOT, and with sequences in flight), TPOT and TTFT.
   Target: on hetero, auto >= 1.3x each baseline's predicted tokens/s (latency: one sequence's; throughput:
   with sequences in flight).
2. measure: a tests/netbed.py testbed of an unshaped coordinator host and device hosts with CPU quotas of
   0.6, 0.4 and 0.3 cores and a heavy CPU weight (--cpu-weight; the coordinator host gets it too), each
   profiled in its own cgroup (fidelity_hetero_cluster.profile_in_host), an `edgec worker --threads 1` on each
   (keys dealt out as a deployment would).  tinylm (and --model with --measure-model) compiled with
   --generate for those profiles, for latency and for throughput, and with --strategy even (a stage on every
   host, whatever auto chooses: tinylm fits one host, and auto may keep it there); `edgec generate --json` on
   the coordinator host with its keys (the addresses are the cluster file's testbed addresses): measured TPOT
   at S = 1 against the latency build's predicted TPOT, and measured tokens/s at S = the throughput build's
   stage count against its predicted tokens/s (the even build, both).  --max-context is set to prompt + new tokens, so that the priced context (the
   middle of a generation) is the measured one's middle.  Target: within 15%.
3. inflight: 4 device hosts of 0.35 cores each (one profiled for all), --inflight-model (lm500m; tinylm with
   --quick) compiled for throughput; if `auto` does not split it in 4 stages, `--strategy even` forces 4 of
   equal compute (the table says which; equal layer counts would leave the LM head's stage the bottleneck,
   which caps the gain near 1.6x).  `edgec generate` with S = 1, 2, 4, 8: tokens/s and the gain over S = 1.
   Target: S = 4 >= 2.5x S = 1.  Why not tinylm: a quota lets an idle host run its first couple of quotas at
   full speed (cost/quota_burst.py), and a tinylm stage's step (about a millisecond) fits in that burst, so
   one sequence runs at full speed and only sequences in flight meet the share: at 0.35 cores the gain cannot
   pass about 4 x 0.35.  A real slow device is slow for every step; an lm500m stage's step, tens of
   milliseconds, is paced by the share as one would be.

Time: part plan on lm500m takes about 2 minutes (most of it reading the model); the testbed parts are mostly
profiling: without --quick, about 5 minutes for the 0.6-core host and longer for smaller quotas (the four
profiles near 35 minutes on a loaded 2-core machine), with --quick about 1 to 2.5 minutes each.

Markdown tables to stdout (every figure, the targets PASS/FAIL), progress to stderr; results through
benchlib.recorded (benchmarks/results/bench_generate.json).  Exit 0 when every target of the parts run holds,
1 otherwise, 2 when a part cannot run here (no testbed, a model not built).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: tests.* are imported from the checkout
    sys.path.insert(0, str(ROOT))

from benchlib import recorded  # noqa: E402  (tests/bench is sys.path[0] when a script runs)
from fidelity_common import EDGEC, loadavg, log  # noqa: E402

NET = {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}
HETERO = [("pi5-a", "rpi5"), ("pi5-b", "rpi5"), ("pi4-a", "rpi4"), ("pi4-b", "rpi4"), ("phone", "phone")]
STRATEGIES = ("auto", "ring-memory", "equal-layers")
OBJECTIVES = ("latency", "throughput")
SPLIT_SHARE = 0.45  # the split-only cluster: each device holds this share of the whole model's need
MEASURE_SHARES = (0.6, 0.4, 0.3)
INFLIGHT_SHARE, INFLIGHT_DEVICES, INFLIGHT_S = 0.35, 4, (1, 2, 4, 8)
CPU_WEIGHT = 5000
PLAN_GAIN, WITHIN, INFLIGHT_GAIN = 1.3, 0.15, 2.5  # issue 43's targets
# Part inflight on a model larger than tinylm: a shorter generation (prompt, new tokens), its steps being slower.
INFLIGHT_LENGTHS = (16, 32)


class Unavailable(Exception):
    """A part cannot run on this machine (exit 2)."""


def model_path(name: str, models_dir: str | None) -> Path:
    folder = Path(models_dir or os.environ.get("EDGEC_MODELS_DIR") or ROOT / "models" / "build")
    path = folder / f"{name}.onnx"
    if not path.exists():
        raise Unavailable(f"{path}: not built (python -m edgec.models build -o {folder} --only {name})")
    return path


# -- part 1: planning --------------------------------------------------------------------------------------
def priced(model: Path, cluster: Path, gen):
    """(the decode step's graph, the generative cost table of `model` on `cluster`), by the very function `edgec
    compile --generate` prices with (driver._price), so that the figures here are the CLI's (test_bench_generate
    compares them with `edgec compile --json`)."""
    from edgec.compiler.cluster import load_cluster
    from edgec.compiler.driver import _price
    from edgec.compiler.ingest.phases import load_phases

    phases = load_phases(model, gen)
    return phases.decode.graph, _price(phases.decode, phases, load_cluster(cluster))


def whole_need_mb(model: Path, folder: Path, gen) -> float:
    """MiB one device needs to hold the whole model and its caches at the max context (cost/memory.py)."""
    from edgec.compiler.cost.memory import device_memory_bytes
    from edgec.compiler.plan.choose import plan_model

    cluster = write_cluster(folder / "one.yaml", [("big", "edge-server")], {})
    graph, cost = priced(model, cluster, gen)
    chosen, _ = plan_model(graph, cost, "single", "latency")
    return max(device_memory_bytes(chosen.plan, graph, cost.generate).values()) / (1 << 20)


def write_cluster(path: Path, devices, memory: dict[str, float]) -> Path:
    doc = {"devices": [{"name": n, "profile": p, **({"memory_mb": round(memory[p], 1)} if p in memory else {})}
                       for n, p in devices], "network": NET}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def split_only_memory(need_mb: float) -> dict[str, float]:
    """memory_mb per profile so that a device's usable memory is SPLIT_SHARE of the whole need."""
    out = {}
    for profile in {p for _, p in HETERO}:
        doc = yaml.safe_load((ROOT / "profiles" / f"{profile}.yaml").read_text())
        overhead = doc.get("runtime_overhead_mb", 0)
        out[profile] = (SPLIT_SHARE * need_mb + overhead) / doc["usable_memory_fraction"]
    return out


def part_plan(a, folder: Path) -> dict:
    from edgec.compiler.ingest.phases import GenerateOptions

    model = model_path(a.model, a.models_dir)
    gen = GenerateOptions(max_context=a.max_context, prompt_len=a.prompt_len)
    need = whole_need_mb(model, folder, gen)
    log(f"plan: {a.model} needs {need:.0f} MiB whole at context {a.max_context}")
    clusters = {"hetero": write_cluster(folder / "hetero.yaml", HETERO, {}),
                "split-only": write_cluster(folder / "split.yaml", HETERO, split_only_memory(need))}
    rows = []
    for cname, cluster in clusters.items():
        graph, cost = priced(model, cluster, gen)
        for objective in OBJECTIVES:
            for strategy in STRATEGIES:
                log(f"plan: {cname} {objective} {strategy} (load {loadavg()})")
                rows.append({"cluster": cname, **plan_row(graph, cost, objective, strategy)})
    return {"model": a.model, "need_mb": need, "rows": rows}


def plan_row(graph, cost, objective: str, strategy: str) -> dict:
    """One strategy's plan of the priced model (`priced`) as `edgec compile` plans it (plan_model with the CLI's
    planner options): its stages and predicted figures, or the one line of a strategy that finds no plan."""
    from edgec.compiler.errors import UserError
    from edgec.compiler.plan.choose import plan_model

    try:
        chosen, _ = plan_model(graph, cost, strategy, objective)
    except UserError as exc:  # a baseline that finds no plan that fits: reported
        return {"objective": objective, "strategy": strategy, "error": str(exc).splitlines()[0]}
    g = chosen.prediction.generation
    return {"objective": objective, "strategy": strategy, "chose": chosen.strategy,
            "stages": [(s.device, s.hi - s.lo) for s in chosen.plan.stages],
            "tokens_per_s": g["tokens_per_s"], "one_tokens_per_s": 1000.0 / g["tpot_ms"],
            "tpot_ms": g["tpot_ms"], "ttft_ms": g["ttft_ms"]}


def plan_targets(r: dict) -> list[tuple[str, bool, str]]:
    """The latency objective's figure is one sequence's tokens/s (1000 / TPOT); the throughput objective's,
    tokens/s with sequences in flight."""
    out = []
    for objective in OBJECTIVES:
        by = {x["strategy"]: x for x in r["rows"] if x["cluster"] == "hetero" and x["objective"] == objective}
        key = "one_tokens_per_s" if objective == "latency" else "tokens_per_s"
        auto = by["auto"].get(key)
        for base in STRATEGIES[1:]:
            other = by[base].get(key)
            if auto is None:
                out.append((f"hetero {objective}: auto >= {PLAN_GAIN}x {base}", False, "auto found no plan"))
            elif other is None:
                out.append((f"hetero {objective}: auto >= {PLAN_GAIN}x {base}", True, f"{base} found no plan"))
            else:
                out.append((f"hetero {objective}: auto >= {PLAN_GAIN}x {base}", auto >= PLAN_GAIN * other,
                            f"{auto / other:.2f}x ({auto:.2f} against {other:.2f} tokens/s)"))
    return out


def plan_markdown(r: dict) -> list[str]:
    lines = [f"## Planning: {r['model']} (whole: {r['need_mb']:.0f} MiB with its caches)", "",
             "| cluster | objective | strategy | plan | stages (device: layers) | predicted tokens/s, one sequence | "
             "predicted tokens/s, sequences in flight | TPOT ms | TTFT ms |", "|---|---|---|---|---|---:|---:|---:|---:|"]
    for x in r["rows"]:
        if "error" in x:
            lines.append(f"| {x['cluster']} | {x['objective']} | {x['strategy']} | no plan: {x['error']} | | | | | |")
            continue
        stages = ", ".join(f"{d}: {n}" for d, n in x["stages"])
        lines.append(f"| {x['cluster']} | {x['objective']} | {x['strategy']} | {x['chose']} | {stages} | "
                     f"{x['one_tokens_per_s']:.2f} | {x['tokens_per_s']:.2f} | {x['tpot_ms']:.2f} | {x['ttft_ms']:.1f} |")
    return lines


# -- parts 2 and 3: the testbed ----------------------------------------------------------------------------
def testbed_cluster(shares, a, folder: Path):
    """fidelity_hetero_cluster's HeteroCluster with every host at a heavy CPU weight, and devices of one share
    profiled once (the first of them), the others given its profile."""
    from fidelity_hetero_cluster import HeteroCluster
    from tests import netbed

    reason = netbed.unavailable_reason(limits=True)
    if reason:
        raise Unavailable(f"no testbed with CPU quotas: {reason}")
    folder.mkdir(parents=True, exist_ok=True)

    class Weighted(HeteroCluster):
        __test__ = False

        def __init__(self):
            super().__init__(list(shares), 100.0, folder, 0, a.quick, cpu_weight=a.cpu_weight or None)

        def _profile(self, device, share):
            for other, path in self.profiles.items():
                if self.profile_records[other]["share"] == share:
                    log(f"{device}: {other}'s profile (the same {share:g} cores)")
                    return path, {**self.profile_records[other], "device": device}
            return super()._profile(device, share)

    return Weighted()


def compile_generate(model: Path, cluster: Path, out: Path, objective: str, max_context: int, prompt_len: int,
                     strategy: str = "auto") -> dict:
    done = subprocess.run([*EDGEC, "compile", str(model), "--devices", str(cluster), "-o", str(out), "--generate",
                           "--max-context", str(max_context), "--prompt-len", str(prompt_len), "--objective",
                           objective, "--strategy", strategy, "--json"], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"edgec compile exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout)


def generate(hc, build: Path, sequences: int, prompt_len: int, new_tokens: int) -> dict:
    argv = hc._tb.exec_argv("coord", [*EDGEC, "generate", str(build), "--random-prompt", str(prompt_len),
                                      "--max-new-tokens", str(new_tokens), "--sequences", str(sequences),
                                      "--keys", str(hc.coord_keys), "--json"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"edgec generate exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout)


def lengths(a) -> tuple[int, int]:
    return (16, 32) if a.quick else (32, 128)  # prompt, new tokens


# (objective, strategy) of part measure's builds: auto for each objective, and one forced across every host (even:
# equal compute per stage), measured as both, so that a build of several stages is measured whatever auto chooses.
MEASURE_BUILDS = (("latency", "auto"), ("throughput", "auto"), ("throughput", "even"))


def part_measure(a, folder: Path) -> dict:
    prompt, new = lengths(a)
    names = ["tinylm"] + ([a.model] if a.measure_model and a.model != "tinylm" else [])
    rows = []
    with testbed_cluster(MEASURE_SHARES, a, folder / "measure") as hc:
        for name in names:
            model = model_path(name, a.models_dir)
            for objective, strategy in MEASURE_BUILDS:
                build = folder / f"measure-{name}-{objective}-{strategy}"
                s = compile_generate(model, hc.cluster, build, objective, prompt + new, prompt, strategy)
                stages = sum(1 for d in s["devices"] if d["fragments"])
                figures = ["latency", "throughput"] if strategy == "even" else [objective]
                for figure in figures:
                    seqs = 1 if figure == "latency" else stages
                    log(f"measure: {name} {objective} {strategy}: {stages} stage(s), generate S={seqs} "
                        f"(load {loadavg()})")
                    g = generate(hc, build, seqs, prompt, new)
                    predicted, measured = ((s["predicted_tpot_ms"], g["tpot_ms"]) if figure == "latency"
                                           else (s["predicted_tokens_per_s"], g["tokens_per_s"]))
                    rows.append({"model": name, "objective": objective, "stages": stages, "sequences": seqs,
                                 "strategy": s["strategy"], "figure": "TPOT ms" if figure == "latency" else "tokens/s",
                                 "predicted": predicted, "measured": measured,
                                 "predicted_tokens_per_s": s["predicted_tokens_per_s"],
                                 "measured_tokens_per_s": g["tokens_per_s"], "ttft_ms": g["ttft_ms"],
                                 "predicted_ttft_ms": s["predicted_ttft_ms"]})
        profiles = {d: {k: r.get(k) for k in ("share", "cpu_quota", "seconds")} for d, r in hc.profile_records.items()}
    return {"prompt": prompt, "new": new, "rows": rows, "profiles": profiles}


def measure_targets(r: dict) -> list[tuple[str, bool, str]]:
    return [(f"{x['model']} {x['strategy']} ({x['stages']} stages), S = {x['sequences']}: measured {x['figure']} "
             f"within {WITHIN:.0%} of predicted",
             abs(x["measured"] / x["predicted"] - 1) <= WITHIN,
             f"{x['measured']:.2f} against {x['predicted']:.2f} ({x['measured'] / x['predicted'] - 1:+.0%})")
            for x in r["rows"]]


def measure_markdown(r: dict) -> list[str]:
    lines = [f"## Measured against predicted: device hosts at {', '.join(f'{s:g}' for s in MEASURE_SHARES)} cores, "
             f"prompt {r['prompt']}, {r['new']} new tokens", "",
             "| model | objective | plan | stages | S | figure | predicted | measured | measured/predicted | "
             "TTFT ms predicted | TTFT ms measured |", "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for x in r["rows"]:
        lines.append(f"| {x['model']} | {x['objective']} | {x['strategy']} | {x['stages']} | {x['sequences']} | "
                     f"{x['figure']} | {x['predicted']:.2f} | {x['measured']:.2f} | {x['measured'] / x['predicted']:.2f} | "
                     f"{x['predicted_ttft_ms']:.1f} | {x['ttft_ms']:.1f} |")
    lines += ["", "Profiles: " + "; ".join(f"{d} at {p['share']:g} cores ({p['seconds']} s)"
                                           for d, p in r["profiles"].items())]
    return lines


def part_inflight(a, folder: Path) -> dict:
    name = a.inflight_model
    prompt, new = lengths(a) if name == "tinylm" else INFLIGHT_LENGTHS
    model = model_path(name, a.models_dir)
    rows = []
    with testbed_cluster([INFLIGHT_SHARE] * INFLIGHT_DEVICES, a, folder / "inflight") as hc:
        build = folder / "inflight-build"
        s = compile_generate(model, hc.cluster, build, "throughput", prompt + new, prompt)
        forced = sum(1 for d in s["devices"] if d["fragments"]) != INFLIGHT_DEVICES
        if forced:
            log(f"inflight: auto chose {s['strategy']} on fewer than {INFLIGHT_DEVICES} devices: --strategy even")
            s = compile_generate(model, hc.cluster, build, "throughput", prompt + new, prompt, "even")
        stages = sum(1 for d in s["devices"] if d["fragments"])
        for seqs in INFLIGHT_S:
            log(f"inflight: S={seqs} (load {loadavg()})")
            g = generate(hc, build, seqs, prompt, new)
            rows.append({"sequences": seqs, "tokens_per_s": g["tokens_per_s"], "tpot_ms": g["tpot_ms"]})
    return {"model": name, "strategy": s["strategy"], "forced": forced, "stages": stages, "rows": rows,
            "predicted_tokens_per_s": s["predicted_tokens_per_s"], "predicted_tpot_ms": s["predicted_tpot_ms"],
            "prompt": prompt, "new": new}


def inflight_targets(r: dict) -> list[tuple[str, bool, str]]:
    by = {x["sequences"]: x["tokens_per_s"] for x in r["rows"]}
    ok = r["stages"] == INFLIGHT_DEVICES and by[4] >= INFLIGHT_GAIN * by[1]
    return [(f"{INFLIGHT_DEVICES} stages: S = 4 >= {INFLIGHT_GAIN}x S = 1", ok,
             f"{by[4] / by[1]:.2f}x on {r['stages']} stage(s)")]


def predicted_in_flight(r: dict, sequences: int) -> float:
    """Tokens/s the build predicts with `sequences` in flight: each sequence gives a token every TPOT, and all of
    them together no more than one a bottleneck (the predicted tokens/s in flight). So the gain over S = 1 can
    reach at most tokens/s in flight x TPOT / 1000, whatever S: the stages' imbalance caps it."""
    return min(sequences * 1000.0 / r["predicted_tpot_ms"], r["predicted_tokens_per_s"])


def inflight_markdown(r: dict) -> list[str]:
    how = "--strategy even (auto did not split in 4)" if r["forced"] else f"auto ({r['strategy']})"
    base = r["rows"][0]["tokens_per_s"]
    ceiling = predicted_in_flight(r, INFLIGHT_S[-1]) / predicted_in_flight(r, 1)
    lines = [f"## Sequences in flight: {r.get('model', 'tinylm')} on {INFLIGHT_DEVICES} device hosts at {INFLIGHT_SHARE:g} cores, "
             f"{r['stages']} stages by {how}, predicted {r['predicted_tokens_per_s']:.2f} tokens/s in flight and "
             f"{r['predicted_tpot_ms']:.2f} ms TPOT for one (a gain of at most {ceiling:.2f}x)", "",
             "| S | tokens/s | predicted tokens/s | measured/predicted | TPOT ms | gain over S = 1 |",
             "|---:|---:|---:|---:|---:|---:|"]
    for x in r["rows"]:
        predicted = predicted_in_flight(r, x["sequences"])
        lines.append(f"| {x['sequences']} | {x['tokens_per_s']:.2f} | {predicted:.2f} | "
                     f"{x['tokens_per_s'] / predicted:.2f} | {x['tpot_ms']:.2f} | {x['tokens_per_s'] / base:.2f} |")
    return lines


PARTS = {"plan": (part_plan, plan_targets, plan_markdown),
         "measure": (part_measure, measure_targets, measure_markdown),
         "inflight": (part_inflight, inflight_targets, inflight_markdown)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tinylm in part plan, shorter generations, quick profiles")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--model", default=None, help="part plan's model (default lm500m; tinylm with --quick)")
    p.add_argument("--measure-model", action="store_true", help="part measure runs --model too, beside tinylm")
    p.add_argument("--inflight-model", default=None,
                   help="part inflight's model (default --model's, lm500m; tinylm with --quick)")
    p.add_argument("--models-dir", default=None, help="where --model is built (default $EDGEC_MODELS_DIR, models/build)")
    p.add_argument("--max-context", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--cpu-weight", type=int, default=CPU_WEIGHT, help="testbed hosts' CPU weight (0: the kernel's)")
    p.add_argument("--json", dest="json_file")
    p.add_argument("--folder", type=Path, help="work folder, kept (profiles, cluster files, builds); default: a "
                   "temporary one, removed at the end")
    a = p.parse_args(argv)
    a.model = a.model or ("tinylm" if a.quick else "lm500m")
    a.inflight_model = a.inflight_model or ("tinylm" if a.quick else a.model)
    if not 1 <= a.prompt_len < a.max_context:
        p.error(f"--prompt-len {a.prompt_len} and --max-context {a.max_context}: need 1 <= prompt-len < max-context")
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    unknown = [x for x in parts if x not in PARTS]
    if unknown or not parts:
        p.error(f"--parts: unknown {', '.join(unknown) or '(none)'}; choose from {', '.join(PARTS)}")
    needs = {"plan": [a.model], "measure": ["tinylm"] + [a.model] * a.measure_model,
             "inflight": [a.inflight_model]}
    try:  # every model the parts run, before any part profiles for minutes
        for name in parts:
            for model in needs[name]:
                model_path(model, a.models_dir)
    except Unavailable as exc:
        log(f"bench_generate: {exc}")
        return 2
    results, lines, checks = {}, [f"# bench_generate{' --quick' * a.quick} (load average {loadavg()})"], []
    with contextlib.ExitStack() as stack:
        if a.folder:
            a.folder.mkdir(parents=True, exist_ok=True)
        tmp = a.folder or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-generate-"))
        for name in parts:
            run, targets, markdown = PARTS[name]
            try:
                results[name] = run(a, Path(tmp))
            except Unavailable as exc:
                log(f"bench_generate: {exc}")
                return 2
            lines += ["", *markdown(results[name])]
            checks += targets(results[name])
    lines += ["", "| target | | measured |", "|---|---|---|"]
    lines += [f"| {n} | {'PASS' if ok else 'FAIL'} | {t} |" for n, ok, t in checks]
    print("\n".join(lines))
    if a.json_file:
        Path(a.json_file).write_text(json.dumps(results, indent=1))
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(recorded(main))
