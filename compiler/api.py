"""`edgec.compile(...)`: the compiler for build scripts, returning what `edgec compile --json` prints."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Mapping, Sequence

from .driver import compile_model
from .errors import UserError
from .ingest.phases import GenerateOptions
from .plan.planner import DEFAULT_LAMBDA, EnergyGoal, PlanOptions
from .progress import Progress
from .report import compile_summary

__all__ = ["compile"]


def compile(model: str | os.PathLike, devices: str | os.PathLike, outdir: str | os.PathLike, *,
            strategy: str = "auto", objective: str = "latency",
            shapes: Mapping[str, Sequence[int]] | None = None, search_threshold: float = 0.1,
            deepthings_grid: tuple[int, int] | None = None, deepthings_layers: int | None = None,
            jobs: int | None = None, progress: Progress | None = None, fallbacks: bool = False,
            sla_ms: float | None = None, sla_soft: bool = False, lam: float | None = None,
            pareto: bool = False, keep: int | None = None, shifts: bool = False, generate: bool = False,
            max_context: int = GenerateOptions.max_context, prompt_len: int = GenerateOptions.prompt_len,
            state: Mapping[str, str] | None = None) -> dict:
    """Compile `model` for the cluster in `devices` into `outdir`; return the `--json` summary.

    Bad input raises `edgec.compiler.errors.UserError` (one line, naming the file), and nothing is
    written. The arguments are the command's options, with `shapes` as `{input name: dims}`. With
    `fallbacks`, the cluster is also planned without each device the plan uses (OUTDIR/fallback-<device>/),
    and `summary["fallbacks"]` lists them; `edgec run` switches to one when its device stops answering.
    `objective="energy"` needs `sla_ms` (the plan of least energy per request predicted within it); with
    `sla_soft`, the least energy + lam x (ms over the SLA) (lam in mJ per ms, default DEFAULT_LAMBDA).
    With `pareto`, `summary["pareto"]` lists the non-dominated plans of every planner run (latency,
    throughput and, when every plan's is known, energy; `summary["pareto_axes"]` says which). With `keep`
    N, the best N other plans of that frontier (by the objective) are also written as builds of their own
    (OUTDIR/alt-1/ ...), named by the manifest's `alternatives` and listed by `summary["alternatives"]`;
    `summary["alternatives_missing"]` says how many fewer than N the frontier had. With `shifts`, every
    variant of the chosen plan that moves one boundary between neighbouring pipeline stages by one layer
    (DGPAS's adjacent scheduling; spatial stages' boundaries stay) is written too, as the alternatives after
    --keep's, each with its `variant` saying what it moves (None for a --keep plan).
    With `generate`, a generative build of a decoder with a KV cache (`state` {input: output} names pairs
    its names do not tell): a decode step planned (time per output token for latency, tokens per second for
    throughput) with the caches at `max_context` counted in memory and the prefill of `prompt_len` tokens
    priced; the summary adds predicted_tokens_per_s, predicted_tpot_ms, predicted_ttft_ms and generate.

        >>> import edgec
        >>> summary = edgec.compile("models/build/tinychain.onnx", "tests/e2e/clusters/two.yaml",
        ...                         "build/tinychain", strategy="pipeline")        # doctest: +SKIP
        >>> summary["strategy"], summary["manifest"]                                # doctest: +SKIP
        ('pipeline', 'build/tinychain/manifest.json')
    """
    options = PlanOptions(_fraction(search_threshold), _grid(deepthings_grid),
                          _positive("deepthings_layers", deepthings_layers), _positive("jobs", jobs),
                          energy=_energy_goal(sla_ms, sla_soft, lam))
    t0 = time.perf_counter()
    for name, flag in (("fallbacks", fallbacks), ("pareto", pareto), ("shifts", shifts), ("generate", generate)):
        if not isinstance(flag, bool):
            raise UserError(f"{name} {flag!r}: expected True or False")
    result = compile_model(model, devices, outdir, strategy, objective, _shapes(shapes), progress or Progress(),
                           options, fallbacks=fallbacks, pareto=pareto, keep=_positive("keep", keep), shifts=shifts,
                           generate=_generate(generate, max_context, prompt_len, state))
    return compile_summary(result, Path(outdir), time.perf_counter() - t0)


def _generate(generate: bool, max_context: int, prompt_len: int, state: Mapping[str, str] | None) -> GenerateOptions | None:
    """--generate's options (None without it; its options alone are refused)."""
    if not generate:
        if state or max_context != GenerateOptions.max_context or prompt_len != GenerateOptions.prompt_len:
            raise UserError("--max-context, --prompt-len and --state go with --generate")
        return None
    _positive("max_context", max_context)
    _positive("prompt_len", prompt_len)
    return GenerateOptions(max_context, prompt_len, tuple((str(a), str(b)) for a, b in (state or {}).items()))


def _energy_goal(sla_ms: float | None, soft: bool, lam: float | None) -> EnergyGoal | None:
    """The energy objective's goal from the SLA options (None without --sla-ms; compile_model checks that it
    comes with --objective energy)."""
    if sla_ms is None:
        if soft or lam is not None:
            raise UserError("--sla-soft and --lambda need --sla-ms")
        return None
    if isinstance(sla_ms, bool) or not isinstance(sla_ms, (int, float)) or not 0 < sla_ms < math.inf:
        raise UserError(f"--sla-ms {sla_ms!r}: expected a positive number of milliseconds")
    if not isinstance(soft, bool):
        raise UserError(f"sla_soft {soft!r}: expected True or False")
    if lam is not None and (isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0 <= lam < math.inf):
        raise UserError(f"--lambda {lam!r}: expected a number of mJ per ms >= 0")
    if lam is not None and not soft:
        raise UserError("--lambda prices a missed SLA: it needs --sla-soft")
    return EnergyGoal(float(sla_ms), soft, DEFAULT_LAMBDA if lam is None else float(lam))


def _shapes(shapes: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    out = {}
    for name, dims in (shapes or {}).items():
        try:
            parsed = tuple(int(d) for d in dims)
        except (TypeError, ValueError):
            parsed = ()
        if not parsed or any(d <= 0 for d in parsed):
            raise UserError(f"shapes[{name!r}]: expected a sequence of positive integers, got {dims!r}")
        out[str(name)] = parsed
    return out


def _grid(grid) -> tuple[int, int] | None:
    if grid is None:
        return None
    try:
        n, m = (int(g) for g in grid)
    except (TypeError, ValueError):
        n = m = 0
    if n <= 0 or m <= 0:
        raise UserError(f"deepthings_grid {grid!r}: expected (N, M) with positive integers")
    return n, m


def _positive(name: str, value: int | None) -> int | None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise UserError(f"{name} {value!r}: expected a positive integer")
    return value


def _fraction(value: float) -> float:
    if not isinstance(value, (int, float)) or not 0 < value < 1:
        raise UserError(f"search_threshold {value!r}: expected a fraction in (0, 1)")
    return float(value)
