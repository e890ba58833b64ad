"""Riders: the tensors a decoder's first layers compute and every decoder layer reads (the rotary tables, the
attention mask; graph.py `riders`), as the pipeline problem prices them (`Riders`).

When the first stage computes every rider, `evaluate` (cost/evaluate.py `_route`) and the emitter send each
one straight from the first stage's device to each later stage that reads it, which on a network where a
message costs its latency is fewer messages per link than forwarding it stage to stage; so the problem prices
them so: the link from the first stage's device to stage k carries the riders stage k reads (beside the
chain's tensors when k = 1), and no chain link carries a rider. A first stage that ends before the last rider
is computed forwards them like any tensor (a price `evaluate`, which routes each tensor no worse than
forwarded, never exceeds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgec.runtime.linkmodel import message_ms

from ..graph import LayerGraph

__all__ = ["Riders", "riders_of"]


@dataclass(frozen=True, eq=False)
class Riders:
    """The riders of a chain of B blocks, in (producer, name) order."""

    ready: int  # blocks [0, ready) compute every rider
    nbytes: tuple[int, ...]  # per rider
    reads: np.ndarray  # [R, B] bool: block b reads rider r
    chain_bytes: tuple[tuple[int, ...], ...]  # [B-1]: per cut, the bytes of each crossing tensor but the riders

    def routed(self, first_hi: int) -> bool:
        """Whether a first stage of blocks [0, first_hi) computes every rider (then they go direct from it)."""
        return first_hi >= self.ready

    def side_ms(self, lo: int, hi: int, bw: float, lat: float) -> float:
        """The messages of the riders that blocks [lo, hi) read, over a link of `bw` bytes/ms and `lat` ms,
        summed in rider order (as `evaluate` adds a link's transfers)."""
        total = 0.0
        for nb, reads in zip(self.nbytes, self.reads):
            if reads[lo:hi].any():
                total += message_ms(nb, float(bw), float(lat)) if bw > 0 else np.inf  # no link
        return float(total)

    def side_table(self, bw: np.ndarray, lat: np.ndarray) -> np.ndarray:
        """S[lo, hi, d] = side_ms(lo, hi, bw[d], lat[d]) for every stage (bit for bit: the same messages added
        in the same order), bw and lat [D] from the first stage's device; inf where it has no link."""
        B = self.reads.shape[1] if self.reads.size else len(self.chain_bytes) + 1
        S = np.zeros((B + 1, B + 1, bw.size))
        hi = np.arange(B + 1)
        for nb, reads in zip(self.nbytes, self.reads):
            # the first block at or after lo that reads it: [lo, hi) reads it when that block is below hi
            after = np.full(B + 1, B, dtype=np.int64)
            for b in range(B - 1, -1, -1):
                after[b] = b if reads[b] else after[b + 1]
            read = after[:, None] < hi[None, :]  # [lo, hi]
            msg = np.array([message_ms(nb, float(w), float(t)) if w > 0 else np.inf for w, t in zip(bw, lat)])
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
    skip = set(names)
    chain = tuple(tuple(graph.tensors[t].nbytes for t in graph.live_across(hi) if t not in skip) for _, hi in blocks[:-1])
    return Riders(ready=1 + max(block_of(graph.producer[t]) for t in names),
                  nbytes=tuple(graph.tensors[t].nbytes for t in names), reads=reads, chain_bytes=chain)
