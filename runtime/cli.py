"""`edgec run MANIFEST`: replay a compiled manifest on local workers, time it, optionally verify it."""

from __future__ import annotations

import contextlib
import dataclasses
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

from .coordinator import RunResult, available_cores, run_manifest
from .errors import EdgecRuntimeError, InputError, one_line
from .inputs import load_inputs
from .manifest import Manifest, load_manifest
from .verify import VerifyResult, check_model, verify_outputs

__all__ = ["run", "main", "OneLineErrors", "Interrupted", "interrupt_on_signals", "quiet_broken_pipe",
           "EXIT_OK", "EXIT_VERIFY_FAILED", "EXIT_INPUT", "EXIT_RUN", "EXIT_PIPE", "MAX_THREADS"]

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_INPUT, EXIT_RUN = 0, 1, 2, 3
# What a shell reports for a writer killed by SIGPIPE (128 + 13): `edgec ... | head` behaves like any
# other Unix filter whose reader went away.
EXIT_PIPE = 128 + 13
# More intra-op threads than this only oversubscribe the cores; 100000 would stall start-up past --timeout.
MAX_THREADS = 4 * available_cores()


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived: unwinds like KeyboardInterrupt (every `finally` and context manager
    cleans up), and is no Exception, so no `except Exception` swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}"


@contextlib.contextmanager
def interrupt_on_signals():
    """Within: SIGTERM and SIGINT raise Interrupted (in the main thread; elsewhere signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)  # None: a handler set outside Python


def quiet_broken_pipe() -> int:
    """Python's recipe for a reader that closed stdout early: point stdout at devnull, so that the flush
    at exit cannot raise again, and exit EXIT_PIPE without a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test runner's captured stdout)
        pass
    return EXIT_PIPE


class OneLineErrors:
    """Mixin for a click Command or Group run standalone: a usage error is one line
    `edgec: <message> (see 'COMMAND --help')` and exit 2; stdout closed early exits EXIT_PIPE quietly."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = code if isinstance(code, int) else EXIT_OK
            sys.stdout.flush()  # inside the try: what is still buffered may meet the closed pipe too
        except click.exceptions.NoArgsIsHelpError as exc:  # the bare command: its help, not an error
            exc.show()
            code = exc.exit_code
        except click.ClickException as exc:
            click.echo(f"edgec: {_usage_line(exc)}", err=True)
            code = EXIT_INPUT
        except click.exceptions.Abort:  # click's form of KeyboardInterrupt outside a command
            click.echo("edgec: interrupted", err=True)
            code = 128 + signal.SIGINT
        except BrokenPipeError:
            code = quiet_broken_pipe()
        sys.exit(code)

    def make_context(self, *args, **kwargs):
        try:  # --help and --version print while the context is made
            return super().make_context(*args, **kwargs)
        except BrokenPipeError:  # handled here: click's own handling would exit 1
            raise click.exceptions.Exit(quiet_broken_pipe()) from None


def _usage_line(exc: click.ClickException) -> str:
    message = one_line(exc.format_message(), 500)
    ctx = getattr(exc, "ctx", None)
    return f"{message} (see '{ctx.command_path} --help')" if ctx is not None else message


class _RunCommand(OneLineErrors, click.Command):
    pass


_EPILOG = ("Exit codes: 0 ok, 1 verification failed, 2 bad input, 3 run failure (a worker failed, died or timed "
           f"out), {EXIT_PIPE} stdout closed before the report was written (e.g. piped into head), 128+N "
           "stopped by signal N (130 SIGINT, 143 SIGTERM).")


@click.command("run", cls=_RunCommand, epilog=_EPILOG, context_settings={"show_default": True})
@click.argument("manifest", type=click.Path(dir_okay=True))
@click.option("--inputs", "inputs_file", metavar="FILE.npz", help="All model inputs, by name (np.savez).")
@click.option("--input", "input_pairs", multiple=True, metavar="NAME=FILE.npy", help="One model input (repeatable).")
@click.option("--random-inputs", is_flag=True, help="Random inputs of the manifest's shapes and dtypes.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --random-inputs.")
@click.option("--verify", is_flag=True, help="Compare against the source model run whole in onnxruntime.")
@click.option("--model", "model_file", metavar="MODEL.onnx", show_default="the manifest's model path",
              help="The source model for --verify, when the build folder was moved away from it; its sha256 "
                   "must match the manifest's.")
@click.option("--tolerance", type=click.FloatRange(min=0), default=1e-4, show_default=True,
              help="Pass when max|a-b| <= tolerance * max(1, max|reference|) for every output.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, help="Timed requests (after one warm-up).")
@click.option("--output", "output_file", metavar="FILE.npz", help="Write the outputs here (atomically).")
@click.option("--threads", type=click.IntRange(min=0, max=MAX_THREADS), default=None,
              show_default="cores / devices; all cores for one device",
              help="onnxruntime intra-op threads per worker, 0 for onnxruntime's own default (all cores); at "
                   f"most 4 x this machine's cores ({MAX_THREADS} here): more only oversubscribe them.")
@click.option("--emulate", is_flag=True, help="Pad runs to predicted_ms and delay sends by the manifest's network.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds allowed for start-up and for each request.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object on stdout.")
@click.pass_context
def run(ctx: click.Context, manifest: str, inputs_file, input_pairs, random_inputs, seed, verify, model_file,
        tolerance, repeat, output_file, threads, emulate, timeout, as_json) -> None:
    """Run MANIFEST (a manifest.json, or the folder holding one) on one local worker per device."""
    # SIGTERM and SIGINT unwind through the coordinator's cleanup, which stops the workers.
    with _progress_to_stderr(), interrupt_on_signals():
        try:
            code = _run(manifest, inputs_file, input_pairs, random_inputs, seed, verify, model_file, tolerance,
                        repeat, output_file, threads, emulate, timeout, as_json)
        except EdgecRuntimeError as exc:
            click.echo(f"edgec: {exc}", err=True)
            code = exc.exit_code
        except Interrupted as exc:
            click.echo(f"edgec: {exc}", err=True)
            code = exc.exit_code
        except KeyboardInterrupt:  # SIGINT while another handler (an embedding application's) is in charge
            click.echo("edgec: interrupted", err=True)
            code = 128 + signal.SIGINT
        except BrokenPipeError:  # handled here: click's own handling would exit 1
            code = quiet_broken_pipe()
    ctx.exit(code)


class _ProgressFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return f"edgec: warning: {text}" if record.levelno >= logging.WARNING else f"edgec: {text}"


@contextlib.contextmanager
def _progress_to_stderr():
    """The runtime's progress and warnings on stderr, each once: the "edgec.runtime" logger stops
    propagating meanwhile, so a root handler (`edgec`'s own, for the compiler's warnings) does not
    print them a second time. stderr is looked up now, so test runners that swap it capture it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ProgressFormatter("%(message)s"))
    log = logging.getLogger("edgec.runtime")
    saved = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]


def _run(manifest_arg, inputs_file, input_pairs, random_inputs, seed, verify, model_file, tolerance, repeat,
         output_file, threads, emulate, timeout, as_json) -> int:
    path = Path(manifest_arg)
    manifest = load_manifest(path / "manifest.json" if path.is_dir() else path)
    if model_file is not None:
        if not verify:
            raise InputError(f"--model {model_file}: the source model is used by --verify only; add --verify")
        manifest = dataclasses.replace(manifest, model_path=Path(model_file))
    if verify:  # before the run: a moved or changed model fails in a second, not after the whole run
        check_model(manifest)
    inputs = load_inputs(manifest, npz=inputs_file, pairs=input_pairs, random=random_inputs, seed=seed)
    result = run_manifest(manifest, inputs, repeat=repeat, threads=threads, emulate=emulate, timeout=timeout,
                          progress=logger.info)
    checked = None
    if verify:
        logger.info("verifying against %s", manifest.model_path)
        checked = verify_outputs(manifest, inputs, result.outputs, tolerance, model_checked=True)
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
    run.main(prog_name="python -m edgec.runtime")
