"""Helpers the benchmark scripts share: what this machine gives two 1-thread workers, cluster files whose
devices share it, and problems on one markdown line.  tests/bench is sys.path[0] when a script runs, so
they import it as `benchlib`."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: edgec.models is imported from the checkout
    sys.path.insert(0, str(ROOT))

from edgec import models  # noqa: E402

__all__ = ["brief", "on_this_machine", "parallel_capacity", "write_results", "recorded", "RESULTS"]

RESULTS = ROOT / "benchmarks" / "results"  # one <bench>.json each; benchmarks/render.py draws the docs' tables

# Times `runs` ResNet-50 inferences at one onnxruntime thread (after 2 warm-ups); prints their median in ms.
_KERNEL = """
import sys, time, numpy as np, onnxruntime as ort
opts = ort.SessionOptions()
opts.intra_op_num_threads = opts.inter_op_num_threads = 1
opts.log_severity_level = 3
sess = ort.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
inp = sess.get_inputs()[0]
x = np.random.default_rng(0).random([d if isinstance(d, int) else 1 for d in inp.shape], dtype=np.float32)
times = []
for i in range(int(sys.argv[2]) + 2):
    t0 = time.perf_counter()
    sess.run(None, {inp.name: x})
    times.append((time.perf_counter() - t0) * 1000)
print(sorted(times[2:])[(len(times) - 2) // 2])
"""


def parallel_capacity(runs: int) -> dict:
    """What two 1-thread workers can expect of this machine: ResNet-50 at one thread alone, then two at
    once. The profile measures one process alone; a pipeline's stages compute at the same time, and
    streaming can only gain what the cores give them together."""
    model = str(models.ensure("resnet50"))
    argv = [sys.executable, "-c", _KERNEL, model, str(runs)]

    def median_ms(proc: subprocess.Popen) -> float:
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"the parallel-capacity probe failed: {err.strip()[-500:]}")
        return float(out)

    spawn = lambda: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    alone = median_ms(spawn())
    pair = [spawn(), spawn()]
    together = [median_ms(p) for p in pair]
    result = {"alone_ms": alone, "together_ms": together,
              "cores_worth": 2 * alone / statistics.mean(together)}
    print(f"  ResNet-50 at 1 thread: {alone:.1f} ms alone, {together[0]:.1f} and {together[1]:.1f} ms with two at "
          f"once: two processes get {result['cores_worth']:.2f} cores' worth", file=sys.stderr, flush=True)
    return result


MEASURE_SECONDS = 1.0  # every timed run of bench_fidelity and bench_distributed lasts at least this long
MAX_REQUESTS = 1000  # the bound on that


def requests_for(repeat: int, per_second: float) -> int:
    """Requests of a timed run: --repeat, or enough to last MEASURE_SECONDS at `per_second` predicted requests
    a second (at most MAX_REQUESTS), whichever is more.  A throughput is the outputs after the first over the
    time from the first to the last (coordinator/window.py steady_throughput), so a short stream is a few intervals: 10
    requests of a two-stage MobileNetV2 (about 3 ms apart) measured 317-376/s in four runs back to back, 200
    requests 345-349/s; over a 100 Mbps testbed link, 20 requests 0.70-0.80 of its prediction, 200 requests
    0.99 (2026-11-26).  A latency, the median request, wanders less, but 10 requests of 5 ms are one moment
    of this machine."""
    return max(repeat, min(MAX_REQUESTS, int(MEASURE_SECONDS * per_second + 0.999)))


def on_this_machine(doc: dict, threads: int = 1) -> dict:
    """A cluster document whose device hosts are namespaces of this machine (or local workers): their
    workers (`threads` each) and the coordinator share its cores, which the cluster says (`hosts:`) so that
    the planner bounds throughput by them."""
    for d in doc["devices"]:
        d.update(threads=threads, host="this")
    doc["hosts"] = {"this": {"cores": os.cpu_count() or 1, "coordinator": True}}
    return doc


def brief(problem: str) -> str:
    """A problem on one markdown line: its first line and, for a quoted error output, the last (where a
    traceback names the error); --json keeps the whole text."""
    lines = [ln.strip() for ln in problem.strip().splitlines() if ln.strip()]
    return lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"


# ---------------------------------------------------------------------------------------------- results files


def _loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def _machine() -> dict:
    cpu = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_gb = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
        memory_gb = round(int(kib.split()[1]) / 2**20, 1)
    return {"cpu": cpu or platform.processor() or None, "cores": os.cpu_count(), "memory_gb": memory_gb,
            "description": None}


def _commit() -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _cell(text: str):
    text = text.strip().replace("\\|", "|")
    try:
        return int(text) if text.lstrip("-").isdigit() else float(text)
    except ValueError:
        return text


def tables_of(markdown: str) -> tuple[list[dict], list[str]]:
    """The markdown tables a bench printed, as {title, columns, rows} (numbers as numbers; the title is the
    line before the table), and its other non-empty lines, as notes."""
    tables, notes, title = [], [], None
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("|") and i + 1 < len(lines) and set(lines[i + 1].strip()) <= set("|-: ") \
                and lines[i + 1].strip().startswith("|"):
            split = lambda row: [c for c in row.strip().strip("|").split("|")]
            columns = [c.strip() for c in split(line)]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append([_cell(c) for c in split(lines[i])])
                i += 1
            tables.append({"title": title, "columns": columns, "rows": rows})
            title = None
            continue
        if line:
            notes.append(line)
            title = line.lstrip("#").strip()
        i += 1
    return tables, notes


def write_results(bench: str, markdown: str, load_start: list[float] | None = None,
                  started: datetime.datetime | None = None, exit_code: int = 0) -> Path:
    """Write benchmarks/results/<bench>.json: the machine (CPU model, cores, memory), the load average at the
    start and the end, the git commit, the date, the command line, and the bench's tables as data (its
    markdown output parsed).  Every bench script calls it through `recorded` once its tables are printed."""
    tables, notes = tables_of(markdown)
    doc = {
        "bench": bench,
        "date": (started or datetime.datetime.now(datetime.timezone.utc)).isoformat(timespec="seconds"),
        "commit": _commit(),
        "command": " ".join(["python", os.path.relpath(sys.argv[0], ROOT) if sys.argv and sys.argv[0] else bench,
                             *sys.argv[1:]]),
        "machine": _machine(),
        "load": {"start": load_start, "end": _loadavg()},
        "exit_code": exit_code,
        "source": "measured",
        "tables": tables,
        "notes": notes,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{bench}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    print(f"results: {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return path


class _Tee(io.TextIOBase):
    def __init__(self, stream):
        self.stream, self.text = stream, io.StringIO()

    def write(self, s: str) -> int:
        self.text.write(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()


def recorded(main: Callable[[], int | None]) -> int | None:
    """Run a bench script's main with its stdout (where it prints its markdown tables) also kept, then
    write_results with what it printed once main returns (a missed target included: its exit code is kept;
    not after an exception, nor on exit 2, a bench's "cannot run here").  Each bench_*.py ends `sys.exit(recorded(main))`."""
    bench = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "bench"
    load_start, started = _loadavg(), datetime.datetime.now(datetime.timezone.utc)
    tee, real = _Tee(sys.stdout), sys.stdout
    sys.stdout = tee
    try:
        code = main()
    finally:
        sys.stdout = real
    if code == 2:  # the bench could not run here (a model not built, no testbed): nothing measured to record
        print(f"{bench}: exit 2, results not written", file=sys.stderr)
        return code
    write_results(bench, tee.text.getvalue(), load_start, started, exit_code=code or 0)
    return code
