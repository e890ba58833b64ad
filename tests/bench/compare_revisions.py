"""Compile every benchmark case with two revisions of the compiler and diff what they write, byte for byte.

    python tests/bench/compare_revisions.py BASE NEW [--workdir DIR] [--only pipeline|spatial] [--limit N]
    python tests/bench/compare_revisions.py BASE --prime [...]     # compile and cache BASE only

BASE and NEW are git revisions of this repository (exported with `git archive` under the work folder)
or paths to checkouts. The cases are those of tests/bench/bench_pipeline.py (every model x
cluster x objective, strategy auto) and tests/bench/bench_spatial.py (every model x cluster x bandwidth,
objective latency, each planner it compares that `edgec compile --strategy` can reach, and auto); the
lists are imported from those files, not copied. bench_spatial's `bbgrap-halo` is a keyword of
plan_bbgrap that no --strategy reaches, so it has no compile case.

Each revision compiles in its own subprocess (`python -m edgec.compiler compile`) whose `edgec` package
is that revision's tree: an import root per revision holds an `edgec` folder whose compiler/, runtime/,
models/ and profiles/ link to the tree, and goes first on PYTHONPATH; the script checks where each side
imports `edgec.compiler` from before compiling. Both sides write into the same output folder (the
manifest records the model's path relative to it), one after the other; the script hashes manifest.json
and every fragment and compares the two sets of files. A revision given as a commit caches its hashes
under the work folder (cache/COMMIT.json, keyed by case and the model's path relative to the output
folder), so rerunning against another NEW compiles BASE only once; --prime fills that cache ahead of
time, and two primes in work folders at the same depth can run side by side and share their caches.

Prints one line per case and a summary; exits 1 on any difference (or a case that one side compiles and
the other does not), 0 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench import bench_pipeline, bench_spatial  # noqa: E402  (the case lists)

PACKAGE_DIRS = ("compiler", "runtime", "models", "profiles")


def log(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------------
# cases


def model_path(name: str) -> Path | None:
    """bench_spatial's rule: the built model, else onnx's light zoo file, else nothing."""
    built = ROOT / "models" / "build" / f"{name}.onnx"
    if built.is_file():
        return built
    import onnx

    light = Path(onnx.__file__).parent / "backend/test/data/light" / f"{bench_spatial.LIGHT.get(name, '-')}.onnx"
    return light if light.is_file() else None


def spatial_cluster(kinds, mbps: float) -> dict:
    """bench_spatial.make_cluster as a cluster file: device k-i of profile k, one switched network."""
    return {"devices": [{"name": f"{k}-{i}", "profile": k} for i, k in enumerate(kinds)],
            "network": {"bandwidth_mbps": float(mbps), "latency_ms": bench_spatial.LATENCY_MS, "medium": "switched"}}


def compile_strategies() -> list[str]:
    """bench_spatial's planners that a --strategy reaches, then auto (as its `evaluate` runs them)."""
    from edgec.compiler.plan.registry import STRATEGIES  # this tree's; the CLI offers the same names

    names = list(bench_spatial.planners(None, None))  # the names only; no planner runs
    return [n for n in names if n in STRATEGIES] + ["auto"]


def cases(only: str | None) -> list[dict]:
    out = []
    if only in (None, "pipeline"):
        for model in bench_pipeline.MODELS:
            for cname, doc in bench_pipeline.CLUSTERS.items():
                for objective in ("latency", "throughput"):
                    out.append({"bench": "pipeline", "model": model, "cluster": cname, "doc": doc,
                                "objective": objective, "strategy": "auto"})
    if only in (None, "spatial"):
        for model in bench_spatial.MODELS:
            for cname, kinds in bench_spatial.CLUSTERS.items():
                for mbps in bench_spatial.BANDWIDTHS:
                    for strategy in compile_strategies():
                        out.append({"bench": "spatial", "model": model, "cluster": f"{cname} @{mbps}Mbps",
                                    "doc": spatial_cluster(kinds, mbps), "objective": "latency", "strategy": strategy})
    for c in out:
        c["id"] = f"{c['bench']}: {c['model']} | {c['cluster']} | {c['objective']} | {c['strategy']}"
    return out


# ------------------------------------------------------------------------------------------------
# revisions


class Revision:
    """One code tree and the import root that makes `edgec` that tree."""

    def __init__(self, spec: str, work: Path, label: str):
        self.spec = spec
        path = Path(spec)
        if path.is_dir() and (path / "compiler").is_dir():
            self.tree, self.commit = path.resolve(), None
        else:
            self.commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{spec}^{{commit}}"],
                                         check=True, capture_output=True, text=True).stdout.strip()
            self.tree = work / "trees" / self.commit
            if not (self.tree / "compiler").is_dir():
                self.tree.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.tree.with_name(self.commit + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                archive = subprocess.run(["git", "-C", str(ROOT), "archive", self.commit], check=True,
                                         capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
                tmp.rename(self.tree)
        self.label = label
        self.root = work / "roots" / (self.commit or label)
        pkg = self.root / "edgec"
        if pkg.exists():
            shutil.rmtree(self.root)
        pkg.mkdir(parents=True)
        # the package root: compiler/_root since the device distribution got its own, runtime/_root before
        roots = [self.tree / d / "_root" / "__init__.py" for d in ("compiler", "runtime")]
        shutil.copy(next(r for r in roots if r.is_file()), pkg / "__init__.py")
        for d in PACKAGE_DIRS:
            (pkg / d).symlink_to(self.tree / d, target_is_directory=True)
        self.cache = work / "cache" / f"{self.commit}.json" if self.commit else None
        self.hashes: dict = json.loads(self.cache.read_text()) if self.cache and self.cache.is_file() else {}

    def env(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), *filter(None, [os.environ.get("PYTHONPATH")])])
        env["EDGEC_MODELS_DIR"] = str(ROOT / "models" / "build")
        env.pop("EDGEC_DEBUG", None)
        return env

    def check_import(self) -> str:
        got = subprocess.run([sys.executable, "-c", "import edgec.compiler; print(edgec.compiler.__file__)"],
                             cwd=self.root, env=self.env(), check=True, capture_output=True, text=True).stdout.strip()
        want = self.root / "edgec" / "compiler" / "__init__.py"
        if Path(got) != want:
            raise SystemExit(f"{self.label}: edgec.compiler imports from {got}, not {want}")
        return f"{self.label}: {self.spec} ({self.commit or 'working tree'}) -> {self.tree}; edgec.compiler from {got}"

    def compile(self, case: dict, work: Path) -> dict:
        """{'files': {name: sha256}} or {'error': last stderr line} for one case, from the cache if known."""
        out = work / "out"
        # what the build depends on besides the code: the case, and the model's path as the manifest
        # records it (relative to the output folder), so work folders at the same depth share hashes
        key = f"{case['id']} | model={os.path.relpath(model_path(case['model']).resolve(), out.resolve())}"
        if key in self.hashes:
            return self.hashes[key]
        cluster = work / "cluster.yaml"
        import yaml

        cluster.write_text(yaml.safe_dump(case["doc"]))
        if out.exists():
            shutil.rmtree(out)
        cmd = [sys.executable, "-m", "edgec.compiler", "compile", str(model_path(case["model"])), "--devices",
               str(cluster), "-o", str(out), "--strategy", case["strategy"], "--objective", case["objective"]]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=self.root, env=self.env(), capture_output=True, text=True)
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
            got = {"error": lines[-1], "seconds": time.perf_counter() - t0}
        else:
            got = {"files": {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
                             for p in sorted(out.rglob("*")) if p.is_file()},
                   "seconds": time.perf_counter() - t0}
        shutil.rmtree(out, ignore_errors=True)
        self.hashes[key] = got
        if self.cache is not None:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.hashes, indent=1, sort_keys=True))
            tmp.replace(self.cache)
        return got


def differences(a: dict, b: dict) -> list[str]:
    if "error" in a or "error" in b:
        if a.get("error") == b.get("error"):
            return []  # both refuse the case with the same message
        return [f"base: {a.get('error', 'compiled')}; new: {b.get('error', 'compiled')}"]
    fa, fb = a["files"], b["files"]
    out = [f"only in base: {n}" for n in sorted(fa.keys() - fb.keys())]
    out += [f"only in new: {n}" for n in sorted(fb.keys() - fa.keys())]
    out += [f"differs: {n}" for n in sorted(fa.keys() & fb.keys()) if fa[n] != fb[n]]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="git revision or checkout path")
    ap.add_argument("new", nargs="?", help="git revision or checkout path")
    ap.add_argument("--prime", action="store_true", help="compile BASE only (a commit), filling its cache")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/edgec-compare"), help="worktrees, import roots, cache")
    ap.add_argument("--only", choices=("pipeline", "spatial"), default=None, help="one benchmark's cases")
    ap.add_argument("--limit", type=int, default=None, help="the first N cases only")
    args = ap.parse_args()
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if (args.new is None) != args.prime:
        ap.error("give NEW, or --prime without NEW")
    base = Revision(args.base, work, "base")
    if args.prime and base.commit is None:
        ap.error("--prime caches a commit's hashes: BASE must be a git revision")
    log(base.check_import())
    new = None if args.prime else Revision(args.new, work, "new")
    if new is not None:
        log(new.check_import())
    todo = cases(args.only)[: args.limit]
    missing = sorted({c["model"] for c in todo if model_path(c["model"]) is None})
    if missing:
        log(f"no model file for {', '.join(missing)}: their cases are skipped")
    todo = [c for c in todo if model_path(c["model"]) is not None]
    log(f"{len(todo)} cases")
    same = differ = refused = 0
    bad = []
    t0 = time.perf_counter()
    for n, case in enumerate(todo, 1):
        a = base.compile(case, work)
        if new is None:
            log(f"[{n}/{len(todo)}] {case['id']}: {len(a['files']) if 'files' in a else a['error']} "
                f"({a['seconds']:.1f}s)")
            continue
        b = new.compile(case, work)
        diff = differences(a, b)
        if diff:
            differ += 1
            bad.append((case["id"], diff))
            status = "DIFFERENT: " + "; ".join(diff)
        else:
            same += 1
            refused += "error" in a
            status = (f"same ({len(a['files'])} files)" if "files" in a else f"same refusal: {a['error']}")
        log(f"[{n}/{len(todo)}] {case['id']}: {status} (base {a['seconds']:.1f}s, new {b['seconds']:.1f}s)")
    if new is None:
        log(f"\n{len(todo)} cases of {args.base} compiled and cached in {time.perf_counter() - t0:.0f}s")
        return 0
    log(f"\n{len(todo)} cases compared in {time.perf_counter() - t0:.0f}s: {same} identical "
        f"({refused} of them refused by both with the same message), {differ} different")
    for cid, diff in bad:
        log(f"- {cid}: {'; '.join(diff)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
