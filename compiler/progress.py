"""Progress of a long compile on stderr: plain lines in logs, a live status line on a terminal.

The driver reports two kinds of event: `note` (something finished: a pass, a planner and its plan) and
`status` (what is running now, with the best plan so far). Plain lines print the notes; on a terminal
(`RichProgress`) the status is one transient line, redrawn with a spinner and the elapsed time, and the
notes scroll above it. Nothing here writes to stdout, which belongs to the results (`--json`).
"""

from __future__ import annotations

import sys
from typing import Callable

__all__ = ["Progress", "LineProgress", "RichProgress", "for_stderr"]


class Progress:
    """Reports nothing: what the Python API and tests get unless they ask for progress."""

    def note(self, message: str) -> None:
        """Something finished."""

    def status(self, message: str) -> None:
        """What is running now (replaces the previous status)."""

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        pass


class LineProgress(Progress):
    """One `edgec: ...` line per note, through `write` (stderr by default); a log needs no status."""

    def __init__(self, write: Callable[[str], None] | None = None):
        self._write = write or (lambda line: print(line, file=sys.stderr, flush=True))

    def note(self, message: str) -> None:
        self._write(f"edgec: {message}")



class RichProgress(Progress):
    """A live status line on a terminal (rich): spinner, what runs now, seconds since it started; notes
    print above it and stay."""

    def __init__(self, console=None):
        from rich.console import Console
        from rich.progress import Progress as Bar, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                        console=console or Console(stderr=True), transient=True)
        self._task = None

    def __enter__(self) -> "RichProgress":
        self._bar.__enter__()
        self._task = self._bar.add_task("edgec: starting", total=None)
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def note(self, message: str) -> None:
        self._bar.console.print(f"edgec: {message}", markup=False, highlight=False)

    def status(self, message: str) -> None:
        if self._task is not None:
            self._bar.reset(self._task, description=f"edgec: {message}")


def for_stderr(live: bool = True) -> Progress:
    """A live display when stderr is a terminal and `live` allows it, plain lines otherwise."""
    if live and sys.stderr.isatty():
        return RichProgress()
    return LineProgress()
