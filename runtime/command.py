"""What the runtime's commands share (`edgec run`, `edgec worker`, `edgec keygen`, and the compiler's own
commands): exit codes, one-line usage errors, a closed stdout, the runtime's log on stderr."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys

import click

from .errors import one_line

__all__ = ["EXIT_OK", "EXIT_VERIFY_FAILED", "EXIT_INPUT", "EXIT_RUN", "EXIT_PIPE", "quiet_broken_pipe", "OneLineErrors",
           "RunCommand", "Finite", "runtime_log_to_stderr"]

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


class RunCommand(OneLineErrors, click.Command):
    """A standalone click command of the runtime (OneLineErrors)."""


class Finite(click.FloatRange):
    """A FloatRange that also refuses nan (which compares false with every bound) and infinities."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


@contextlib.contextmanager
def runtime_log_to_stderr(formatter: logging.Formatter, level: int):
    """The runtime's log records on stderr, each once: the "edgec.runtime" logger stops propagating
    meanwhile, so a root handler (`edgec`'s own, for the compiler's warnings) does not print them a
    second time. stderr is looked up now, so test runners that swap it capture it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    log = logging.getLogger("edgec.runtime")
    saved = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]
