"""Golden manifests: compile every bench_pipeline and bench_spatial case into a folder, for a refactor to
show that it changed nothing (`diff -r before/ after/`).

    python tests/bench/golden_manifests.py OUT [--subset] [--only SUBSTRING]

Per case, OUT/<case>/ holds manifest.json (as written), summary.json (the `--json` summary without its
timing fields: timings and every key ending in seconds, paths under the temporary build folder)
and fragments.sha256 (each fragment file's digest).  bench_pipeline's cases are its models x clusters x
objectives (strategy auto); bench_spatial's its models x clusters x bandwidths (auto, latency, 1 ms links).
--subset keeps one case of each kind per model family for a quick check between steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_pipeline  # noqa: E402
import bench_spatial  # noqa: E402

from edgec.compiler.api import compile as compile_api  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMING = {"timings"}  # and every key ending in "seconds" (compile_seconds, a planner's seconds, search_seconds)
SUBSET = {"pipeline-resnet50-rpi5_rpi4_100Mbps-latency", "pipeline-transformer-laptop_2xphone_wifi600_shared-throughput",
          "pipeline-inception_v1-2xrpi5_2xrpi4_100Mbps-throughput", "spatial-alexnet-2x_rpi5_2x_rpi4-10Mbps",
          "spatial-mobilenetv2-1x_rpi5_1x_rpi4-100Mbps"}


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in text.replace(" + ", "_").replace("+", "_")
                   .replace(" @", "_").replace("@", "")).strip("_")


def cases() -> list[tuple[str, Path, dict, str]]:
    """(name, model path, cluster document, objective) of every case."""
    out = []
    for model in bench_pipeline.MODELS:
        for cname, doc in bench_pipeline.CLUSTERS.items():
            for objective in ("latency", "throughput"):
                out.append((f"pipeline-{model}-{slug(cname)}-{objective}", ROOT / "models/build" / f"{model}.onnx",
                            doc, objective))
    for model in bench_spatial.MODELS:
        for cname, kinds in bench_spatial.CLUSTERS.items():
            for mbps in bench_spatial.BANDWIDTHS:
                doc = {"devices": [{"name": f"{k}-{i}", "profile": k} for i, k in enumerate(kinds)],
                       "network": {"bandwidth_mbps": mbps, "latency_ms": bench_spatial.LATENCY_MS,
                                   "medium": "switched"}}
                out.append((f"spatial-{model}-{slug(cname)}-{mbps}Mbps", ROOT / "models/build" / f"{model}.onnx",
                            doc, "latency"))
    return out


def strip(obj, tmp: str):
    if isinstance(obj, dict):
        return {k: strip(v, tmp) for k, v in obj.items() if k not in TIMING and not k.endswith("seconds")}
    if isinstance(obj, list):
        return [strip(v, tmp) for v in obj]
    if isinstance(obj, str):
        return obj.replace(tmp, "<build>")
    return obj


def run(name: str, model: Path, doc: dict, objective: str, out: Path) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cluster = tmp / "cluster.yaml"
        cluster.write_text(yaml.safe_dump(doc))
        build = tmp / "build"
        summary = compile_api(model, cluster, build, strategy="auto", objective=objective)
        dest = out / name
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(build / "manifest.json", dest / "manifest.json")
        (dest / "summary.json").write_text(json.dumps(strip(summary, str(tmp)), indent=1, sort_keys=True) + "\n")
        digests = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(build)}"
                   for p in sorted(build.rglob("*.onnx"))]
        (dest / "fragments.sha256").write_text("\n".join(digests) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--subset", action="store_true", help="a few representative cases only")
    ap.add_argument("--only", default="", help="cases whose name contains this")
    args = ap.parse_args()
    for name, model, doc, objective in cases():
        if (args.subset and name not in SUBSET) or args.only not in name:
            continue
        t = time.perf_counter()
        run(name, model, doc, objective, args.out)
        print(f"{name}: {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
