"""The compiler's byte units. Two, because two meanings are in use and each output keeps its own:

- MiB (2**20 bytes) is what `memory_mb` means in devices.yaml and the profiles, and what report.py's
  "MB" columns and `memory_mb` fields print.
- MB (10**6 bytes) is the decimal megabyte the pipeline planners' infeasibility messages print.
"""

__all__ = ["MiB", "MB"]

MiB = 1 << 20
MB = 1e6
