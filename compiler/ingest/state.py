"""State of a generative model: which inputs are a decoder's KV cache and which outputs replace them at the
next step (`find_state`), and what each dynamic dimension of the inputs stands for (`dim_roles`).

A pair is recognised by name (`past_key_values.3.key` <-> `present.3.key`, `past_key.3` <-> `present_key.3`,
`cache_k_3` <-> `cache_k_out_3` ...: an input that says past or cache and an output that says present or
cache, with the same layer number and the same key/value kind), or named with `--state IN=OUT`.  Its input
and output agree in dtype and rank, their fixed dimensions are equal, and exactly one dimension grows: the
input's dynamic dimension that is not the batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx

from ..errors import UserError
from ..layers import np_dtype

__all__ = ["StatePair", "DimRoles", "find_state", "parse_state_option", "dim_roles", "input_dims"]

_WORDS = re.compile(r"[a-z]+|\d+")
_IN_WORDS = {"past", "cache", "kv", "caches"}
_OUT_WORDS = {"present", "cache", "kv", "caches", "new", "out", "next", "updated"}
_KEY = {"key", "k", "keys"}
_VALUE = {"value", "v", "values"}


@dataclass(frozen=True)
class StatePair:
    """An input the model reads its state from and the output that holds the next step's state."""

    input: str
    output: str
    dtype: str  # numpy name
    dims: tuple[int | str, ...]  # the input's dimensions: fixed sizes, or the symbol of a dynamic one
    axis: int  # the growing axis (the past length)


@dataclass(frozen=True)
class DimRoles:
    """What each dynamic dimension symbol of the inputs is: the batch (pinned to 1), the new tokens of a
    step (seq), the cached tokens (past) or both (total = past + seq, an attention mask's length)."""

    token_input: str  # the graph input that takes the token ids
    roles: dict[str, str]  # symbol -> "batch" | "seq" | "past" | "total"

    def pin(self, dims: tuple[int | str, ...], seq: int, past: int) -> tuple[int, ...]:
        size = {"batch": 1, "seq": seq, "past": past, "total": past + seq}
        return tuple(d if isinstance(d, int) else size[self.roles[d]] for d in dims)


def input_dims(vi: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    """Fixed sizes as ints, dynamic ones as their symbol ("?" + position when they have none)."""
    out: list[int | str] = []
    for i, d in enumerate(vi.type.tensor_type.shape.dim):
        out.append(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or f"?{i}"))
    return tuple(out)


def _key(name: str, words: set[str]) -> tuple[int, str] | None:
    """(layer number, "key"|"value"|"") of a name that looks like state under `words`; None otherwise."""
    parts = _WORDS.findall(name.lower())
    if not words & set(parts):
        return None
    numbers = [p for p in parts if p.isdigit()]
    if not numbers:
        return None
    kinds = [p for p in parts if p in _KEY or p in _VALUE]  # the last one: past_key_values.3.value is a value
    kind = "" if not kinds else "key" if kinds[-1] in _KEY else "value"
    return int(numbers[-1]), kind


def parse_state_option(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`IN=OUT` strings -> {input: output}."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, output = item.partition("=")
        if not sep or not name or not output:
            raise UserError(f"--state {item!r}: expected IN=OUT (a model input and the output that replaces it)")
        out[name] = output
    return out


def find_state(model: onnx.ModelProto, explicit: dict[str, str], path: str) -> tuple[StatePair, ...]:
    """The model's state pairs, in input order: those of `explicit` and those recognised by name. An input
    or output that looks like state without a partner, or a pair that disagrees, is a UserError."""
    inits = {i.name for i in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    outputs = {vi.name: vi for vi in model.graph.output}
    for a, b in explicit.items():
        if a not in inputs:
            raise UserError(f"--state {a}={b}: {a!r} is not an input of the model", path)
        if b not in outputs:
            raise UserError(f"--state {a}={b}: {b!r} is not an output of the model", path)
    taken_out = set(explicit.values())
    ins = {n: k for n in inputs if n not in explicit and (k := _key(n, _IN_WORDS)) is not None}
    outs = {n: k for n in outputs if n not in taken_out and (k := _key(n, _OUT_WORDS)) is not None}
    by_key: dict[tuple[int, str], list[str]] = {}
    for n, k in outs.items():
        by_key.setdefault(k, []).append(n)
    pairs = dict(explicit)
    for n, k in ins.items():
        partners = by_key.get(k, [])
        if len(partners) != 1:
            what = "no output" if not partners else f"{len(partners)} outputs ({', '.join(partners)})"
            raise UserError(f"input {n!r} looks like a cache but {what} match it: name its output with "
                            f"--state {n}=OUTPUT", path)
        pairs[n] = partners[0]
    unpaired = [n for n in outs if n not in pairs.values()]
    if unpaired:
        raise UserError(f"output {unpaired[0]!r} looks like a cache but no input matches it: name its input "
                        f"with --state INPUT={unpaired[0]}", path)
    if not pairs:
        raise UserError("--generate: no cache inputs found (past_key_values.N.key ... or --state IN=OUT)", path)
    return tuple(_pair(inputs[a], outputs[b], path) for a, b in sorted(pairs.items(), key=lambda p: list(inputs).index(p[0])))


def _pair(vi_in: onnx.ValueInfoProto, vi_out: onnx.ValueInfoProto, path: str) -> StatePair:
    a, b = vi_in.name, vi_out.name
    ta, tb = vi_in.type.tensor_type.elem_type, vi_out.type.tensor_type.elem_type
    if ta != tb:
        raise UserError(f"state {a!r} -> {b!r}: dtypes differ ({np_dtype(ta)} and {np_dtype(tb)})", path)
    da, db = input_dims(vi_in), input_dims(vi_out)
    if len(da) != len(db) or not da:
        raise UserError(f"state {a!r} -> {b!r}: ranks differ ({len(da)} and {len(db)})", path)
    growing = [i for i, d in enumerate(da) if isinstance(d, str) and i > 0]
    if len(growing) != 1:
        raise UserError(f"state {a!r}: expected exactly one dynamic dimension besides the batch (the past "
                        f"length), got shape {list(da)}", path)
    axis = growing[0]
    for i, (x, y) in enumerate(zip(da, db)):
        if i != axis and isinstance(x, int) and isinstance(y, int) and x != y:
            raise UserError(f"state {a!r} -> {b!r}: dimension {i} differs ({x} and {y})", path)
    if isinstance(db[axis], int):
        raise UserError(f"state {a!r} -> {b!r}: the output's dimension {axis} is fixed ({db[axis]}), it cannot "
                        "grow with the past", path)
    dtype = np_dtype(ta)
    return StatePair(a, b, str(dtype), da, axis)


def dim_roles(model: onnx.ModelProto, pairs: tuple[StatePair, ...], path: str) -> DimRoles:
    """Name every dynamic dimension of the inputs: the state inputs' growing axis is the past; the token
    input's other dynamic axis the new tokens (seq); axis 0 the batch; an attention mask's the total."""
    inits = {i.name for i in model.graph.initializer}
    inputs = {vi.name: input_dims(vi) for vi in model.graph.input if vi.name not in inits}
    roles: dict[str, str] = {}
    for p in pairs:
        roles[p.dims[p.axis]] = "past"
    token = _token_input(model, inputs, {p.input for p in pairs}, path)
    for name, dims in inputs.items():
        if dims and isinstance(dims[0], str) and dims[0] not in roles:
            roles[dims[0]] = "batch"
    for d in inputs[token][1:]:
        if isinstance(d, str):
            roles.setdefault(d, "seq")
    for name, dims in inputs.items():
        for i, d in enumerate(dims):
            if isinstance(d, str) and d not in roles:
                if "mask" not in name.lower():
                    raise UserError(f"--generate: dimension {i} ({d}) of input {name!r} is neither the batch, the "
                                    "new tokens, the past nor an attention mask's total length", path)
                roles[d] = "total"
    return DimRoles(token, roles)


def _token_input(model: onnx.ModelProto, inputs: dict, state: set[str], path: str) -> str:
    if "input_ids" in inputs:
        return "input_ids"
    ints = [vi.name for vi in model.graph.input if vi.name in inputs and vi.name not in state
            and vi.type.tensor_type.elem_type == onnx.TensorProto.INT64 and "ids" in vi.name.lower()
            and "position" not in vi.name.lower()]
    if len(ints) != 1:
        raise UserError("--generate: cannot tell which input takes the token ids (expected one int64 input "
                        "named like input_ids)", path)
    return ints[0]
