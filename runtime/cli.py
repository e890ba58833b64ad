"""`edgec run MANIFEST`: replay a compiled manifest on local workers, time it, optionally verify it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import statistics
import sys

import click
import numpy as np

from .api import MAX_THREADS, execute, report, write_npz
from .coordinator import RunResult
from .errors import EdgecRuntimeError, one_line
from .interrupts import Interrupted, interrupt_on_signals
from .manifest import Manifest
from .verify import VerifyResult

__all__ = ["run", "main", "device_main", "OneLineErrors", "quiet_broken_pipe",
           "EXIT_OK", "EXIT_VERIFY_FAILED", "EXIT_INPUT", "EXIT_RUN", "EXIT_PIPE", "MAX_THREADS"]

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_INPUT, EXIT_RUN = 0, 1, 2, 3
# What a shell reports for a writer killed by SIGPIPE (128 + 13): `edgec ... | head` behaves like any
# other Unix filter whose reader went away.
EXIT_PIPE = 128 + 13


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
    manifest, result, checked = execute(manifest_arg, npz=inputs_file, pairs=input_pairs, random_inputs=random_inputs,
                                        seed=seed, verify=verify, model=model_file, tolerance=tolerance,
                                        repeat=repeat, threads=threads, emulate=emulate, timeout=timeout)
    if output_file:
        write_npz(output_file, result.outputs)
    if as_json:
        click.echo(json.dumps(report(manifest, result, checked)))
    else:
        _print_human(manifest, result, checked)
    return EXIT_VERIFY_FAILED if checked is not None and not checked.passed else EXIT_OK


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


class _DeviceGroup(OneLineErrors, click.Group):
    pass


@click.group("edgec", cls=_DeviceGroup, context_settings={"show_default": True})
@click.version_option(package_name="edgec-runtime")
def device_cli() -> None:
    """edgec on a device that only runs builds (the distribution edgec-runtime, without the compiler)."""


device_cli.add_command(run)


def device_main() -> None:
    """The `edgec` command of the device-only distribution (runtime/dist)."""
    device_cli.main(prog_name="edgec")
