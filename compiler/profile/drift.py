"""Whether the machine's memory rate held while profiling (the profile's `measurement.memory_drift`).

The DRAM figures (memory_gbps, weight_gbps, gemm_weight_gbps, shared_weight_gbps) follow the memory traffic
of whatever else shares the machine's memory path: on a virtual machine, other tenants, whose traffic is
not CPU time of this machine and which the load check (load.py) cannot see.  On this 2-core VM the memory
Add ran at 38-40 GB/s for 200 s, then at 46-47 from one second to the next (2026-11-26, ten minutes of
rounds).  A profile that straddles such a step takes some DRAM figures at one rate and some at the other;
one taken a minute later may find the other rate throughout.  Two back-to-back profiles then disagree by
the step: the misses of issue 11's stability target that remained (memory_gbps +9.6%, weight_gbps +8.9%,
gemm_weight_gbps +11.4% in one pair) were such steps, not the profile's sampling.

So the profile times the memory Add at 1 thread briefly, before its first micro-benchmark and again after
its last figure (the runtime's, and shared_weight_gbps' later sets): PROBE_ROUNDS short rounds, the round at
the fastest quarter as for memory_gbps (bench.py SPREAD_QUANTILE), about 1.3 s.  Such probes back to back
differed by 2.8% (median; at most 7.0%, 33 probes), and followed the steps (43 -> 47 GB/s within a second);
with 6 rounds in 0.6 s, by 2.5% but at most 15% (68 probes), too close to the limit.  Both rates go into
measurement.memory_drift; when they differ by more than DRIFT_LIMIT (10%, the bound two profiles' figures
are held to), the machine was not quiet in the sense that matters to those figures: a warning, or with
--strict a refusal.  A profile taken wholly within one rate cannot see the next one's; bench_fidelity's
stability part compares the four probes of a pair for that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
from onnx import helper

from edgec.compiler.errors import UserError

from .timing import DEFAULT, QUICK, model, rand, settle, sig, time_model, vi

__all__ = ["DRIFT_LIMIT", "Drift", "DriftWatch", "MemoryProbe", "memory_probe", "check_drift"]

DRIFT_LIMIT = 0.10
PROBE_ROUNDS = 12
PROBE_SECONDS = 1.2  # all rounds together; a quick profile's are QUICK's
PROBE_QUANTILE = 0.25  # bench.py SPREAD_QUANTILE, as memory_gbps picks its round

MemoryProbe = Callable[[], float]  # the memory Add's rate now, GB/s

# The figures that move with the machine's memory rate, named in the warning.
DRAM_FIGURES = "memory_gbps, weight_gbps, gemm_weight_gbps and shared_weight_gbps"


def memory_probe(quick: bool) -> MemoryProbe:
    """The memory_gbps Add (bench.py bench_memory: 8M floats, quick 2M) at 1 thread: GB/s of its
    (2 inputs + 1 output) bytes, PROBE_ROUNDS fresh sessions, the round at PROBE_QUANTILE."""
    n = (2 if quick else 8) * 2**20
    data = model([helper.make_node("Add", ["a", "b"], ["y"])], [vi("a", (n,)), vi("b", (n,))], [vi("y", (n,))])
    rng = np.random.default_rng(0)
    feeds = {"a": rand(rng, n), "b": rand(rng, n)}
    policy = replace(QUICK if quick else DEFAULT, rounds=PROBE_ROUNDS, retries=0,
                     max_seconds=QUICK.max_seconds if quick else PROBE_SECONDS)

    def probe() -> float:
        f = settle(lambda: time_model(data, feeds, 1, policy), policy, PROBE_QUANTILE)
        return 3 * 4 * n / f.median_s / 1e9

    return probe


@dataclass(frozen=True)
class Drift:
    start_gbps: float
    end_gbps: float
    seconds: float  # from the start probe to the end one

    @property
    def moved(self) -> float:
        """end / start - 1."""
        return self.end_gbps / self.start_gbps - 1

    def entry(self) -> dict:
        return {"start_gbps": sig(self.start_gbps), "end_gbps": sig(self.end_gbps), "moved": round(self.moved, 3),
                "seconds": round(self.seconds, 1)}

    def said(self) -> str:
        return (f"the machine's memory rate moved by {self.moved:+.0%} while profiling ({self.start_gbps:.3g} GB/s "
                f"at the start, {self.end_gbps:.3g} at the end, {self.seconds:.0f} s apart: memory traffic of "
                "something else on this machine's memory path, which the load check cannot see)")


class DriftWatch:
    """The probe at the start (`__init__`) and at the end (`finish`)."""

    def __init__(self, probe: MemoryProbe, say: Callable[[str], None]):
        self.probe = probe
        self.t0 = time.perf_counter()
        self.start = probe()
        say(f"  memory rate at the start: {self.start:.3g} GB/s (measurement.memory_drift)")

    def finish(self, say: Callable[[str], None]) -> Drift:
        end = self.probe()
        drift = Drift(self.start, end, time.perf_counter() - self.t0)
        say(f"  memory rate at the end: {end:.3g} GB/s ({drift.moved:+.1%})")
        return drift


def check_drift(drift: Drift, strict: bool, warnings: list[str]) -> None:
    """A move beyond DRIFT_LIMIT refuses with strict, else becomes a warning."""
    if abs(round(drift.moved, 9)) <= DRIFT_LIMIT:  # 110 / 100 - 1 is 0.10000000000000009
        return
    if strict:
        raise UserError(f"{drift.said()}; profile when it holds, or without --strict to write the profile with a "
                        "warning")
    warnings.append(f"{drift.said()}; {DRAM_FIGURES} may be off by as much")
