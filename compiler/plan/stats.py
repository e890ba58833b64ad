"""What a planner's search did, for `edgec compile --json`: units of work counted, and search details.

Planners keep their signature `(graph, cost, objective, options) -> [Plan]` and report to the recording
the driver opens around them (`recording`); outside one, `count` and `detail` do nothing. Work done in
forked search lanes (lanes.py) comes back to this process as data and is reported here, so the figures
do not depend on --jobs.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

__all__ = ["UNITS", "count", "detail", "recording", "suspended"]

# unit -> what one of it is (the `planning` key of `edgec compile --json`; reference: docs/gen/jsonout.py)
UNITS = {
    "labels": "pipeline DP labels built (per state: its candidate stages, or transfers, times the top-k slots) "
              "before each state keeps its k best",
    "nodes": "tile-size partition-tree nodes expanded (spatial search: every partition search, summed)",
    "states": "(cut, partition) states of the spatial search expanded",
    "plans": "complete plans scored with the cost model",
}

_current: contextvars.ContextVar[dict | None] = contextvars.ContextVar("edgec_plan_stats", default=None)


def count(unit: str, n: int) -> None:
    """Add n units of work to the recording."""
    rec = _current.get()
    if rec is None:
        return
    if unit not in UNITS:
        raise ValueError(f"unknown unit of planner work {unit!r} (choose from {', '.join(UNITS)})")
    work = rec.setdefault("work", {})
    work[unit] = work.get(unit, 0) + int(n)


def detail(**values) -> None:
    """Planner-specific figures (numbers are summed over calls, other values replaced)."""
    rec = _current.get()
    if rec is None:
        return
    details = rec.setdefault("detail", {})
    for key, value in values.items():
        summable = isinstance(value, (int, float)) and not isinstance(value, bool)
        details[key] = details.get(key, 0) + value if summable and key in details else value


@contextlib.contextmanager
def recording() -> Iterator[dict]:
    """A fresh record for the planners run inside: {"work": {unit: n}, "detail": {...}} as reported."""
    rec: dict = {}
    token = _current.set(rec)
    try:
        yield rec
    finally:
        _current.reset(token)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Nothing inside is recorded: work whose figures are reported another way (a search lane's)."""
    token = _current.set(None)
    try:
        yield
    finally:
        _current.reset(token)
