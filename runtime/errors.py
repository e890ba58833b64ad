"""Runtime errors: InputError (bad input, exit 2) and RunError (a worker or run failed, exit 3)."""

import logging

__all__ = ["EdgecRuntimeError", "InputError", "RunError", "one_line"]

logger = logging.getLogger(__name__)


def one_line(text: object, limit: int = 300) -> str:
    """Collapse a (possibly multi-line) message to one line so the CLI can print it as `edgec: ...`."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class EdgecRuntimeError(Exception):
    """Base class; `exit_code` is what the CLI returns."""

    exit_code = 3

    def __init__(self, message: str):
        super().__init__(one_line(message, limit=1000))


class InputError(EdgecRuntimeError):
    """Bad input (manifest, fragment file, inputs file, option): the message names the file and the problem."""

    exit_code = 2


class RunError(EdgecRuntimeError):
    """A worker failed, died or timed out while running the schedule."""

    exit_code = 3
