"""Test matrices whose every row and column runs in README's test command, and the rest in the slow set."""

from __future__ import annotations

import pytest


def checkerboard(rows: list[str], cols: list[str]) -> list:
    """pytest params (row, col) for every pair; the pairs where row index + column index is odd are marked slow.
    Every row and every column keeps a quick pair when both lists have two or more entries."""
    return [pytest.param(r, c, id=f"{r}-{c}", marks=[pytest.mark.slow] if (i + j) % 2 else [])
            for i, r in enumerate(rows) for j, c in enumerate(cols)]


def quick_only(values: list, quick: set) -> list:
    """pytest params for `values`, those not in `quick` marked slow (a sibling test runs them in the quick set)."""
    return [pytest.param(v, id=str(v), marks=[] if v in quick else [pytest.mark.slow]) for v in values]
