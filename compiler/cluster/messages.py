"""A schema parse whose first problem becomes ONE plain-English line: `<file>: <key path> <what is wrong>`.

pydantic reports an error as a location tuple and a type; the key path is rendered by walking the schema
along the location (model fields `a.b`, list items `[0]`, thread counts `.2`, other keys `['conv1']`), and
the text comes from the error type, or from the `description` of the place when the schema gives one.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core.core_schema import ErrorType

from edgec.compiler.errors import UserError

from .quote import show, type_name

__all__ = ["parse"]

_FLOAT_WITHOUT_DOT = re.compile(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+")  # YAML 1.1 reads 1e3 as a string
_KEY_NOUNS = {"string_type": "strings", "int_type": "integers", "string_unicode": "valid Unicode text"}
_PYDANTIC_ERRORS = frozenset(get_args(ErrorType))  # any other type is the schema's own PydanticCustomError

M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Any, path: str, root: str) -> M:
    """`data` checked against `model`; the first problem raises UserError(one line, path=path).  `root` names
    the document in messages ("profile", "cluster file")."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise UserError(_describe(_first(e.errors(include_url=False)), model, data, root), path=path) from None


_KEY_ERRORS = ("invalid_key", "extra_forbidden", "missing")  # what is wrong with a mapping's keys, in this order


def _first(errors: list[dict]) -> dict:
    """The problem a reader meets first: pydantic lists a mapping's wrong keys after its values' errors, but a
    misspelt key is better reported as unknown (with the allowed keys) than as a missing one.  So a wrong key
    of the shallowest mapping around the first error comes first."""
    loc = tuple(errors[0]["loc"])
    for depth in range(len(loc)):
        for kind in _KEY_ERRORS:
            for err in errors:
                if err["type"] == kind and tuple(err["loc"][:-1]) == loc[:depth]:
                    return err
    return errors[0]


# --------------------------------------------------------------------------------------------------
# Walking the schema along an error's location


@dataclass(frozen=True)
class _Place:
    tp: Any  # the type expected here, without Annotated and `| None`
    expected: str | None  # the schema's description of what belongs here
    raw: Any  # the input found here (None when the location leaves the input)
    path: str  # the key path so far, e.g. "threads.2.gflops"
    label: str | None = None  # what the keys below call this place instead of its path, e.g. "device 'a'"


def _unwrap(tp: Any) -> tuple[Any, str | None]:
    expected = None
    while True:
        if get_origin(tp) is Annotated:
            for meta in tp.__metadata__:
                if isinstance(meta, FieldInfo) and meta.description and expected is None:
                    expected = meta.description
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp) and len(get_args(tp)) == 2:
            tp = next(a for a in get_args(tp) if a is not type(None))
        else:
            return tp, expected


def _item(raw: Any, seg: Any) -> Any:
    try:
        return raw[seg] if isinstance(raw, (dict, list, tuple)) else None
    except (KeyError, IndexError, TypeError):
        return None


def _key_text(key: Any, key_type: Any) -> str:
    """A mapping's key in a path: fixed names as fields are (`.conv`), thread counts `.2`, others quoted (`['LRN']`)."""
    named = get_origin(key_type) is Literal or (isinstance(key, int) and not isinstance(key, bool))
    return f".{key}" if named else f"[{show(key)}]"


def _step(at: _Place, seg: Any) -> _Place:
    tp, raw = at.tp, _item(at.raw, seg)
    if isinstance(tp, type) and issubclass(tp, BaseModel) and seg in tp.model_fields:
        field = tp.model_fields[seg]
        inner, expected = _unwrap(field.annotation)
        path = f"{at.label}: {seg}" if at.label else f"{at.path}.{seg}" if at.path else str(seg)
        return _Place(inner, field.description or expected, raw, path)
    if isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields") and isinstance(seg, int):
        name = tp._fields[seg]  # a NamedTuple's positions are read by their names: "[0] output elements"
        inner, expected = _unwrap(get_type_hints(tp, include_extras=True)[name])
        return _Place(inner, expected, raw, f"{at.path} {name.replace('_', ' ')}")
    args = get_args(tp)
    if get_origin(tp) is dict:
        inner, expected = _unwrap(args[1])
        return _Place(inner, expected, raw, at.path + _key_text(seg, _unwrap(args[0])[0]))
    inner, expected = _unwrap(args[0]) if get_origin(tp) is list else (Any, None)
    labeller = getattr(inner, "message_label", None)
    path = f"{at.path}[{seg}]" if isinstance(seg, int) else at.path + _key_text(seg, Any)
    return _Place(inner, expected, raw, path, labeller(raw) if labeller else None)


def _walk(model: type[BaseModel], data: Any, loc: tuple) -> _Place:
    at = _Place(model, None, data, "")
    for seg in loc:
        at = _step(at, seg)
    return at


# --------------------------------------------------------------------------------------------------
# Error types -> text


def _got(v: Any) -> str:
    return "got null" if v is None else f"got {type_name(v)} {show(v)}"


def _bound_text(kind: str, ctx: dict, v: Any) -> str | None:
    if kind == "greater_than":
        return ("must be positive" if ctx["gt"] == 0 else f"must be greater than {ctx['gt']:g}") + f", got {show(v)}"
    if kind == "greater_than_equal":
        if ctx["ge"] == 0:
            return f"must not be negative, got {show(v)}"
        return (f"must be at least {ctx['ge']:g}" if v > 0 else "must be positive") + f", got {show(v)}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']:g}, got {show(v)}"
    return None


def _value_text(kind: str, ctx: dict, v: Any, at: _Place) -> str | None:
    """What is wrong with the value `v` at a place whose schema gives no description; None: no text known."""
    if kind == "float_type":
        if isinstance(v, int) and not isinstance(v, bool):  # a strict float takes every int that a float can hold
            return f"must be finite, got {show(v)}"
        unread_float = isinstance(v, str) and _FLOAT_WITHOUT_DOT.fullmatch(v.strip())
        hint = " (write floats with a dot, e.g. 1.0e3)" if unread_float else ""
        return f"must be a number, {_got(v)}{hint}"
    if kind == "finite_number":
        return f"must be finite, got {show(v)}"
    if kind in ("model_type", "dict_type"):
        return f"must be a mapping, got {type_name(v)}"
    if kind == "list_type":
        return f"must be a list, got {type_name(v)}"
    if kind == "string_type":
        return f"must be a string, {_got(v)}"
    if kind == "int_type":
        return f"must be an integer, {_got(v)}"
    if kind == "bool_type":
        return f"must be true or false, got {show(v)}"
    if kind == "literal_error" and get_origin(at.tp) is Literal:
        return f"must be one of {', '.join(map(str, get_args(at.tp)))}, got {show(v)}"
    return _bound_text(kind, ctx, v)


def _describe(err: dict, model: type[BaseModel], data: Any, root: str) -> str:
    loc, kind, v, ctx = tuple(err["loc"]), err["type"], err.get("input"), err.get("ctx") or {}
    if loc and loc[-1] == "[key]":
        return _key_problem(_walk(model, data, loc[:-2]), kind, v, root)
    if kind in _KEY_ERRORS:  # about a key of the model at loc[:-1]
        parent = _walk(model, data, loc[:-1])
        where = parent.path or root
        if kind == "invalid_key":
            return f"{where}: keys must be strings, {_got(loc[-1])}"
        if kind == "missing":
            return f"missing required key {loc[-1]!r} in {where}"
        return f"unknown key {show(loc[-1])} in {where} (allowed: {', '.join(parent.tp.model_fields)})"
    at = _walk(model, data, loc)
    if not at.path:
        return f"a {root} must be a mapping, got {type_name(v)}"
    if kind not in _PYDANTIC_ERRORS:
        return f"{at.path}: {err['msg']}"
    if kind == "string_unicode":  # a lone surrogate ("\ud83d" in a quoted YAML string) cannot be written out as UTF-8
        if isinstance(at.tp, type) and issubclass(at.tp, BaseModel):
            return f"{at.path}: keys must be valid Unicode text, got {show(v)}"
        return f"{at.path} must be valid Unicode text, got {show(v)}"
    if at.expected is not None:
        return f"{at.path} must be {at.expected}, {_got(v)}"
    text = _value_text(kind, ctx, v, at)
    return f"{at.path} {text}" if text else f"{at.path}: {err['msg'].splitlines()[0]}"


def _key_problem(at: _Place, kind: str, key: Any, root: str) -> str:
    where = at.path or root
    key_type, expected = _unwrap(get_args(at.tp)[0]) if get_origin(at.tp) is dict else (Any, None)
    if get_origin(key_type) is Literal:
        return f"unknown key {show(key)} in {where} (allowed: {', '.join(map(str, get_args(key_type)))})"
    return f"{where}: keys must be {expected or _KEY_NOUNS.get(kind, 'valid keys')}, {_got(key)}"
