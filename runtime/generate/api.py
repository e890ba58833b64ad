"""generate(): a generative build's sequences on the devices' workers, what `edgec generate` prints with --json
and `edgec.generate` returns. Checks every input before a worker starts: bad input is one line (InputError)."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Callable, Mapping, Sequence as Seq

import numpy as np

from ..coordinator.connect import load_keys
from ..coordinator.verify import check_model, plan_tolerance
from ..device.sequences import MAX_SEQUENCES
from ..errors import InputError
from ..manifest.load import load_manifest
from ..manifest.types import Manifest
from ..wire.protocol import MAX_TEMPERATURE
from .feeds import vocab_size
from .loop import Sequence, decode
from .failover import Failover
from .reference import reference_decode, verify_sequences
from ..device.choose import Sampler

__all__ = ["generate", "load_generative", "prompts_of", "check_fits", "summary", "MAX_SEQUENCES"]

logger = logging.getLogger(__name__)


def generate(build: str | os.PathLike, *, prompt_ids: Seq[int] | Seq[Seq[int]] | None = None,
             random_prompt: int | None = None, max_new_tokens: int, sequences: int = 1, temperature: float = 0.0,
             seed: int = 0, verify: bool = False, model: str | os.PathLike | None = None,
             tolerance: float | None = None, threads: int | None = None, timeout: float = 60.0,
             addresses: Mapping[str, str] | None = None, keys: str | os.PathLike | None = None,
             on_token: Callable[[int, int], None] | None = None) -> dict:
    """Generate max_new_tokens tokens for each of `sequences` sequences of a build compiled with `--generate`:
    the prompt `prompt_ids` (one list for every sequence, or one list per sequence) or `random_prompt` random
    ids per sequence (from `seed`); greedy unless `temperature` > 0 (sampled, reproducibly from `seed`).

        >>> report = generate("build/", prompt_ids=[5, 17, 300], max_new_tokens=8, verify=True)  # doctest: +SKIP
        >>> report["sequences"][0]["tokens"], report["verify"]["passed"]  # doctest: +SKIP
        ([812, 44, ...], True)

    Returns {"sequences": [{"prompt", "tokens"}], "ttft_ms", "tpot_ms", "tokens_per_s", "verify", "failovers"}:
    ttft_ms the
    mean time from the start to a sequence's first token, tpot_ms the mean time between a sequence's later
    tokens (None with one token), tokens_per_s every sequence's tokens over the time to the last one, verify
    None unless asked (reference.py), failovers the switches to a fallback plan when a device was lost
    mid-generation ([{device, after_tokens, plan}], failover.py; a build compiled with --fallbacks)."""
    _check_options(temperature, seed, tolerance, timeout)
    m = load_generative(build)
    if model is not None:
        if not verify:
            raise InputError(f"--model {model}: the source model is used by --verify only; add --verify")
        m = dataclasses.replace(m, model_path=Path(model))
    prompts = prompts_of(m, prompt_ids, random_prompt, max_new_tokens, sequences, seed)
    sampler = Sampler(temperature, seed)
    failover = Failover(m, sampler=sampler, logits=verify, threads=threads, timeout=timeout, addresses=addresses,
                        keys=load_keys(keys), sequences=len(prompts))  # loads the fallback plans, starts nothing
    check_fits(m, len(prompts), failover.fallbacks)
    if verify:  # before the run: a moved or changed model fails in a second
        check_model(m)
    with failover as plans:
        seqs, start = decode(plans.pool, plans.pool.manifest, prompts, max_new_tokens, on_token, plans)
    checked = None
    if verify:
        logger.info("verifying against %s", m.model_path)
        checked = verify_sequences(seqs, reference_decode(m, prompts, max_new_tokens, sampler),
                                   plan_tolerance(m) if tolerance is None else tolerance)
    return summary(seqs, start, checked, plans.failovers)


def load_generative(build: str | os.PathLike) -> Manifest:
    """The manifest of BUILD (its folder or manifest.json), which must be a generative build."""
    path = Path(build)
    m = load_manifest(path / "manifest.json" if path.is_dir() else path, generative=True)
    if m.generate is None:
        raise InputError(f"{m.path}: not a generative build (compile the model with `edgec compile --generate`; "
                         "`edgec run` runs this one)")
    return m


def _check_options(temperature, seed, tolerance, timeout) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not 0 <= temperature <= MAX_TEMPERATURE:
        raise InputError(f"--temperature {temperature}: expected a number from 0 to {MAX_TEMPERATURE:g}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 63:
        raise InputError(f"--seed {seed}: expected an integer from 0 to 2**63 - 1")
    if tolerance is not None and not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance)
                                      and tolerance >= 0):
        raise InputError(f"--tolerance {tolerance}: expected a finite number >= 0")
    if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise InputError(f"--timeout {timeout}: expected a finite number of seconds above 0")


def prompts_of(m: Manifest, prompt_ids, random_prompt: int | None, max_new_tokens: int, sequences: int,
               seed: int) -> list[list[int]]:
    """One prompt per sequence, checked: ids inside the vocabulary, prompt and new tokens inside max_context."""
    g, vocab = m.generate, vocab_size(m)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens}: expected an integer >= 1")
    if isinstance(sequences, bool) or not isinstance(sequences, int) or not 1 <= sequences <= MAX_SEQUENCES:
        raise InputError(f"--sequences {sequences}: expected an integer from 1 to {MAX_SEQUENCES}")
    if (prompt_ids is None) == (random_prompt is None):
        raise InputError("give the prompt as --prompt-ids or --random-prompt (one of them)")
    if random_prompt is not None:
        if isinstance(random_prompt, bool) or not isinstance(random_prompt, int) or random_prompt < 1:
            raise InputError(f"--random-prompt {random_prompt}: expected a length >= 1")
        rng = np.random.default_rng(seed)
        prompts = [[int(t) for t in rng.integers(0, vocab, random_prompt)] for _ in range(sequences)]
    else:
        prompts = _given(prompt_ids, sequences)
    for p in prompts:
        if not p:
            raise InputError("--prompt-ids: the prompt is empty")
        bad = next((t for t in p if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab),
                   None)
        if bad is not None:
            raise InputError(f"--prompt-ids: {bad!r} is not a token id of {m.path} (0 to {vocab - 1})")
        if len(p) + max_new_tokens > g.max_context:
            raise InputError(f"{m.path}: a prompt of {len(p)} and {max_new_tokens} new tokens exceed the build's "
                             f"max_context {g.max_context} (compile with a larger --max-context)")
    return [[int(t) for t in p] for p in prompts]


def check_fits(m: Manifest, sequences: int, fallbacks: Mapping[str, Manifest] | None = None) -> None:
    """InputError when a device cannot hold its fragments' files and every sequence's caches at max_context: the
    plan counted one sequence's, and each sequence in flight holds its own. The same for every fallback plan
    ({lost device: its manifest}, failover.py): a failover restarts all the unfinished sequences there. (A lower
    bound of what the device needs: its activations and the runtime come on top.)"""
    plans = [("", m)] + [(f" on the fallback plan without {lost} ({fb.path})", fb)
                         for lost, fb in sorted((fallbacks or {}).items())]
    for where, plan in plans:
        for d in plan.devices:
            frags = plan.device_fragments(d.name)
            caches = sum(math.prod(s.shape[:s.axis] + (s.max_length,) + s.shape[s.axis + 1:]) *
                         np.dtype(s.dtype).itemsize for f in frags for s in f.state)
            if not caches:
                continue
            weights = sum(plan.fragment_path(f).stat().st_size for f in frags)
            need = weights + sequences * caches
            if need > d.memory_mb * (1 << 20):
                raise InputError(f"--sequences {sequences}{where}: device {d.name} would hold at least "
                                 f"{need / (1 << 20):.0f} MB (its fragments and {sequences} sequence(s)' caches at "
                                 f"max_context {plan.generate.max_context}), more than its {d.memory_mb:g} MB")


def _given(prompt_ids, sequences: int) -> list[list]:
    ids = list(prompt_ids)
    if ids and all(isinstance(p, (list, tuple)) for p in ids):  # one prompt per sequence
        if sequences not in (1, len(ids)) or len(ids) > MAX_SEQUENCES:
            raise InputError(f"--sequences {sequences}: {len(ids)} prompts were given (at most {MAX_SEQUENCES})")
        return [list(p) for p in ids]
    return [ids for _ in range(sequences)]


def summary(seqs: list[Sequence], start: float, checked: dict | None, failovers: list[dict] = ()) -> dict:
    """The --json report of a generation (see generate())."""
    firsts = [(s.at[0] - start) * 1000.0 for s in seqs]
    gaps = [(s.at[-1] - s.at[0]) * 1000.0 / (len(s.at) - 1) for s in seqs if len(s.at) > 1]
    total = sum(len(s.tokens) for s in seqs)
    return {"sequences": [{"prompt": s.prompt, "tokens": s.tokens} for s in seqs],
            "ttft_ms": sum(firsts) / len(firsts), "tpot_ms": sum(gaps) / len(gaps) if gaps else None,
            "tokens_per_s": total / max(max(s.at[-1] for s in seqs) - start, 1e-9), "verify": checked,
            "failovers": list(failovers)}
