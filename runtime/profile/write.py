"""Writing a profile on the device: YAML in flow style, written without a YAML library.

The device has no YAML library and no schema (pydantic is the planner's): the compiler validates a profile
when it loads one (`edgec compile`, `edgec profile --refine`), and the full install's `edgec profile` writes
its block YAML through the compiler (compiler/profile/output.py).  Flow style is JSON's syntax, with two
differences `dumps` minds: a thread count key is written as the integer it is (`1: {...}`; JSON would quote it,
and the schema wants integers), and a float always has a dot, since PyYAML (YAML 1.1) reads Python's `1e-05`
as a string (written `1.0e-05`).  Written atomically: a file is whole or absent.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from edgec.runtime.errors import InputError
from edgec.runtime.files import write_atomically

__all__ = ["dumps", "write_profile_flow", "check_output_path"]


def _number(x: float) -> str:
    if not math.isfinite(x):
        raise ValueError(f"a profile holds finite numbers only, not {x!r}")
    text = repr(float(x))
    if "e" in text and "." not in text:  # 1e-05 -> 1.0e-05: a float to YAML 1.1 as well as to JSON
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


def _key(k: Any) -> str:
    if isinstance(k, int) and not isinstance(k, bool):
        return str(k)  # a thread count: YAML reads it back as an integer
    if not isinstance(k, str):
        raise TypeError(f"a profile's keys are strings or thread counts, not {type(k).__name__}")
    return json.dumps(k, ensure_ascii=False)


def dumps(value: Any, indent: int = 0) -> str:
    """`value` (dicts, lists, strings, numbers, booleans, None) in YAML's flow style, which YAML 1.1 loads to the
    same value: one key per line, lists of numbers (an efficiency point) on one line."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{_key(k)}: {dumps(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return "[" + ", ".join(dumps(v) for v in value) + "]"
        return "[\n" + ",\n".join(f"{inner}{dumps(v, indent + 1)}" for v in value) + f"\n{pad}]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"a profile holds no {type(value).__name__}")


def check_output_path(path: str | Path) -> None:
    """InputError unless a profile can be written at `path`: a file (or nothing yet) in a folder that exists
    and that this user may write into. Checked before measuring, and again when writing."""
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise InputError(f"{p}: is a folder; give a file name for the profile")
    if not folder.is_dir():
        raise InputError(f"{p}: folder {str(folder)!r} does not exist (create it first)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{p}: cannot write into folder {str(folder)!r} (permission denied)")


def write_profile_flow(profile: dict[str, Any], path: str | Path) -> None:
    """Write a profile dict (measure_host's) as flow-style YAML, atomically; the compiler's load_profile reads it."""
    text = dumps(profile) + "\n"
    check_output_path(path)
    write_atomically(path, "the profile", lambda fh: fh.write(text.encode("utf-8")))
