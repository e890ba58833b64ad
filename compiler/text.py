"""Text for people: tables and lines that fit a terminal WIDTH columns wide (compile, inspect, simulate, allocate)."""

from __future__ import annotations

import textwrap

__all__ = ["WIDTH", "MIN_COLUMN", "table", "fit", "fmt_cell"]

WIDTH = 100  # every table and line the commands print fits a terminal this wide
MIN_COLUMN = 10  # a column narrowed to fit is never narrower than this


def table(headers: list[str], rows: list[list], width: int = WIDTH) -> str:
    """Columns of cells, the first left-aligned and the others right-aligned. Wider than `width`, the widest
    columns are narrowed (to MIN_COLUMN at least) and their cells wrapped onto further lines, left-aligned."""
    cells = [[str(h) for h in headers]] + [[fmt_cell(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    wrapped: set[int] = set()
    while sum(widths) + 2 * (len(widths) - 1) > width:
        i = max(range(len(widths)), key=lambda k: widths[k])
        if widths[i] <= MIN_COLUMN:
            break
        widths[i] -= 1
        wrapped.add(i)
    lines = []
    for n, r in enumerate(cells):
        parts = [_wrap(c, w) if i in wrapped else [c] for i, (c, w) in enumerate(zip(r, widths))]
        for k in range(max(len(p) for p in parts)):
            row = [p[k] if k < len(p) else "" for p in parts]
            line = "  ".join(c.ljust(w) if i == 0 or i in wrapped else c.rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths)))
            lines.append(line.rstrip() if wrapped else line)  # unwrapped tables print as they always did
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width`: broken at spaces, and inside a word longer than a line."""
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def fit(text: str, width: int = WIDTH) -> str:
    """Every line of `text` longer than `width` wrapped at spaces, its continuation indented by two."""
    out = []
    for line in text.split("\n"):
        out.extend([line] if len(line) <= width else
                   textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False))
    return "\n".join(out)


def fmt_cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return "-" if v is None else str(v)
