"""Files the runtime writes for the user (the --output archive, the --report and --trace JSON): all or nothing,
with the mode the user's umask gives."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Callable

from .errors import InputError

__all__ = ["write_atomically", "default_mode"]


def default_mode(folder: bool = False) -> int:
    """The mode a plain open() or mkdir() would give under the process's umask. tempfile makes private
    files (0600) and folders (0700); what we swap into place for the user must not stay private."""
    return (0o777 if folder else 0o666) & ~_umask()


def _umask() -> int:
    try:  # Linux reports it without changing it
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it, and put it back at once
    os.umask(mask)
    return mask


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
            os.fchmod(fh.fileno(), default_mode())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write {what} ({exc.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
