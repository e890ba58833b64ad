"""A generative session's sequences on one device: each fragment's state (its KV caches) per sequence, kept
between steps and never sent anywhere. `begin` opens a sequence with every state input empty (zeros of the
manifest's shape, length 0 along the growing axis) and its token chooser (choose.py); a step feeds the
sequence's state inputs to the fragment and keeps its state outputs as the next step's inputs; the device that
gives the logits chooses the token and sends only its id to the coordinator (and the logits only when the
coordinator asked for them, to verify), and straight to the devices that take it as their next step's input
(token_routes: the token's direct path, last stage -> first stage); `drop` frees the sequence
(wire/protocol.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from ..errors import InputError, RunError
from ..manifest.schedule import host_collects, host_feeds
from ..manifest.types import Fragment, Manifest
from .choose import Sampler

__all__ = ["Sequences", "SequenceState", "MAX_SEQUENCES", "TokenRoute", "token_device", "token_routes",
           "feed_state", "keep_state"]

# Sequences open at once on a device (each holds its caches up to max_context). The coordinator keeps up to two
# steps of each sequence in flight (generate/loop.py), inside the worker's window of MAX_INFLIGHT = 64 requests
# (session.py): 2 x 32.
MAX_SEQUENCES = 32


class TokenRoute(NamedTuple):
    """Where the chosen token goes as a model input: the device whose step list receives `input` from the
    host, as an array of `shape` and `dtype` (a decode step's: one new token)."""

    device: str
    input: str
    shape: tuple[int, ...]
    dtype: str


def token_device(m: Manifest) -> str:
    """The device that chooses each token: the one that sends the logits to the host."""
    return host_collects(m)[m.generate.logits_output]


def token_routes(m: Manifest) -> list[TokenRoute]:
    """Every host input fed the token (generate.feeds role "token"), with the device that receives it, in
    schedule order: the devices the token's chooser sends it to, keyed by the sequence's next request. The
    input's shape at a decode step: its generate.shapes with one new token; InputError for a shape that does not
    hold exactly one token then (one that would need the step's past, which the chooser does not know)."""
    g, dtypes = m.generate, {t.name: t.dtype for t in m.inputs}
    routes = []
    for device, name in host_feeds(m):
        if g.feeds.get(name) != "token":
            continue
        dims = g.shapes.get(name)
        shape = None if dims is None else tuple(1 if d == "seq" else d for d in dims)
        if shape is None or any(isinstance(d, str) for d in shape) or math.prod(shape) != 1:
            raise InputError(f"{m.path}: generate.shapes of token input {name!r} is {dims}: expected seq and sizes "
                             "of 1 (one token per decode step)")
        routes.append(TokenRoute(device, name, shape, dtypes[name]))
    return routes


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
