"""`edgec run MANIFEST`: replay a compiled manifest on local workers, time it, optionally verify it."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import click
import numpy as np

from .coordinator import RunResult, run_manifest
from .errors import EdgecRuntimeError, InputError
from .inputs import load_inputs
from .manifest import Manifest, load_manifest
from .verify import VerifyResult, verify_outputs

__all__ = ["run", "main", "EXIT_OK", "EXIT_VERIFY_FAILED", "EXIT_INPUT", "EXIT_RUN"]

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_INPUT, EXIT_RUN = 0, 1, 2, 3


@click.command("run", epilog="Exit codes: 0 ok, 1 verification failed, 2 bad input, 3 run failure (a worker failed, "
                             "died or timed out).")
@click.argument("manifest", type=click.Path(dir_okay=True))
@click.option("--inputs", "inputs_file", metavar="FILE.npz", help="All model inputs, by name (np.savez).")
@click.option("--input", "input_pairs", multiple=True, metavar="NAME=FILE.npy", help="One model input (repeatable).")
@click.option("--random-inputs", is_flag=True, help="Random inputs of the manifest's shapes and dtypes.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --random-inputs.")
@click.option("--verify", is_flag=True, help="Compare against the source model run whole in onnxruntime.")
@click.option("--tolerance", type=click.FloatRange(min=0), default=1e-4, show_default=True,
              help="Pass when max|a-b| <= tolerance * max(1, max|reference|) for every output.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, help="Timed requests (after one warm-up).")
@click.option("--output", "output_file", metavar="FILE.npz", help="Write the outputs here (atomically).")
@click.option("--threads", type=click.IntRange(min=0), default=None,
              help="onnxruntime intra-op threads per worker [default: cores / devices; all cores for one device].")
@click.option("--emulate", is_flag=True, help="Pad runs to predicted_ms and delay sends by the manifest's network.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds allowed for start-up and for each request.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object on stdout.")
@click.pass_context
def run(ctx: click.Context, manifest: str, inputs_file, input_pairs, random_inputs, seed, verify, tolerance,
        repeat, output_file, threads, emulate, timeout, as_json) -> None:
    """Run MANIFEST (a manifest.json, or the folder holding one) on one local worker per device."""
    handler = _progress_handler()
    previous = _exit_on_sigterm()
    try:
        code = _run(manifest, inputs_file, input_pairs, random_inputs, seed, verify, tolerance, repeat,
                    output_file, threads, emulate, timeout, as_json)
    except EdgecRuntimeError as exc:
        click.echo(f"edgec: {exc}", err=True)
        code = exc.exit_code
    except KeyboardInterrupt:
        click.echo("edgec: interrupted", err=True)
        code = 130
    finally:
        logging.getLogger("edgec.runtime").removeHandler(handler)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    ctx.exit(code)


def _exit_on_sigterm():
    """Turn SIGTERM into SystemExit so the coordinator's cleanup (stopping the workers) still runs."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)


def _progress_handler() -> logging.Handler:
    """Progress goes to stderr (looked up now, so test runners that swap sys.stderr capture it)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("edgec: %(message)s"))
    root = logging.getLogger("edgec.runtime")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def _run(manifest_arg, inputs_file, input_pairs, random_inputs, seed, verify, tolerance, repeat, output_file,
         threads, emulate, timeout, as_json) -> int:
    path = Path(manifest_arg)
    manifest = load_manifest(path / "manifest.json" if path.is_dir() else path)
    inputs = load_inputs(manifest, npz=inputs_file, pairs=input_pairs, random=random_inputs, seed=seed)
    result = run_manifest(manifest, inputs, repeat=repeat, threads=threads, emulate=emulate, timeout=timeout,
                          progress=logger.info)
    checked = None
    if verify:
        logger.info("verifying against %s", manifest.model_path)
        checked = verify_outputs(manifest, inputs, result.outputs, tolerance)
    if output_file:
        write_npz(output_file, result.outputs)
    if as_json:
        click.echo(json.dumps(_report(manifest, result, checked)))
    else:
        _print_human(manifest, result, checked)
    return EXIT_VERIFY_FAILED if checked is not None and not checked.passed else EXIT_OK


def write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically: a temporary file in the same folder, then os.replace."""
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent if str(target.parent) else ".", prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise InputError(f"{path}: cannot write the outputs here ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write the outputs ({exc.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _report(manifest: Manifest, result: RunResult, checked: VerifyResult | None) -> dict:
    return {
        "manifest": str(manifest.path),
        "latency_ms": result.latency_ms,
        "latencies_ms": result.latencies_ms,
        "outputs": [{"name": o.name, "shape": list(result.outputs[o.name].shape), "dtype": result.outputs[o.name].dtype.name}
                    for o in manifest.outputs],
        "verify": None if checked is None else _finite(checked.as_json()),
        "devices": {name: {"fragments_run_ms": statistics.median(ms) if ms else 0.0}
                    for name, ms in result.device_run_ms.items()},
    }


def _finite(d: dict) -> dict:
    """Strict JSON has no Infinity/NaN: an unbounded difference (shape mismatch, NaN) becomes null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}


def _stats(a: np.ndarray) -> str:
    if a.size == 0 or a.dtype.kind not in "biuf":
        return ""
    v = a.astype(np.float64)
    return f"  min {v.min():.4g}  max {v.max():.4g}  mean {v.mean():.4g}"


def _print_human(manifest: Manifest, result: RunResult, checked: VerifyResult | None) -> None:
    click.echo("outputs:")
    for spec in manifest.outputs:
        a = result.outputs[spec.name]
        click.echo(f"  {spec.name}  shape {list(a.shape)}  {a.dtype.name}{_stats(a)}")
    lat = result.latencies_ms
    click.echo(f"latency: median {result.latency_ms:.2f} ms, min {min(lat):.2f} ms over {len(lat)} request(s) "
               f"(after 1 warm-up)")
    busy = ", ".join(f"{n} {statistics.median(ms):.2f} ms" for n, ms in result.device_run_ms.items() if ms)
    click.echo(f"fragment run time (median): {busy}")
    if checked is not None:
        verdict = "PASSED" if checked.passed else "FAILED"
        click.echo(f"verify: {verdict}  max|diff| {checked.max_abs_diff:.3g} on {checked.worst_output!r} "
                   f"(tolerance {checked.tolerance:g} x max(1, max|reference|))")


def main() -> None:
    run(prog_name="python -m edgec.runtime")
