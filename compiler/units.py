"""The compiler's units. Two byte units, because two meanings are in use and each output keeps its own:

- MiB (2**20 bytes) is what `memory_mb` means in devices.yaml and the profiles, and what report.py's
  "MB" columns and `memory_mb` fields print.
- MB (10**6 bytes) is the decimal megabyte: the pipeline planners' infeasibility messages print it, and the
  profiles' per-MB and GB/s figures are in it.

MB and the GB/s and per-MB conversions are the runtime's link model's (runtime/linkmodel.py), re-exported
here so that the compiler converts them in one place (Mbps: cost/network.py, through the link model itself);
MiB and the GFLOP/s and microsecond conversions are the compiler's own.
"""

from edgec.runtime.linkmodel import MB, gbps_to_bytes_per_ms, per_million_ms

__all__ = ["MiB", "MB", "gbps_to_bytes_per_ms", "per_million_ms", "gflops_to_flops_per_ms", "us_to_ms"]

MiB = 1 << 20


def gflops_to_flops_per_ms(gflops: float) -> float:
    """10^9 operations per second as operations per millisecond: x 10^6."""
    return gflops * 1e6


def us_to_ms(us: float) -> float:
    """Microseconds as milliseconds."""
    return us / 1000.0
