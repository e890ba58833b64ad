"""The next token from a step's last logits: the largest (greedy), or drawn at a temperature from a generator
seeded per sequence (seed, sequence index), so that its draws do not depend on the other sequences in flight.
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

    def for_sequence(self, index: int) -> Callable[[np.ndarray], int]:
        """The chooser of sequence `index` (its own generator: draws do not depend on the other sequences)."""
        if self.temperature == 0.0:
            return lambda logits: int(np.argmax(logits))
        rng = np.random.default_rng([self.seed, index])
        t = self.temperature

        def draw(logits: np.ndarray) -> int:
            z = logits.astype(np.float64) / t
            p = np.exp(z - z.max())
            cdf = np.cumsum(p)
            return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))

        return draw
