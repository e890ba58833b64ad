"""What the runtime's commands share: their option types, their progress on stderr, and their exit codes."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from typing import Callable

import click

from ..command import Finite, quiet_broken_pipe, runtime_log_to_stderr
from ..errors import EdgecRuntimeError
from ..interrupts import Interrupted, interrupt_on_signals
from .api import MAX_TIMEOUT_S

TIMEOUT = Finite(min=0, min_open=True, max=MAX_TIMEOUT_S)
TOLERANCE = Finite(min=0)
SEED = click.IntRange(min=0)


@contextlib.contextmanager
def request_lines(verbose: bool):
    """The per-request records (api.request_log): printed with --verbose; else a progress bar (rich) on a
    terminal, nothing elsewhere (a log file does not want a line per request)."""
    log = logging.getLogger("edgec.runtime.requests")
    saved = log.propagate
    bar = None if verbose or not sys.stderr.isatty() else _RequestBar()
    log.propagate = verbose
    if bar is not None:
        log.addHandler(bar)
    try:
        yield
    finally:
        log.propagate = saved
        if bar is not None:
            log.removeHandler(bar)
            bar.stop()


class _RequestBar(logging.Handler):
    """A rich progress bar over the timed requests, redrawn from each request's record."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.progress = self.task = None

    def emit(self, record: logging.LogRecord) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        done, total = getattr(record, "done", None), getattr(record, "total", None)
        if done is None or total is None:
            return
        if self.progress is None:
            self.progress = Progress(TextColumn("edgec: requests"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[last]}"), TimeRemainingColumn(),
                                     console=Console(file=sys.stderr), transient=True)
            self.task = self.progress.add_task("requests", total=total, last="")
            self.progress.start()
        self.progress.update(self.task, completed=done, last=record.getMessage().split(": ", 1)[-1])

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def command_exit_code(body: Callable[[], int]) -> int:
    """Run a command's body with progress on stderr and SIGTERM/SIGINT unwinding through the coordinator's
    cleanup (which ends the run on every worker); its exit code, or the one its failure maps to (one line)."""
    with progress_to_stderr(), interrupt_on_signals():
        try:
            return body()
        except (EdgecRuntimeError, Interrupted) as exc:
            click.echo(f"edgec: {exc}", err=True)
            return exc.exit_code
        except KeyboardInterrupt:  # SIGINT while another handler (an embedding application's) is in charge
            click.echo("edgec: interrupted", err=True)
            return 128 + signal.SIGINT
        except BrokenPipeError:  # handled here: click's own handling would exit 1
            return quiet_broken_pipe()


class _ProgressFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return f"edgec: warning: {text}" if record.levelno >= logging.WARNING else f"edgec: {text}"


def progress_to_stderr():
    """`edgec run`'s progress (`edgec: ...`) and warnings (`edgec: warning: ...`)."""
    return runtime_log_to_stderr(_ProgressFormatter("%(message)s"), logging.INFO)
