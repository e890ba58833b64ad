"""The decode loop: S sequences through the stages at once. Each sequence's prompt runs as one step (prefill),
then each chosen token as the next (decode): the device that gives the logits chooses the token and sends only
its id back, which the coordinator feeds to the first stage with its position and the attention mask. A sequence's next step waits for its token, so S sequences keep up
to S steps in flight: while the last stage runs sequence A's step, the first runs sequence B's (pipelined
decoding). Every sequence has its own state on every device (device/sequences.py)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence as Seq

import numpy as np

from ..coordinator.window import IDLE
from ..errors import RunError
from ..manifest.types import Manifest
from ..wire.protocol import TOKEN_TENSOR
from .feeds import step_inputs, vocab_size
from .pool import GeneratePool, StepInputs

__all__ = ["Sequence", "decode"]


@dataclass
class Sequence:
    """One sequence's prompt, its tokens so far, the logits each was chosen from, and when each came."""

    index: int
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)  # with the pool's `logits` (--verify) only
    at: list[float] = field(default_factory=list)  # perf_counter() when each token was chosen
    past: int = 0

    def next_step(self, m: Manifest) -> StepInputs:
        fed = self.prompt if not self.tokens else self.tokens[-1:]
        return StepInputs(step_inputs(m, fed, self.past), self.index, len(fed), self.past)


def decode(pool: GeneratePool, m: Manifest, prompts: Seq[Seq[int]], max_new_tokens: int,
           on_token: Callable[[int, int], None] | None = None) -> tuple[list[Sequence], float]:
    """(the sequences, with max_new_tokens tokens each; perf_counter() at the start). `on_token(sequence,
    token)` is called as each token is chosen."""
    seqs = [Sequence(i, list(p)) for i, p in enumerate(prompts)]
    g, vocab = m.generate, vocab_size(m)
    ready: deque[StepInputs] = deque()
    issued: deque[Sequence] = deque()  # the sequence of each step in flight, in request order
    left = len(seqs)

    def source() -> Iterator:
        # Whenever no step is at hand, an unfinished sequence has one in flight: stream() then waits for it.
        while left:
            if ready:
                step = ready.popleft()
                issued.append(seqs[step.seq])
                yield step
            else:
                yield IDLE

    for s in seqs:
        pool.begin(s.index)
        ready.append(s.next_step(m))
    start = time.perf_counter()
    for outputs, _, _ in pool.stream(source(), inflight=len(seqs)):
        s = issued.popleft()
        s.past += len(s.prompt) if not s.tokens else 1
        token = int(outputs[TOKEN_TENSOR][0])
        if not 0 <= token < vocab:
            raise RunError(f"device {pool.collects[TOKEN_TENSOR]}: chose token {token}, outside the vocabulary")
        s.tokens.append(token)
        if g.logits_output in outputs:
            logits = outputs[g.logits_output]
            s.logits.append(np.array(logits.reshape(-1, logits.shape[-1])[-1]))  # the step's last position
        s.at.append(time.perf_counter())
        if on_token is not None:
            on_token(s.index, token)
        if len(s.tokens) < max_new_tokens:
            ready.append(s.next_step(m))
        else:
            pool.drop(s.index)
            left -= 1
    return seqs, start
