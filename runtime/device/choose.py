"""The next token from a step's last logits: the largest (greedy), or drawn at a temperature with one uniform
number from a generator seeded per (seed, sequence index, token number): the draws do not depend on the other
sequences in flight, nor on where a sequence ran; a sequence restarted on a fallback plan after k tokens
(generate/failover.py) draws its token k + 1 with the very number it would have drawn without the restart.
The worker that holds the logits chooses (sequences.py), so only the token id leaves it; the whole model's
reference loop (generate/reference.py) draws with the same code and the same numbers."""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["Sampler"]


class Sampler:
    """temperature 0: greedy; above 0: softmax(logits / temperature), one uniform draw per token."""

    def __init__(self, temperature: float = 0.0, seed: int = 0):
        self.temperature, self.seed = float(temperature), int(seed)

    def for_sequence(self, index: int, drawn: int = 0) -> Callable[[np.ndarray], int]:
        """The chooser of sequence `index` whose first call chooses its token number `drawn` (0: the first)."""
        if self.temperature == 0.0:
            return lambda logits: int(np.argmax(logits))
        t, seed, number = self.temperature, self.seed, [drawn]

        def draw(logits: np.ndarray) -> int:
            u = np.random.default_rng([seed, index, number[0]]).random()
            number[0] += 1
            z = logits.astype(np.float64) / t
            p = np.exp(z - z.max())
            cdf = np.cumsum(p)
            return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(cdf) - 1))

        return draw
