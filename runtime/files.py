"""Files the runtime writes for the user (the --output archive, the --report JSON): all or nothing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Callable

from .errors import InputError

__all__ = ["write_atomically"]


def write_atomically(path: str | os.PathLike, what: str, write: Callable[[IO[bytes]], None]) -> None:
    """`write` fills a temporary file in the target's folder, which then replaces the target in one step: the
    target is either untouched or complete. Any failure removes the temporary file; an OSError is bad input
    (one line naming `path` and `what`: "the outputs", "the report")."""
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise InputError(f"{path}: cannot write {what} here ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write {what} ({exc.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
