"""Riders: the tensors a decoder's first layers compute and every decoder layer reads (the rotary tables, the
attention mask; graph.py `riders`), as the pipeline problem prices them (`Riders`).

`evaluate` (cost/evaluate.py `_route`) and the emitter send each tensor that skips a stage either forwarded
stage to stage or straight from its producer's stage to each stage that reads it, whichever it finds no
worse, tensor by tensor; where a message costs its latency (1 ms on bench_generate's network), the riders'
routing is most of a split decoder's traffic. So the problem prices each routing (`routings`: a set of
riders sent direct from the first stage, which must compute them, the others forwarded) and a plan at its
best routing: the link from the first stage's device to stage k carries the direct riders stage k reads
(beside the chain's tensors when k = 1), and the chain's links the forwarded ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from edgec.runtime.linkmodel import message_ms

from ..graph import LayerGraph

__all__ = ["Riders", "riders_of"]


@dataclass(frozen=True, eq=False)
class Riders:
    """The riders of a chain of B blocks, in (producer, name) order."""

    made: tuple[int, ...]  # per rider: the block that computes it
    nbytes: tuple[int, ...]  # per rider
    reads: np.ndarray  # [R, B] bool: block b reads rider r
    items: tuple[tuple[tuple[int, int], ...], ...]  # [B-1]: per cut, (bytes, rider or -1) of each crossing tensor

    def ready(self, direct: frozenset[int]) -> int:
        """The first stage sends the riders `direct` when it computes them: when it ends at this block or later."""
        return 1 + max(self.made[r] for r in direct)

    @lru_cache(maxsize=None)  # noqa: B019 (a problem's riders live as long as it; a few sets each)
    def routings(self) -> list[frozenset[int]]:
        """Every set of riders that may go direct (the others forwarded), up to swapping riders alike (same
        bytes, block and readers: rope.cos and rope.sin), which route alike: the empty set first."""
        groups: dict[tuple, list[int]] = {}
        for r in range(len(self.nbytes)):
            groups.setdefault((self.nbytes[r], self.made[r], self.reads[r].tobytes()), []).append(r)
        out = [frozenset()]
        for members in groups.values():
            out = [d | frozenset(members[:c]) for d in out for c in range(len(members) + 1)]
        return out

    @lru_cache(maxsize=None)  # noqa: B019
    def chain_bytes(self, direct: frozenset[int]) -> tuple[tuple[int, ...], ...]:
        """Per cut, the bytes of each crossing tensor but the riders `direct`."""
        return tuple(tuple(nb for nb, r in cut if r not in direct) for cut in self.items)

    def side_ms(self, lo: int, hi: int, bw: float, lat: float, direct: frozenset[int]) -> float:
        """The messages of the riders `direct` that blocks [lo, hi) read, over a link of `bw` bytes/ms and `lat`
        ms, summed in rider order (as `evaluate` adds a link's transfers)."""
        total = 0.0
        for r in sorted(direct):
            if self.reads[r, lo:hi].any():
                total += message_ms(self.nbytes[r], float(bw), float(lat)) if bw > 0 else np.inf  # no link
        return float(total)

    def side_table(self, bw: np.ndarray, lat: np.ndarray, direct: frozenset[int]) -> np.ndarray:
        """S[lo, hi, d] = side_ms(lo, hi, bw[d], lat[d], direct) for every stage (bit for bit: the same messages
        added in the same order), bw and lat [D] from the first stage's device."""
        B = self.reads.shape[1]
        S = np.zeros((B + 1, B + 1, bw.size))
        hi = np.arange(B + 1)
        for r in sorted(direct):
            # the first block at or after lo that reads it: [lo, hi) reads it when that block is below hi
            after = np.full(B + 1, B, dtype=np.int64)
            for b in range(B - 1, -1, -1):
                after[b] = b if self.reads[r, b] else after[b + 1]
            read = after[:, None] < hi[None, :]  # [lo, hi]
            msg = np.array([message_ms(self.nbytes[r], float(w), float(t)) if w > 0 else np.inf for w, t in zip(bw, lat)])
            S = S + np.where(read[:, :, None], msg[None, None, :], 0.0)
        return S


def riders_of(graph: LayerGraph, blocks: tuple[tuple[int, int], ...]) -> Riders | None:
    """The riders of `graph` on its chain of `blocks` that cross a cut, or None when there are none."""
    if not graph.riders or len(blocks) < 2:
        return None
    starts = np.array([lo for lo, _ in blocks])
    block_of = lambda layer: int(np.searchsorted(starts, layer, side="right") - 1)  # noqa: E731
    names = []
    for t in sorted(graph.riders & graph.producer.keys(), key=lambda t: (graph.producer[t], t)):
        p = block_of(graph.producer[t])
        if any(block_of(u) != p for u in graph.consumers.get(t, ())):
            names.append(t)
    if not names:
        return None
    reads = np.zeros((len(names), len(blocks)), dtype=bool)
    for r, t in enumerate(names):
        for u in graph.consumers[t]:
            reads[r, block_of(u)] = True
    index = {t: r for r, t in enumerate(names)}
    items = tuple(tuple((graph.tensors[t].nbytes, index.get(t, -1)) for t in graph.live_across(hi)) for _, hi in blocks[:-1])
    return Riders(made=tuple(block_of(graph.producer[t]) for t in names),
                  nbytes=tuple(graph.tensors[t].nbytes for t in names), reads=reads, items=items)
