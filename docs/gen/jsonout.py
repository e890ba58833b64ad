"""The `--json` reference page: each command run for real on the zoo's tinychain at `mkdocs build`, its
top-level keys checked against the meanings below (a key the command no longer prints, or one it prints
that has no meaning here, stops the build), and the actual output shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["json_page"]

ROOT = Path(__file__).resolve().parents[2]

KEYS = {
    "compile": {
        "strategy": "the chosen planner",
        "objective": "`latency`, `throughput` or `energy`",
        "predicted_latency_ms": "one request's predicted latency",
        "predicted_throughput_ips": "predicted requests per second when inputs stream",
        "predicted_energy_mj": "energy per request; null when a used device's power is unknown",
        "energy": "the energy's breakdown per device",
        "bytes_transferred": "bytes between devices per input",
        "compile_seconds": "wall-clock seconds of the compile",
        "timings": "seconds per pass",
        "manifest": "path of the written manifest.json",
        "model": "the source model",
        "layers": "layers in the layer graph",
        "blocks": "serial blocks",
        "devices": "per device: `{name, profile, fragments, memory_mb, memory_available_mb, predicted_busy_ms, "
                   "predicted_energy_mj, mode}`",
        "stages": "per stage: `{device, layers: [lo, hi), first_layer, last_layer, spatial}`; `spatial` is null or "
                  "`{axis, devices, segments: [{layers, tiles: [{device, rows, cols?}]}]}`",
        "candidates": "every planner tried: `{strategy, feasible, pruned, error, latency_ms, throughput_ips}`",
        "runners_up": "the chosen planner's next-best plans (up to 2): `{stages, latency_ms, throughput_ips}`",
        "planning": "per planner: `{strategy, seconds, group, work, detail}`; `work` counts `labels`, `nodes`, "
                    "`states`, `plans` (independent of `--jobs`); the pipeline planner's `detail` has `exact` (its "
                    "plans are the exact best) and, when false, `optimality_gap` (its best plan's objective over a "
                    "lower bound, minus one) or `inexact` (why no bound is known)",
        "fallbacks": "with `--fallbacks`: `[{without, manifest, sha256, error?}]`",
        "alternatives": "with `--keep`/`--shifts`: each alternative build's manifest, strategy, predictions, `variant`",
        "alternatives_missing": "how many of `--keep N` the frontier could not supply",
    },
    "compile --generate": {
        "predicted_tokens_per_s": "tokens per second with sequences in flight (one token per bottleneck: the "
                                  "busiest device or link per decode step, the last stage's send of the token id "
                                  "back to the first included)",
        "predicted_tpot_ms": "time per output token of one sequence: a decode step through every stage plus the "
                             "token id's way back to the first stage (`predicted_latency_ms` is the same figure)",
        "predicted_ttft_ms": "time to first token: the prefill of `--prompt-len` tokens through the same stages",
        "generate": "what the figures are priced at: `{prompt_len, max_context, priced_past, token_ms}`; a decode "
                    "step is priced at past `priced_past` = (prompt_len + max_context - 1) // 2, the mean past of "
                    "one generation; every cache is counted in memory at `max_context`",
    },
    "generate": {
        "sequences": "per sequence: `{prompt, tokens}`, the prompt's and the generated token ids",
        "ttft_ms": "time to first token: from the start (the workers ready) to a sequence's first token, the mean "
                   "over the sequences",
        "tpot_ms": "time per output token: the mean gap between a sequence's later tokens, the mean over the "
                   "sequences; null with one new token",
        "tokens_per_s": "every sequence's tokens over the time from the start to the last token",
        "verify": "`{passed, tokens_match, max_abs_diff, tolerance, mismatch}` (mismatch: null, or the first "
                  "different token's `{sequence, step, token, expected}`), or null without `--verify`",
        "failovers": "with `--fallbacks`: each switch to a fallback plan when a device was lost mid-generation, "
                     "`[{device, after_tokens, plan}]` (after_tokens: every sequence's tokens so far), the "
                     "unfinished sequences restarted there with a prefill of their prompt and tokens",
    },
    "run": {
        "manifest": "the manifest run",
        "latency_ms": "median latency of the timed requests",
        "latencies_ms": "every timed request's latency",
        "warmup": "untimed requests run first",
        "throughput_ips": "steady-state rate: outputs after the first over the time from the first output to the last",
        "inflight": "requests kept in flight",
        "completed": "timed requests done",
        "lost": "requests lost (0 on success)",
        "failovers": "`[{device, at_request, plan}]`",
        "adaptations": "`--adapt` decisions: `[{at_request, reason, from, to, switched_at, objective, recosted_ms}]`",
        "compress": "the `--compress` mode",
        "outputs": "`[{name, shape, dtype}]`",
        "verify": "`{passed, max_abs_diff, worst_output, tolerance, requests_checked}` or null",
        "emulation": "`{dilate, overruns: [{fragment, device, measured_ms, padded_ms}]}` or null",
        "devices": "per device: fragment run times, address, bytes and messages sent and received (raw and on the "
                   "wire), compression times, requests, dropped messages, the worker's `rss_mb`",
    },
    "inspect MODEL": {
        "model": "the model file", "sha256": "its hash", "inputs": "model inputs", "outputs": "model outputs",
        "layers": "each layer: operators, cost class, ADaPS operator type, FLOPs, parameter and activation bytes",
        "block_cuts": "serial-block cut positions", "pipeline_cuts": "pipeline cuts carrying several tensors",
        "total_flops": "FLOPs of one inference", "total_param_bytes": "bytes of weights",
    },
    "inspect MANIFEST": {
        "manifest": "the manifest", "model": "the source model", "strategy": "the planner",
        "stages": "the stages", "tiles": "every tile: stage, segment, layers, axis, device, rows, cols, fragment",
        "exchanges": "every tensor crossing a link: kind (scatter, halo, gather, transfer, forward), region, bytes",
        "bytes_by_kind": "bytes per exchange kind", "predicted": "the manifest's predictions",
        "predicted_energy_mj": "energy per request, or null", "devices": "per device figures",
        "fallbacks": "fallback builds", "alternatives": "alternative builds",
    },
    "simulate": {
        "manifest": "the manifest", "latency_ms": "predicted latency of the replayed schedule",
        "predicted_throughput_ips": "predicted throughput", "bytes_transferred": "bytes between devices",
        "predicted_energy_mj": "energy per request, or null", "energy": "its breakdown per device",
        "devices": "per device: busy and finish time",
        "timeline": "events `{device, kind, start_ms, end_ms, what, fragment | tensor, src, dst, resource}`",
    },
}


def _run(args: list[str], cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "edgec.compiler", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"docs: edgec {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def _outputs() -> dict[str, tuple[str, dict]]:
    from edgec import models

    model = str(models.ensure("tinychain"))
    cluster = str(ROOT / "tests" / "e2e" / "clusters" / "two.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        return {
            "compile": ("edgec compile tinychain.onnx --devices two.yaml -o build --strategy pipeline --json",
                        _run(["compile", model, "--devices", cluster, "-o", "build", "--strategy", "pipeline", "--json"],
                             cwd)),
            "compile --generate": (
                "edgec compile tinylm.onnx --devices two.yaml -o lm --generate --max-context 128 --prompt-len 16 --json",
                _run(["compile", str(models.ensure("tinylm")), "--devices", cluster, "-o", "lm", "--generate",
                      "--max-context", "128", "--prompt-len", "16", "--json"], cwd)),
            "generate": ("edgec generate lm --prompt-ids 5,17,300 --max-new-tokens 4 --sequences 2 --verify --json",
                         _run(["generate", "lm", "--prompt-ids", "5,17,300", "--max-new-tokens", "4", "--sequences",
                               "2", "--verify", "--json"], cwd)),
            "run": ("edgec run build --random-inputs --verify --repeat 3 --json",
                    _run(["run", "build", "--random-inputs", "--verify", "--repeat", "3", "--json"], cwd)),
            "inspect MODEL": ("edgec inspect tinychain.onnx --json", _run(["inspect", model, "--json"], cwd)),
            "inspect MANIFEST": ("edgec inspect build/manifest.json --json",
                                 _run(["inspect", "build/manifest.json", "--json"], cwd)),
            "simulate": ("edgec simulate build/manifest.json --json",
                         _run(["simulate", "build/manifest.json", "--json"], cwd)),
        }


def _short(value, depth: int = 0):
    """The output shown with long lists cut to their first two entries."""
    if isinstance(value, list):
        head = [_short(v, depth + 1) for v in value[:2]]
        return head + ([f"... {len(value) - 2} more"] if len(value) > 2 else [])
    if isinstance(value, dict):
        return {k: _short(v, depth + 1) for k, v in value.items()}
    return value


def json_page() -> str:
    os.environ.setdefault("EDGEC_MODELS_DIR", str(ROOT / "models" / "build"))
    outs = _outputs()
    page = ["# `--json` outputs", "",
            "With `--json`, stdout is exactly one JSON object; progress stays on stderr. The keys below are stable. "
            "This page is generated: each command was run on the zoo's `tinychain` on two local devices while the "
            "documentation was built, and the build fails if a key below is missing from the output or the output "
            "has a key not listed. `edgec allocate --json` prints the `allocation.json` it writes "
            "([several models](../how-to/several-models.md)).", ""]
    for name, (command, out) in outs.items():
        meanings = KEYS[name] if name != "compile --generate" else KEYS["compile"] | KEYS[name]
        missing, extra = sorted(set(meanings) - set(out)), sorted(set(out) - set(meanings))
        if missing or extra:
            raise SystemExit(f"docs: `{command}`: keys documented but not printed {missing}, printed but not "
                             f"documented {extra} (docs/gen/jsonout.py)")
        page += [f"## `edgec {name}`", "", "| key | meaning |", "|---|---|"]
        page += [f"| `{k}` | {meanings[k]} |" for k in out if name != "compile --generate" or k in KEYS[name]]
        if name == "compile --generate":
            page += ["", "and every key of `edgec compile`, the latency and throughput ones per output token."]
        page += ["", f"Output of `{command}` (long lists cut):", "", "```json",
                 json.dumps(_short(out), indent=1), "```", ""]
    return "\n".join(page) + "\n"
