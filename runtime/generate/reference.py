"""--verify for generation: the source model's own decode loop in onnxruntime (one whole-model session, its
caches fed back from step to step as the fragments' `state` names them), choosing with the same sampler, and
the split run's tokens and logits checked against it: every token equal, every step's logits within the
plan's providers' tolerance (coordinator/verify.py)."""

from __future__ import annotations

from typing import Sequence as Seq

import numpy as np
import onnxruntime as ort

from ..coordinator.verify import compare_outputs
from ..device.executor import session_options
from ..errors import InputError, one_line
from ..manifest.types import Manifest
from .feeds import step_inputs
from .loop import Sequence
from ..device.choose import Sampler

__all__ = ["reference_decode", "verify_sequences"]


def reference_decode(m: Manifest, prompts: Seq[Seq[int]], max_new_tokens: int, sampler: Sampler,
                     threads: int = 0) -> list[tuple[list[int], list[np.ndarray]]]:
    """(tokens, last logits of each step) per prompt, from the whole model (check_model ran already)."""
    where = f"{m.path}: model {m.model_path}"
    try:
        sess = ort.InferenceSession(str(m.model_path), session_options(threads), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises several pybind error types
        raise InputError(f"{where}: onnxruntime cannot load it: {one_line(exc, 200)}") from None
    states = [s for f in m.fragments.values() for s in f.state]
    known = {t.name for t in m.inputs} | {s.input for s in states}
    names = [m.generate.logits_output, *(s.output for s in states)]
    unknown = sorted({i.name for i in sess.get_inputs()} - known)
    missing = sorted(set(names) - {o.name for o in sess.get_outputs()})
    if unknown or missing:
        raise InputError(f"{where}: its " + (f"input {unknown[0]!r} is neither a model input nor a cache of the "
                                              "manifest" if unknown else f"output {missing[0]!r} is missing"))
    out = []
    for index, prompt in enumerate(prompts):
        choose = sampler.for_sequence(index)
        cache = {s.input: np.zeros(s.shape, s.dtype) for s in states}
        tokens, logits, fed, past = [], [], list(prompt), 0
        while len(tokens) < max_new_tokens:
            results = sess.run(names, {**step_inputs(m, fed, past), **cache})
            past += len(fed)
            cache = {s.input: r for s, r in zip(states, results[1:])}
            last = results[0].reshape(-1, results[0].shape[-1])[-1]
            tokens.append(choose(last))
            logits.append(last)
            fed = tokens[-1:]
        out.append((tokens, logits))
    return out


def verify_sequences(seqs: Seq[Sequence], reference: Seq[tuple[list[int], list[np.ndarray]]],
                     tolerance: float) -> dict:
    """{passed, tokens_match, max_abs_diff, tolerance, mismatch}: tokens equal in every sequence, and each step's
    logits within tolerance up to the first token that differs (past it the two runs see different contexts)."""
    worst, mismatch, logits_ok = 0.0, None, True
    for s, (tokens, logits) in zip(seqs, reference):
        for step, (got, want) in enumerate(zip(s.logits, logits)):
            checked = compare_outputs({"logits": got}, {"logits": want}, tolerance)
            worst = max(worst, checked.max_abs_diff)
            logits_ok = logits_ok and checked.passed
            if s.tokens[step] != tokens[step]:
                if mismatch is None:
                    mismatch = {"sequence": s.index, "step": step, "token": s.tokens[step], "expected": tokens[step]}
                break
    return {"passed": mismatch is None and logits_ok, "tokens_match": mismatch is None, "max_abs_diff": worst,
            "tolerance": tolerance, "mismatch": mismatch}
