"""Fresh names for what a pass adds to a graph: never one already taken."""

from __future__ import annotations

__all__ = ["fresh"]


def fresh(base: str, taken: set[str], sep: str = "_") -> str:
    """`base`, or else `base` + sep + the least n >= 1 that makes it new; added to `taken`. Each pass keeps its
    own separator, which the names it has always emitted carry."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}{sep}{n}"
    taken.add(name)
    return name
