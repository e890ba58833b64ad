"""Render benchmarks/results/*.json (written by tests/bench/benchlib.py `write_results`) as markdown pages.

    python benchmarks/render.py OUTDIR     # one page per results file, and index.md

The documentation build calls `pages()` (docs/gen/pages.py), so the site's benchmark pages are these."""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["BENCHES", "load", "page", "pages"]

RESULTS = Path(__file__).resolve().parent / "results"

# What each bench measures, and the page that explains its findings.  A results file of a bench not listed
# here still renders, under its file name.
BENCHES = {
    "bench_pipeline": ("Pipeline planners and compile time",
                       "`auto` against the pipeline baselines (single, even, neurosurgeon): predicted latency and "
                       "throughput, compile and planning time.", "explanation/planners.md"),
    "bench_spatial": ("Spatial planners", "ADaPS's evaluation shape: the spatial planners against EdgeFlow, BBGraP "
                      "and DeepThings on AlexNet, VGG, MobileNetV2, Inception v1 and ResNet-50, with search time "
                      "and pruning.", "explanation/planners.md"),
    "verify_spatial_zoo": ("Verification sweep", "Every spatial planner on every convolutional model of the zoo, "
                           "compiled and run with `--verify`.", "explanation/fidelity.md"),
    "bench_planning": ("Planning time", "Planning time of `auto` on 74-242-layer models, and each planner's work.",
                       "explanation/planners.md"),
    "bench_runtime_overhead": ("Runtime overhead", "One-device `edgec run` against plain onnxruntime.",
                               "explanation/cost-model.md"),
    "bench_fidelity": ("Prediction fidelity", "This host profiled at 1 thread; predicted against measured latency on "
                       "one device and speed-ups on two; with part hetero, devices of different CPU shares on the "
                       "network testbed: predicted against measured latency and throughput, and pipeline efficiency.", "explanation/fidelity.md"),
    "bench_fidelity_testbed": ("Prediction fidelity on the network testbed", "Two devices in network namespaces "
                               "over shaped links: predicted against measured speed-up.", "explanation/fidelity.md"),
    "bench_fidelity_latest": ("Prediction fidelity: the latest full run", "Every part of bench_fidelity and "
                              "bench_emulation, each on its own.", "explanation/fidelity.md"),
    "bench_emulation": ("Emulation fidelity", "4-device plans run with `--emulate --dilate K`: predicted against "
                        "emulated latency.", "explanation/fidelity.md"),
    "bench_exchange": ("Halo exchange steps", "The cost of one halo exchange step inside a plan, by the working set "
                       "of the fragment before it, against its price.", "explanation/fidelity.md"),
    "bench_distributed": ("Across machines on a shaped network", "Two workers in network namespaces on shaped "
                          "links: predicted against measured latency and throughput, and a failover.",
                          "explanation/fidelity.md"),
    "bench_serve": ("Serving", "`edgec serve` under stock Open Inference Protocol clients (HTTP binary and gRPC) on "
                    "the network testbed: closed and open loops, a soak with malformed requests mixed in, RSS, and "
                    "a worker killed mid-load, beside `edgec run` streaming the same build.", "how-to/serve.md"),
    "bench_int8": ("int8 models", "The QDQ, QOperator and dynamic int8 versions of TinyConv, MobileNetV2 and the "
                   "transformer against the float model on the same clusters: bytes moved between devices per input, "
                   "predicted latency and throughput of `auto`'s plan, and the latency plans run.", "how-to/int8.md"),
    "bench_compress": ("Compression codecs", "lz4 and zstd on the zoo's real activations.", "explanation/cost-model.md"),
    "bench_compress_wire": ("Compressed transfers", "`--compress` on a shaped link, measured.",
                            "explanation/cost-model.md"),
    "bench_contention": ("Contention-aware send order", "Send order chosen by the planner against tile order, on "
                         "shared Wi-Fi clusters.", "explanation/cost-model.md"),
    "bench_adapt": ("Run-time adaptation", "`edgec run --adapt` with a device slowed 3x mid-run, emulated.",
                    "explanation/planners.md"),
    "bench_energy": ("Energy under an SLA", "Energy of the energy plan against the latency-optimal plan.",
                     "how-to/energy.md"),
    "bench_scale": ("Planning at fleet scale", "Planning time and peak memory of `edgec compile` (pipeline, auto) "
                    "and `edgec allocate` from 1 to 256 devices and on chains of up to 10,000 layers, each case a "
                    "subprocess with a timeout, checked against issue 42's targets.", "explanation/fleet-scale.md"),
    "bench_generate": ("Generation across devices", "A decoder LM (`--generate`): `auto` against the ring-memory "
                       "and equal-layers baselines on heterogeneous clusters (predicted tokens/s, TPOT, TTFT); on the "
                       "network testbed with CPU-quota'd device hosts, measured against predicted; and tokens/s with "
                       "1, 2, 4 and 8 sequences in flight on 4 stages.", "how-to/generate.md"),
    "bench_allocate": ("Several models", "`edgec allocate`: SLAs, optimality against brute force, planning time, "
                       "fairness.", "how-to/several-models.md"),
}


def load(results: Path = RESULTS) -> dict[str, dict]:
    out = {}
    for path in sorted(results.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for key in ("bench", "date", "commit", "command", "machine", "load", "tables"):
            if key not in doc:
                raise SystemExit(f"{path}: no {key!r}")
        out[path.stem] = doc
    return out


def _decimals(column: list) -> int:
    """The decimals of a column's most precise number: 1.0 beside 0.96 shows as 1.00, as the bench printed it."""
    return max((len(repr(v).split(".")[1]) for v in column if isinstance(v, float) and "e" not in repr(v)), default=0)


def _cell(v, decimals: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{decimals}f}" if "e" not in repr(v) else f"{v:g}"
    return str(v).replace("|", "\\|")


def _machine(m: dict) -> str:
    parts = [m.get("description") or m.get("cpu") or "not recorded"]
    if m.get("description") and m.get("cpu"):
        parts.append(m["cpu"])
    if m.get("cores"):
        parts.append(f"{m['cores']} cores")
    if m.get("memory_gb"):
        parts.append(f"{m['memory_gb']:g} GB")
    return ", ".join(parts)


def _load(load: dict) -> str:
    said = lambda xs: "not recorded" if not xs else " / ".join("-" if x is None else f"{x:g}" for x in xs)
    return f"{said(load.get('start'))} at the start, {said(load.get('end'))} at the end (1/5/15 min)"


def page(name: str, doc: dict, link_prefix: str = "../") -> str:
    title, what, explained = BENCHES.get(name, (name, "", None))
    out = [f"# {title}", ""]
    if what:
        out += [what + (f" Findings: [{explained.split('/')[-1][:-3].replace('-', ' ')}]({link_prefix}{explained})."
                        if explained else ""), ""]
    out += ["| run | |", "|---|---|",
            f"| command | `{doc['command']}` |",
            f"| date | {doc['date'] or 'not recorded'} |",
            f"| commit | {doc['commit'] or 'not recorded'} |",
            f"| machine | {_machine(doc['machine'] or {})} |",
            f"| load average | {_load(doc['load'] or {})} |"]
    if doc.get("source") and doc["source"] != "measured":
        out.append(f"| source | {doc['source']} |")
    out.append("")
    for t in doc["tables"]:
        if t.get("title"):
            out += [f"## {t['title']}", ""]
        out += ["| " + " | ".join(_cell(c) for c in t["columns"]) + " |", "|" + "---|" * len(t["columns"])]
        decimals = [_decimals([row[i] for row in t["rows"] if i < len(row)]) for i in range(len(t["columns"]))]
        out += ["| " + " | ".join(_cell(c, decimals[i] if i < len(decimals) else 0) for i, c in enumerate(row)) + " |"
                for row in t["rows"]]
        out.append("")
    notes = [n for n in doc.get("notes", []) if not n.startswith("#")]
    if notes:
        out += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


def pages(results: Path = RESULTS, link_prefix: str = "../") -> dict[str, str]:
    """{file name: markdown}: a page per results file and index.md listing them."""
    docs = load(results)
    order = [n for n in BENCHES if n in docs] + sorted(n for n in docs if n not in BENCHES)
    out = {f"{n}.md": page(n, docs[n], link_prefix) for n in order}
    index = ["# Benchmarks", "",
             "Each bench script under tests/bench writes its results to `benchmarks/results/<bench>.json` (machine, "
             "load, commit, date, command line and its tables); these pages are rendered from those files when the "
             "documentation is built. Latencies and bytes of the planner benchmarks are predictions of the cost "
             "model from the shipped device profiles; the fidelity, distributed and runtime benchmarks measure on "
             "the machine that ran them. Run a bench from the checkout, e.g. `python tests/bench/bench_pipeline.py`; "
             "those that build network namespaces need root.", "",
             "| bench | what | date |", "|---|---|---|"]
    for n in order:
        title, what, _ = BENCHES.get(n, (n, "", None))
        index.append(f"| [{title}]({n}.md) | {what} | {docs[n]['date'] or 'not recorded'} |")
    out["index.md"] = "\n".join(index) + "\n"
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/render.py OUTDIR", file=sys.stderr)
        return 2
    outdir = Path(argv[0])
    outdir.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (outdir / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
