"""The decode loop: S sequences through the stages at once. Each sequence's prompt runs as one step (prefill),
then each chosen token as the next (decode): the device that gives the logits chooses the token and sends only
its id back, which the coordinator feeds to the first stage with its position and the attention mask. A
sequence's next step waits for its token, so S sequences keep up to S steps in flight: while the last stage
runs sequence A's step, the first runs sequence B's (pipelined decoding). Every sequence has its own state on
every device (device/sequences.py). A device lost mid-generation on a --fallbacks build: failover.py."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence as Seq

import numpy as np

from ..coordinator.liveness import DeviceLost
from ..coordinator.window import IDLE
from ..errors import RunError
from ..manifest.types import Manifest
from ..wire.protocol import TOKEN_TENSOR
from .failover import Failover
from .feeds import step_inputs, vocab_size
from .pool import GeneratePool, StepInputs

__all__ = ["Sequence", "decode"]


@dataclass
class Sequence:
    """One sequence's prompt, its tokens so far, the logits each was chosen from, and when each came. `past`
    counts the tokens in its caches on the plan in use: 0 before its first step there, whose prefill is the
    prompt and every token so far (a sequence restarted on a fallback plan, failover.py)."""

    index: int
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)  # with the pool's `logits` (--verify) only
    at: list[float] = field(default_factory=list)  # perf_counter() when each token was chosen
    past: int = 0

    def fed(self) -> list[int]:
        """The tokens of its next step: the whole context so far at first, then the last token."""
        return self.prompt + self.tokens if self.past == 0 else self.tokens[-1:]

    def next_step(self, m: Manifest) -> StepInputs:
        fed = self.fed()
        return StepInputs(step_inputs(m, fed, self.past), self.index, len(fed), self.past)


def decode(pool: GeneratePool, m: Manifest, prompts: Seq[Seq[int]], max_new_tokens: int,
           on_token: Callable[[int, int], None] | None = None, failover: Failover | None = None
           ) -> tuple[list[Sequence], float]:
    """(the sequences, with max_new_tokens tokens each; perf_counter() at the start). `on_token(sequence,
    token)` is called as each token is chosen. With `failover` (failover.py), a device lost mid-generation
    switches to the fallback plan without it, where every unfinished sequence restarts: its prefill is its
    prompt and its tokens so far, and it goes on from there; without, DeviceLost stands."""
    seqs = [Sequence(i, list(p)) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    while True:
        try:
            _steps(pool, m, seqs, max_new_tokens, on_token)
            return seqs, start
        except DeviceLost as lost:
            if failover is None:
                raise
            pool = failover.switch(lost, [len(s.tokens) for s in seqs if len(s.tokens) < max_new_tokens])
            m = pool.manifest
            for s in seqs:
                s.past = 0


def _steps(pool: GeneratePool, m: Manifest, seqs: list[Sequence], max_new_tokens: int,
           on_token: Callable[[int, int], None] | None) -> None:
    """Run every unfinished sequence of `seqs` on `pool` to max_new_tokens tokens."""
    g, vocab = m.generate, vocab_size(m)
    ready: deque[StepInputs] = deque()
    issued: deque[Sequence] = deque()  # the sequence of each step in flight, in request order
    todo = [s for s in seqs if len(s.tokens) < max_new_tokens]
    left = len(todo)

    def source() -> Iterator:
        # Whenever no step is at hand, an unfinished sequence has one in flight: stream() then waits for it.
        while left:
            if ready:
                step = ready.popleft()
                issued.append(seqs[step.seq])
                yield step
            else:
                yield IDLE

    for s in todo:
        pool.begin(s.index, len(s.tokens))
        ready.append(s.next_step(m))
    for outputs, _, _ in pool.stream(source(), inflight=len(todo)):
        s = issued.popleft()
        s.past += len(s.fed())
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
