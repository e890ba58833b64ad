"""Test matrices whose every row and column runs in README's test command, and the rest in the slow set."""

from __future__ import annotations

import pytest


def checkerboard(rows: list[str], cols: list[str]) -> list:
    """pytest params (row, col) for every pair; the pairs where row index + column index is odd are marked slow.
    Every row and every column keeps a quick pair when both lists have two or more entries."""
    return [pytest.param(r, c, id=f"{r}-{c}", marks=[pytest.mark.slow] if (i + j) % 2 else [])
            for i, r in enumerate(rows) for j, c in enumerate(cols)]
