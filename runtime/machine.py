"""What this process runs on: the edgec version installed and the cores it may use."""

from __future__ import annotations

import os
from importlib import metadata

__all__ = ["edgec_version", "available_cores", "MAX_THREADS_HERE"]


def edgec_version() -> str:
    """The installed edgec's version (the compiler's distribution or the runtime's own), or "unknown"."""
    for dist in ("edgec", "edgec-runtime"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity on Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# More onnxruntime threads than this only oversubscribe the cores; 100000 would stall start-up past --timeout.
MAX_THREADS_HERE = 4 * available_cores()
