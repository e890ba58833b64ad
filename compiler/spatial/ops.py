"""Row algebra of the operators a tile computes besides Conv/MaxPool/AveragePool (no ONNX).

Each is a Window subclass (Layer.window holds it; layers.py builds it from the node's attributes):

- SliceWindow: a Slice on H/W, output row o is input row start + o*step: a window of 1 with stride step,
  the start as a negative pad before and end - size (<= 0) as the pad after. SpaceToDepth is a plain
  Window (kernel = stride = block, no pads).
- Upsample: DepthToSpace and Resize by an integer factor u. Output row q*u + r reads input rows
  [q + taps[r][0], q + taps[r][1]) (clipped to the tensor): the coordinate map of every mode it is built
  for is shift-invariant, x(o + u) = x(o) + 1. A tile computes whole input rows [lo, hi) into output rows
  [lo*u, hi*u) and keeps the rows it needs.
- Transposed: ConvTranspose. A tile computes exactly its output rows from the input rows that contribute
  to them, with pads and output_padding rewritten (`transposed_attrs`).
- Refused: an operator on 4-D tensors whose attributes admit no exact tiling; `why` is the reason the
  planners report.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Window

__all__ = ["Refused", "SliceWindow", "Upsample", "Transposed", "upsample_need", "upsample_rows",
           "transposed_need", "transposed_attrs", "transposed_rows"]


@dataclass(frozen=True)
class Refused(Window):
    """An operator that cannot be tiled; `why` says which attribute prevents it."""

    why: str = ""


@dataclass(frozen=True)
class SliceWindow(Window):
    """A Slice with positive steps on H/W (kernel 1, stride = step, pads = (-start, end - size))."""


@dataclass(frozen=True)
class Upsample(Window):
    """Integer upsampling by `factors` (H, W); `taps[j][r]` = input row offsets [lo, hi) from q of output
    row q*u + r along axis 2 + j."""

    factors: tuple[int, int] = (1, 1)
    taps: tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]] = ((), ())


@dataclass(frozen=True)
class Transposed(Window):
    """ConvTranspose geometry: kernel, strides, pads, dilations and output_padding (H, W) as the operator's
    attributes."""

    output_padding: tuple[int, int] = (0, 0)


def upsample_need(win: Upsample, axis: int, a, b, in_size: int):
    """(first input row for output rows from a, end input row for output rows ending at b), on numpy arrays.

    Both are widened to whole input rows of the tile's output: a tile computes output rows [lo*u, hi*u),
    which must contain [a, b)."""
    j = axis - 2
    u = win.factors[j]
    offs = np.array(win.taps[j], dtype=np.int64).reshape(u, 2)
    q, r = np.divmod(np.asarray(a), u)
    lo = q + np.minimum(offs[r, 0], 0)
    qb, rb = np.divmod(np.asarray(b) - 1, u)
    hi = qb + np.maximum(offs[rb, 1], 1)
    return np.clip(lo, 0, in_size), np.clip(hi, 0, in_size)


def upsample_rows(win: Upsample, axis: int, lo, hi):
    """Output rows a tile computes from input rows [lo, hi)."""
    u = win.factors[axis - 2]
    return np.asarray(lo) * u, np.asarray(hi) * u


def _transposed_geometry(win: Transposed, axis: int) -> tuple[int, int, int, int]:
    j = axis - 2
    eff = (win.kernel[j] - 1) * win.dilations[j] + 1
    return eff, win.strides[j], win.pads[j], win.pads[j + 2]


def transposed_need(win: Transposed, axis: int, a, b, in_size: int):
    """Input rows [lo, hi) that contribute to output rows [a, b) of a ConvTranspose (numpy arrays).

    Output row o is full row o + pb, which input row i reaches through tap k when i*s + k*d = o + pb. lo is
    never above floor((a + pb) / s), so the tile's pad before stays >= 0 where rows a.. get no contribution
    at all (a stride wider than the kernel); an extra row is harmless, the tile's pads drop what it adds.
    At least one row is always read (an operator needs one), the last if no other."""
    eff, s, pb, _ = _transposed_geometry(win, axis)
    a, b = np.asarray(a), np.asarray(b)
    first = -((-(a + pb - eff + 1)) // s)  # ceil
    lo = np.minimum(first, (a + pb) // s)
    hi = (b - 1 + pb) // s + 1
    return np.clip(lo, 0, in_size - 1), np.clip(hi, 1, in_size)


def transposed_rows(win: Transposed, axis: int, in_size: int) -> int:
    """Output rows of the whole operator (ONNX's shape formula)."""
    eff, s, pb, pe = _transposed_geometry(win, axis)
    return s * (in_size - 1) + win.output_padding[axis - 2] + eff - pb - pe


def transposed_attrs(win: Transposed, axis: int, lo: int, hi: int, a: int, b: int) -> tuple[int, int, int]:
    """(pad before, pad after, output_padding) of a tile computing output rows [a, b) from input rows
    [lo, hi). The tile's full output (before pads) starts at the model's full row lo*s; rows past its last
    input's reach get no contribution in the model either (only the bias), which output_padding supplies."""
    eff, s, pb, _ = _transposed_geometry(win, axis)
    full = (hi - lo - 1) * s + eff
    start, stop = a + pb - lo * s, b + pb - lo * s
    if start < 0:
        raise ValueError(f"ConvTranspose tile [{a}, {b}) from input rows [{lo}, {hi}) starts before the tile's rows")
    return (start, full - stop, 0) if stop <= full else (start, 0, stop - full)
