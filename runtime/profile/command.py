"""`edgec profile`'s measuring options and steps, shared by both installs: the device's `edgec profile` (runtime
cli.py, which writes flow-style YAML) and the full install's (compiler cli.py, which adds --refine and writes validated
YAML). Bad input is an InputError (one line, exit 2), checked before minutes of measuring."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Callable

import click

from edgec.runtime.errors import InputError
from edgec.runtime.machine import MAX_THREADS_HERE

from .write import check_output_path

__all__ = ["measuring_options", "verbose_option", "measure_to", "thread_list", "provider_list", "LOGGER"]

LOGGER = "edgec.runtime.profile"  # its warnings' details are INFO records: --verbose shows them

# What a profile's power_w accepts, and then some
_WATTS = click.FloatRange(min=0, min_open=True, max=1e6)


def thread_list(ctx, param, value: str | None) -> list[int] | None:
    """--threads 1,2: distinct counts, each 1 .. MAX_THREADS_HERE."""
    if value is None:
        return None
    counts = []
    for item in value.split(","):
        item = item.strip()
        if not item.isdigit() or not 1 <= int(item) <= MAX_THREADS_HERE:
            raise click.BadParameter(f"{value!r}: expected a comma-separated list of thread counts, each 1 to "
                                     f"{MAX_THREADS_HERE}, e.g. 1,2")
        counts.append(int(item))
    return sorted(set(counts))


def provider_list(ctx, param, value: str | None) -> list[str] | None:
    """--providers A,B: distinct onnxruntime provider names, in order (checked against onnxruntime when measuring)."""
    if value is None:
        return None
    names = [item.strip() for item in value.split(",")]
    bad = next((n for n in names if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,63}ExecutionProvider", n)), None)
    if bad is not None or len(set(names)) != len(names):
        raise click.BadParameter(f"{value!r}: expected distinct onnxruntime provider names separated by commas, e.g. "
                                 "OpenVINOExecutionProvider,CPUExecutionProvider")
    return names


_OPTIONS = [
    click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, path_type=Path)),
    click.option("--model", type=click.Path(dir_okay=False, path_type=Path), show_default="the standard kernels only",
                 help="also measure this model's layers"),
    click.option("--threads", "threads", metavar="N[,N...]", callback=thread_list, default=None,
                 show_default="1 and one per physical core",
                 help=f"onnxruntime intra-op thread counts to measure, each at most 4 x this machine's cores "
                      f"({MAX_THREADS_HERE} here): more only oversubscribe them; the top-level figures are the "
                      "largest's"),
    click.option("--providers", "providers", metavar="NAME[,NAME...]", callback=provider_list, default=None,
                 show_default="CPUExecutionProvider",
                 help="onnxruntime execution providers to measure with, in order; the profile says so (`providers:`) and "
                      "carries the CPU provider's own figures too (`cpu:`); with --model, the nodes the CPU provider "
                      "runs beside them (`cpu_nodes:`)"),
    click.option("--strict", is_flag=True,
                 help="refuse (exit 2) when the machine is busy or a timing's spread stays above 10%, instead of "
                      "warning"),
    click.option("--quick", is_flag=True, help="small benchmarks, short timings: noisy figures, for tests"),
    click.option("--power-idle", type=_WATTS, default=None, show_default="unknown", help="idle watts, if known"),
    click.option("--power-busy", type=_WATTS, default=None, show_default="unknown",
                 help="busy watts, if known (at least --power-idle)"),
]

_VERBOSE = click.option("-v", "--verbose", is_flag=True,
                        help="print each warning whole (which timings stayed noisy, the load seen, ...), not just its "
                             "first line")


def measuring_options(f: Callable) -> Callable:
    """The measuring options, in the order `edgec profile --help` lists them (then -v, which goes last)."""
    for option in reversed(_OPTIONS):
        f = option(f)
    return f


def verbose_option(f: Callable) -> Callable:
    return _VERBOSE(f)


def measure_to(write: Callable[[dict, Path], None], progress: Callable[[str], None], *, output: Path,
               model: Path | None, threads: list[int] | None, strict: bool, quick: bool, power_idle: float | None,
               power_busy: float | None, verbose: bool, providers: list[str] | None = None) -> None:
    """Check every argument, measure this machine and `write` the profile to `output` (the installs differ in
    how they write it); prints the output's path on stdout."""
    from .measure import measure_host  # onnxruntime and onnx: imported when measuring, not for --help
    from .nodes import check_model

    if verbose:
        logging.getLogger(LOGGER).setLevel(logging.INFO)
    check_output_path(output)
    if power_idle is not None and power_busy is not None and power_busy < power_idle:
        raise InputError(f"--power-busy {power_busy:g} is below --power-idle {power_idle:g}")
    if model is not None:
        check_model(model)
    prof = measure_host(model_path=str(model) if model else None, threads=threads, progress=progress,
                        quick=quick, strict=strict, power_idle_w=power_idle, power_busy_w=power_busy,
                        providers=providers)
    write(prof, output)
    click.echo(str(output))
