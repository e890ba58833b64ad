"""The reference pages, generated from the code at `mkdocs build` (docs/gen/pages.py): the command line from
click's command tree, the YAML schemas from the pydantic models, the manifest from the runtime's parser
types and docstring, the protocol version from runtime/wire/protocol.py.  Nothing here is written by hand but
the one-line meaning of each schema field, and a field without one (or a meaning for a field that no longer
exists) stops the build."""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from typing import Any

import click
from pydantic import BaseModel

__all__ = ["cli_page", "schema_page", "manifest_page", "models_page", "protocol_version", "PAGES"]

WIDTH = 100


# ---------------------------------------------------------------------------------------------- the CLI


def _help(cmd: click.Command, path: list[str]) -> str:
    ctx = click.Context(cmd, info_name=" ".join(path), terminal_width=WIDTH, max_content_width=WIDTH)
    return cmd.get_help(ctx)


def _walk(group: click.Group, path: list[str]):
    for name in sorted(group.commands):
        cmd = group.commands[name]
        yield [*path, name], cmd
        if isinstance(cmd, click.Group):
            yield from _walk(cmd, [*path, name])


def cli_page() -> str:
    from edgec.compiler.cli import cli
    from edgec.runtime.front.cli import device_cli

    device = set(device_cli.commands)
    out = ["# Command line", "",
           "Generated from the click command tree of `edgec` (compiler/cli.py) and of the device-only",
           "distribution's `edgec` (runtime/front/cli.py `device_cli`): each section is the command's `--help`.", "",
           "| command | what it does | device distribution |", "|---|---|---|"]
    for path, cmd in _walk(cli, ["edgec"]):
        short = cmd.get_short_help_str(limit=90).replace("|", "\\|")
        out.append(f"| [`{' '.join(path)}`](#{'-'.join(path)}) | {short} | {'yes' if path[-1] in device else 'no'} |")
    missing = device - set(cli.commands)
    if missing:
        raise SystemExit(f"docs: device commands missing from the full CLI: {sorted(missing)}")
    out += ["", "Both distributions answer `edgec --version` (or `-V`).", "", "## edgec", "", "```text",
            _help(cli, ["edgec"]), "```"]
    for path, cmd in _walk(cli, ["edgec"]):
        out += ["", f"## {' '.join(path)} {{#{'-'.join(path)}}}", "", "```text", _help(cmd, path), "```"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- schemas


def _type(ann: Any) -> str:
    """A short human form of a pydantic field annotation."""
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        parts = [_type(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (list, tuple):
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping {_type(args[0])} → {_type(args[1])}"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return f"[{ann.__name__}](#{ann.__name__.lower()})"
    if isinstance(ann, type) and issubclass(ann, tuple) and hasattr(ann, "_fields"):
        return "[" + ", ".join(ann._fields) + "]"
    return {float: "number", int: "integer", str: "string", bool: "boolean"}.get(ann, getattr(ann, "__name__", str(ann)))


def _constraint(field) -> str:
    """The constraint descriptions pydantic carries on the field's annotated types."""
    seen = []

    def visit(ann):
        for meta in getattr(ann, "__metadata__", ()):
            d = getattr(meta, "description", None)
            if d and d not in seen:
                seen.append(d)
        for a in typing.get_args(ann):
            visit(a)

    if field.description and field.description not in seen:
        seen.append(field.description)
    visit(field.annotation)
    bounds = []
    for m in field.metadata:
        d = getattr(m, "description", None)
        if d and d not in seen:
            seen.append(d)
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            v = getattr(m, attr, None)
            if v is not None:
                bounds.append(f"{sign} {v:g}")
    if bounds and not seen:
        seen.append("a number " + ", ".join(bounds))
    return "; ".join(seen)


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """Root first, then every model it refers to, each once."""
    order: list[type[BaseModel]] = []

    def visit(ann):
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            if ann not in order:
                order.append(ann)
                for f in ann.model_fields.values():
                    visit(f.annotation)
            return
        for a in typing.get_args(ann):
            visit(a)
        for m in getattr(ann, "__metadata__", ()):
            pass

    visit(root)
    return order


def schema_page(title: str, intro: str, root: type[BaseModel], meanings: dict[str, str], example: str) -> str:
    out = [f"# {title}", "", intro, "", "```yaml", example.strip(), "```", "",
           "Generated from the pydantic models that parse the file (strict types; an unknown key is an error). "
           "A required key has no default.", ""]
    used = set()
    for model in _models(root):
        out += [f"## {model.__name__}", ""]
        doc = inspect.getdoc(model)
        if doc and model.__doc__ is not BaseModel.__doc__ and not doc.startswith("!!! abstract"):
            out += [" ".join(doc.split()), ""]
        out += ["| key | type | required / default | meaning | constraint |", "|---|---|---|---|---|"]
        for name, f in model.model_fields.items():
            key = f"{model.__name__}.{name}"
            if key not in meanings:
                raise SystemExit(f"docs: {root.__name__}: field {key} has no meaning in docs/gen/meanings.py")
            used.add(key)
            default = "required" if f.is_required() else f"`{json.dumps(f.get_default(call_default_factory=True), default=str)}`"
            out.append(f"| `{name}` | {_type(f.annotation)} | {default} | {meanings[key]} | {_constraint(f)} |")
        out.append("")
    stale = sorted(k for k in meanings if k.split(".")[0] in {m.__name__ for m in _models(root)} and k not in used)
    if stale:
        raise SystemExit(f"docs: meanings for fields that no longer exist: {stale}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- the manifest


def manifest_page() -> str:
    from edgec.runtime import MANIFEST_FORMAT, MANIFEST_VERSION
    from edgec.runtime.manifest import load, types
    from edgec.runtime.manifest.types import GENERATE_VERSION

    out = ["# Manifest", "",
           f"The manifest (`manifest.json`, format `{MANIFEST_FORMAT}`, version {MANIFEST_VERSION}; version "
           f"{GENERATE_VERSION} for a generative build) is the contract "
           "between compiler and runtime. The runtime owns its schema and validates a manifest before running "
           "anything; a manifest over 64 MiB or nested more than 64 levels is refused unread. This page is "
           "generated from the runtime: the schema as runtime/manifest/load.py documents it, then the parser's types "
           "(runtime/manifest/types.py).", "", "## Keys", "", "```text", inspect.getdoc(load).split("\n", 2)[2].strip(),
           "```", "", "## Parser types", "",
           "What the runtime parses a manifest into (Python dataclasses; JSON keys map to these fields).", ""]
    for name in types.__all__:
        obj = getattr(types, name)
        if not (inspect.isclass(obj) and dataclasses.is_dataclass(obj)):
            continue
        out += [f"### {name}", ""]
        doc = inspect.getdoc(obj)
        if doc and not doc.startswith(f"{name}("):
            out += [" ".join(doc.split()), ""]
        hints = typing.get_type_hints(obj)
        out += ["| field | type | default |", "|---|---|---|"]
        for f in dataclasses.fields(obj):
            if f.default is not dataclasses.MISSING:
                default = f"`{f.default!r}`"
            elif f.default_factory is not dataclasses.MISSING:
                default = f"`{f.default_factory()!r}`"
            else:
                default = "required"
            t = str(hints.get(f.name, f.type)).replace("typing.", "").replace("edgec.runtime.manifest.types.", "")
            t = t.replace("|", "\\|").replace("<class '", "").replace("'>", "")
            out.append(f"| `{f.name}` | `{t}` | {default} |")
        out.append("")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- models, protocol


def models_page() -> str:
    from edgec import models

    out = ["# Model zoo", "",
           "`python -m edgec.models build [-o DIR] [--only NAME,...] [--force]` builds these models into "
           "`./models/build/` of the working directory (or `$EDGEC_MODELS_DIR`), deterministically: the same bytes "
           "on every run; nothing is downloaded. `python -m edgec.models list` names them. Generated from "
           "`edgec.models`.", "", "| name | what it is |", "|---|---|"]
    for name, spec in models.SPECS.items() if hasattr(models, "SPECS") else _model_rows(models):
        out.append(f"| `{name}` | {spec} |")
    out += ["", "Built only when named (`--only NAME`, or `edgec.models.ensure(NAME)`): int8 versions of three of "
            "them, made with onnxruntime.quantization from the float model (QDQ and QOperator calibrated on seeded "
            "example inputs, and dynamic; see [int8 models](../how-to/int8.md)).", "", "| name | what it is |",
            "|---|---|"]
    out += [f"| `{name}` | {models.DESCRIPTIONS[name]} |" for name in models.ON_REQUEST_NAMES]
    return "\n".join(out) + "\n"


def _model_rows(models) -> list[tuple[str, str]]:
    import contextlib
    import io

    from edgec.models.__main__ import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        main(["list"])
    rows = []
    for line in buf.getvalue().splitlines():
        name, _, what = line.partition(" ")
        if name:
            rows.append((name, what.strip().replace("|", "\\|")))
    return rows


def protocol_version() -> int:
    from edgec.runtime.wire.protocol import PROTOCOL_VERSION

    return PROTOCOL_VERSION


PAGES = ("cli", "cluster", "services", "profile", "manifest", "models")
