"""Progress of a long compile on stderr: plain lines in logs, a live status line on a terminal.

The driver reports two kinds of event: `note` (something finished: a pass, a planner and its plan) and
`status` (what is running now, with the best plan so far). Plain lines print the notes; on a terminal
(`RichProgress`) the status is one transient line, redrawn at each event, and the notes scroll above
it. Nothing here writes to stdout, which belongs to the results (`--json`).
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
    """A live status line on a terminal (rich): what runs now and the best plan so far, redrawn at each
    event; notes print above it and stay. No refresh thread: the planner forks its search lanes only
    while this process has no other thread (plan/lanes.py), and a timer thread would stop that."""

    def __init__(self, console=None):
        from rich.progress import Progress as Live, TextColumn
        from rich.console import Console

        self._live = Live(TextColumn("{task.description}", markup=False), auto_refresh=False, transient=True,
                          console=console or Console(stderr=True))
        self._task = None

    def __enter__(self) -> "RichProgress":
        self._live.__enter__()
        self._task = self._live.add_task("edgec: starting", total=None)
        return self

    def __exit__(self, *exc) -> None:
        self._live.__exit__(*exc)

    def note(self, message: str) -> None:
        self._live.console.print(f"edgec: {message}", markup=False, highlight=False)

    def status(self, message: str) -> None:
        if self._task is not None:
            self._live.update(self._task, description=f"edgec: {message}", refresh=True)


def for_stderr(live: bool = True) -> Progress:
    """A live display when stderr is a terminal and `live` allows it, plain lines otherwise."""
    if live and sys.stderr.isatty():
        return RichProgress()
    return LineProgress()
