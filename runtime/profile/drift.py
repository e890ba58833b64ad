"""Whether the machine's memory rate held while profiling (the profile's `measurement.memory_drift`).

The DRAM figures (memory_gbps, weight_gbps, gemm_weight_gbps, shared_weight_gbps) follow the memory traffic
of whatever else shares the machine's memory path: on a virtual machine, other tenants, whose traffic is
not CPU time of this machine and which the load check (load.py) cannot see.  On this 2-core VM the memory
Add ran at 38-41 GB/s for 200 s, unsettled, then at 46-47 from one second to the next (2026-11-26, ten
minutes of rounds).  A profile taken in such a stretch, or across such a step, times its DRAM figures at a
rate that a profile taken a minute later may not find.

memory_gbps' rounds are spread through each thread count's pass (bench.DRAM_ROUNDS per pass, 24 in all),
so they show it: the rate of the rounds in the pass's first half against that of its second half, each at
the fastest quarter of its stable rounds as the figure picks its round (bench.SPREAD_QUANTILE).  Over those
ten minutes, two such halves of 12 rounds each lay 1.2% apart (median), 7.5% at the 90th percentile, and
more than DRIFT_LIMIT (10%, the bound two profiles' figures are held to) in 4% of the windows, all of them in
the unsettled stretch or across the step.  A move beyond DRIFT_LIMIT is a warning naming the thread count, or
with --strict a refusal.  It costs no time: the rounds are the figure's own.

Tried first and not kept: timing the Add for about 1.3 s at the profile's start and again at its end.  A
moment of this VM is not a pass: such probes back to back differed by up to 7%, and in 12 profiles the two
ends moved by more than 10% in 3 (+23%, -21%, +11%), none of which showed in the profile's figures (the
pair's memory_gbps within 0.0-2.4%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgec.runtime.errors import InputError

from .bench import SPREAD_QUANTILE
from .timing import Figure, sig

__all__ = ["DRIFT_LIMIT", "MIN_ROUNDS", "MemoryDrift", "halves", "check_drift"]

DRIFT_LIMIT = 0.10
MIN_ROUNDS = 4  # fewer rounds cannot be split into halves that each say anything

# The figures that move with the machine's memory rate, named in the warning.
DRAM_FIGURES = "memory_gbps, weight_gbps, gemm_weight_gbps and shared_weight_gbps"
# gemm_weight_gbps moves more than the memory rate it follows (kernels.py, GEMM_COLD_ROWS): said in the warning.
GEMM_SENSITIVITY = "2.7 times as much as the memory rate, on the machine edgec was developed on"


@dataclass(frozen=True)
class MemoryDrift:
    first_gbps: float  # memory_gbps' rounds in the first half of the pass
    second_gbps: float  # ... in the second half
    rounds: int  # in both halves together

    @property
    def moved(self) -> float:
        """second / first - 1."""
        return self.second_gbps / self.first_gbps - 1

    def entry(self) -> dict:
        return {"first_gbps": sig(self.first_gbps), "second_gbps": sig(self.second_gbps),
                "moved": round(self.moved, 3), "rounds": self.rounds}

    def said(self, threads: int) -> str:
        return (f"{threads} thread{'s' if threads > 1 else ''}: the machine's memory rate moved by {self.moved:+.0%} "
                f"while profiling (memory_gbps' rounds {self.first_gbps:.3g} GB/s in the first half of the pass, "
                f"{self.second_gbps:.3g} in the second: memory traffic of something else on this machine's memory "
                "path, which the load check cannot see)")


def _pick(times: list[float], stable: list[bool]) -> float:
    """The time at SPREAD_QUANTILE (nearest rank) of the stable rounds, or of all where none is."""
    pool = sorted(t for t, ok in zip(times, stable) if ok) or sorted(times)
    return pool[math.floor(SPREAD_QUANTILE * (len(pool) - 1))]


def halves(f: Figure, bytes_per_run: int) -> MemoryDrift | None:
    """memory_gbps' rate in the first and the second half of its rounds (in the order taken); None with fewer
    than MIN_ROUNDS."""
    times = list(f.round_medians)
    stable = list(f.round_stable) or [True] * len(times)
    if len(times) < MIN_ROUNDS or min(times) <= 0:
        return None
    mid = len(times) // 2
    first, second = _pick(times[:mid], stable[:mid]), _pick(times[mid:], stable[mid:])
    return MemoryDrift(bytes_per_run / first / 1e9, bytes_per_run / second / 1e9, len(times))


def check_drift(drift: MemoryDrift, threads: int, strict: bool, warnings: list[str]) -> None:
    """A move beyond DRIFT_LIMIT refuses with strict, else becomes a warning."""
    if abs(round(drift.moved, 9)) <= DRIFT_LIMIT:  # 110 / 100 - 1 is 0.10000000000000009
        return
    if strict:
        raise InputError(f"{drift.said(threads)}; profile when it holds, or without --strict to write the profile "
                        "with a warning")
    warnings.append(f"{drift.said(threads)}; {DRAM_FIGURES} were timed while it moved, and may differ by as much "
                    f"in a profile taken at another moment, gemm_weight_gbps by more ({GEMM_SENSITIVITY})")
