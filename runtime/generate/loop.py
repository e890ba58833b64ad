"""The decode loop: S sequences through the stages at once. Each sequence's prompt runs as one step (prefill),
then each chosen token as the next (decode). The device that gives the logits chooses the token and sends its id
straight to the first stage, as the input of the sequence's next step, and to the coordinator, which reports and
verifies it (pool.py: the token's direct path). A decode step's other inputs (its positions, the attention mask)
depend only on how many tokens came before, so the coordinator issues a sequence's next step while its current
one runs: up to OPEN_PER_SEQUENCE steps per sequence in flight, in a fixed order that tells each step where its
sequence's next one is (rounds over the unfinished sequences, in their order: each round holds the sequences
that still need a token). While the last stage runs sequence A's step, the first runs sequence B's (pipelined
decoding), and a sequence's next step waits on the first stage for its token alone, not for the coordinator.
Every sequence has its own state on every device (device/sequences.py). A device lost mid-generation on a
--fallbacks build: failover.py.
"""

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
from .pool import OPEN_PER_SEQUENCE, GeneratePool, StepInputs

__all__ = ["Sequence", "schedule", "decode"]


@dataclass
class Sequence:
    """One sequence's prompt, its tokens so far, the logits each was chosen from, and when each came. `past`
    counts the tokens in its caches on the plan in use once its steps issued so far have run: 0 before its first
    step there, whose prefill is the prompt and every token so far (a sequence restarted on a fallback plan,
    failover.py)."""

    index: int
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)  # with the pool's `logits` (--verify) only
    at: list[float] = field(default_factory=list)  # perf_counter() when each token was chosen
    past: int = 0

    def next_step(self, m: Manifest, ahead: int | None = None) -> StepInputs:
        """The inputs of its next step, which then counts as issued: the prefill of the whole context so far,
        or a decode step of one token, which the device that chose it sends to the first stage (the inputs hold
        its positions and mask, no token). `ahead`: how many requests later its step after this one comes."""
        if self.past == 0:
            fed = self.prompt + self.tokens
            step = StepInputs(step_inputs(m, fed, 0), self.index, len(fed), 0, ahead)
        else:
            inputs = step_inputs(m, [0], self.past)  # a stand-in token, left out: its chooser sends the real one
            step = StepInputs({k: v for k, v in inputs.items() if m.generate.feeds[k] != "token"}, self.index, 1,
                              self.past, ahead, direct=True)
        self.past += step.new
        return step


def schedule(seqs: Seq[Sequence], max_new_tokens: int) -> list[tuple[Sequence, int | None]]:
    """The steps of the unfinished sequences, in request order: rounds, each holding the sequences that still
    need a token, in their order. Per step: its sequence, and how many requests later its sequence's next
    step comes (None on its last): at most the number of sequences."""
    left = {s.index: max_new_tokens - len(s.tokens) for s in seqs}
    order = [s for r in range(max(left.values(), default=0)) for s in seqs if left[s.index] > r]
    after: dict[int, int] = {}
    steps: list[tuple[Sequence, int | None]] = []
    for i in range(len(order) - 1, -1, -1):
        s = order[i]
        steps.append((s, after[s.index] - i if s.index in after else None))
        after[s.index] = i
    return steps[::-1]


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
    todo = [s for s in seqs if len(s.tokens) < max_new_tokens]
    steps = schedule(todo, max_new_tokens)
    issued: deque[Sequence] = deque()  # the sequence of each step in flight, in request order
    open_steps = dict.fromkeys((s.index for s in todo), 0)

    def source() -> Iterator:
        # A step waits while its sequence has OPEN_PER_SEQUENCE in flight: stream() then waits for the oldest.
        for s, ahead in steps:
            while open_steps[s.index] >= OPEN_PER_SEQUENCE:
                yield IDLE
            open_steps[s.index] += 1
            issued.append(s)
            yield s.next_step(m, ahead)

    for s in todo:
        pool.begin(s.index, len(s.tokens))
    for outputs, _, _ in pool.stream(source(), inflight=pool.inflight):
        s = issued.popleft()
        open_steps[s.index] -= 1
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
        if len(s.tokens) == max_new_tokens:
            pool.drop(s.index)
