"""A generative session's sequences on one device: each fragment's state (its KV caches) per sequence, kept
between steps and never sent anywhere. `begin` opens a sequence with every state input empty (zeros of the
manifest's shape, length 0 along the growing axis) and its token chooser (choose.py); a step feeds the
sequence's state inputs to the fragment and keeps its state outputs as the next step's inputs; the device that
gives the logits chooses the token and sends only its id (and the logits only when the coordinator asked for
them, to verify); `drop` frees the sequence (wire/protocol.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InputError, RunError
from ..manifest.types import Fragment, Manifest
from .choose import Sampler

__all__ = ["Sequences", "SequenceState", "MAX_SEQUENCES", "feed_state", "keep_state"]

MAX_SEQUENCES = 64  # sequences open at once on a device (each holds its caches up to max_context)


@dataclass
class SequenceState:
    """One sequence on this device: its state per fragment ({fragment id: {state input: array}}), its token
    chooser, and whether the coordinator wants the logits too."""

    state: dict[str, dict[str, np.ndarray]]
    choose: Callable[[np.ndarray], int]
    logits: bool


class Sequences:
    """The open sequences of one device: {seq: SequenceState}."""

    def __init__(self, manifest: Manifest, device: str):
        self.device = device
        self.fragments = [f for f in manifest.device_fragments(device) if f.state]
        self.open: dict[int, SequenceState] = {}

    def begin(self, seq: int, temperature: float = 0.0, seed: int = 0, logits: bool = False, drawn: int = 0) -> None:
        """Open sequence `seq`, its state empty; its next token is its token number `drawn` (choose.py)."""
        if seq in self.open:
            raise InputError(f"device {self.device}: sequence {seq} is already open")
        if len(self.open) >= MAX_SEQUENCES:
            raise InputError(f"device {self.device}: more than {MAX_SEQUENCES} sequences open at once")
        state = {f.id: {s.input: np.zeros(s.shape, s.dtype) for s in f.state} for f in self.fragments}
        self.open[seq] = SequenceState(state, Sampler(temperature, seed).for_sequence(seq, drawn), logits)

    def drop(self, seq: int) -> None:
        if self.open.pop(seq, None) is None:
            raise InputError(f"device {self.device}: drop of sequence {seq}, which is not open")

    def get(self, seq: int) -> SequenceState:
        """The sequence, for one step (RunError when it is not open)."""
        found = self.open.get(seq)
        if found is None:
            raise RunError(f"device {self.device}: a step of sequence {seq}, which is not open")
        return found

    def clear(self) -> None:
        self.open.clear()


def feed_state(own: dict[str, np.ndarray], store: dict[str, np.ndarray]) -> None:
    """Put the fragment's state inputs into the step's store before it runs."""
    store.update(own)


def keep_state(frag: Fragment, own: dict[str, np.ndarray], store: dict[str, np.ndarray], device: str) -> None:
    """Take the fragment's state outputs out of the store into the sequence's state (the next step's inputs);
    the state inputs leave the store too, so no later step can send a cache anywhere."""
    for s in frag.state:
        new = store.pop(s.output)
        store.pop(s.input, None)
        if new.ndim != len(s.shape) or new.shape[s.axis] > s.max_length:
            raise RunError(f"device {device}: fragment {frag.id}: state {s.output!r} of shape {new.shape} is "
                           f"beyond its max_length {s.max_length} along axis {s.axis}")
        own[s.input] = new
