"""Quoting a value from a user's file in a message: bounded, whatever its size, depth or aliasing."""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["show", "type_name"]

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 80, 80, 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4
show = _REPR.repr  # a 10**10-leaf alias bomb or a 1 MiB string prints as a few dozen characters


def type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__
