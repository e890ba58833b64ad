"""A generative build's part of the manifest (version 2): each fragment's `state` and the top-level `generate`
block, parsed and checked against the rest (load.py documents them)."""

from __future__ import annotations

from typing import Any

from .types import DIM_ROLES, FEEDS, Fragment, Generate, Manifest, StateSpec

__all__ = ["parse_state", "parse_generate", "check_generate"]


def parse_state(r, raw: Any, where: str) -> tuple[StateSpec, ...]:
    """A fragment's optional `state`: [{input, output, dtype, shape, axis, max_length}], the shape's `axis`
    of length 0 (the empty value before a sequence's first step)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        r.fail(where, "expected a non-empty list")
    out = []
    for i, d in enumerate(raw):
        w = f"{where}[{i}]"
        d = r.obj(d, w)
        unknown = sorted(set(d) - {"input", "output", "dtype", "shape", "axis", "max_length"})
        if unknown:
            r.fail(w, f"unknown key {unknown[0]!r}")
        shape = r.shape(d, w)
        axis = r.int(d, "axis", w, minimum=0)
        if axis >= len(shape) or shape[axis] != 0:
            r.fail(f"{w}.axis", f"expected an axis of the shape {list(shape)} whose length is 0 (the empty state)")
        out.append(StateSpec(r.str(d, "input", w), r.str(d, "output", w), r.dtype(d, w), shape, axis,
                             r.int(d, "max_length", w, minimum=1)))
    return tuple(out)


def parse_generate(r, raw: Any) -> Generate:
    """The `generate` block of a version-2 manifest."""
    g = r.obj(raw, "generate")
    token = r.obj(r.get(g, "token", "generate"), "generate.token")
    logits = r.obj(r.get(g, "logits", "generate"), "generate.logits")
    feeds = r.obj(r.get(g, "feeds", "generate"), "generate.feeds")
    for name, how in feeds.items():
        if how not in FEEDS:
            r.fail(f"generate.feeds.{name}", f"expected one of {', '.join(FEEDS)}, got {how!r}")
    shapes = {}
    for name, dims in r.obj(r.get(g, "shapes", "generate"), "generate.shapes").items():
        if not isinstance(dims, list) or not all(
                (isinstance(x, int) and not isinstance(x, bool) and x >= 0) or x in DIM_ROLES for x in dims):
            r.fail(f"generate.shapes.{name}", f"expected a list of sizes >= 0 or {', '.join(DIM_ROLES)}")
        shapes[name] = tuple(dims)
    prompt_len = r.int(g, "prompt_len", "generate", minimum=1)
    max_context = r.int(g, "max_context", "generate", minimum=prompt_len + 1)
    phases = {}
    for name, pin in r.obj(r.get(g, "phases", "generate"), "generate.phases").items():
        w = f"generate.phases.{name}"
        pin = r.obj(pin, w)
        if name not in ("prefill", "decode") or set(pin) != {"seq", "past"}:
            r.fail(w, "expected prefill or decode: {\"seq\": int, \"past\": int}")
        phases[name] = {"seq": r.int(pin, "seq", w, minimum=1), "past": r.int(pin, "past", w, minimum=0)}
        if phases[name]["seq"] + phases[name]["past"] > max_context:
            r.fail(w, f"seq + past is beyond max_context {max_context}")
    return Generate(prompt_len, max_context, r.int(g, "priced_past", "generate", minimum=0),
                    r.str(token, "input", "generate.token"), r.dtype(token, "generate.token"),
                    r.str(logits, "output", "generate.logits"), r.str(logits, "fragment", "generate.logits"),
                    dict(feeds), shapes, phases)


def check_generate(r, m: Manifest) -> None:
    """The generate block and the fragments' state agree with the rest of the manifest: the token input is a
    host input fed the token, every host input has a feed, the logits are an output of their fragment, each
    state pair is its fragment's input and output, neither a model input nor output, held by one fragment,
    at most max_context long."""
    g = m.generate
    inputs = {t.name for t in m.inputs}
    if g.token_input not in inputs or g.feeds.get(g.token_input) != "token":
        r.fail("generate.token.input", f"{g.token_input!r} is not a model input fed the token")
    for name in inputs:
        if name not in g.feeds:
            r.fail("generate.feeds", f"no feed for model input {name!r}")
    for name in g.feeds:
        if name not in inputs:
            r.fail("generate.feeds", f"{name!r} is not a model input")
    frag = m.fragments.get(g.logits_fragment)
    if frag is None or g.logits_output not in frag.outputs:
        r.fail("generate.logits", f"fragment {g.logits_fragment!r} does not give {g.logits_output!r}")
    if g.logits_output not in {o.name for o in m.outputs}:
        r.fail("generate.logits.output", f"{g.logits_output!r} is not a model output")
    seen: set[str] = set()
    for f in m.fragments.values():
        for i, s in enumerate(f.state):
            _check_state(r, m, f, s, f"fragment {f.id}.state[{i}]", seen)


def _check_state(r, m: Manifest, f: Fragment, s: StateSpec, where: str, seen: set[str]) -> None:
    if s.input not in f.inputs or s.output not in f.outputs:
        r.fail(where, f"{s.input!r} -> {s.output!r} must be an input and an output of the fragment")
    if s.input in {t.name for t in m.inputs} or s.output in {o.name for o in m.outputs}:
        r.fail(where, f"{s.input!r} -> {s.output!r}: state stays on its device, it is no model input or output")
    for name in (s.input, s.output):
        if name in seen:
            r.fail(where, f"{name!r} is the state of two fragments")
        seen.add(name)
    if s.max_length > m.generate.max_context:
        r.fail(f"{where}.max_length", f"{s.max_length} is beyond generate.max_context {m.generate.max_context}")
