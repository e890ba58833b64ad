"""Reading cluster and profile YAML safely: size and depth limits, duplicate keys, one-line UserErrors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from edgec.compiler.errors import UserError
from edgec.compiler.units import MiB

from .quote import show

__all__ = ["MAX_BYTES", "MAX_DEPTH", "read_yaml"]

# Real files are a few KiB (profiles with measured tables: a few hundred KiB); anything far larger is a
# wrong file, not a cluster, and is refused before it is read whole.
MAX_BYTES = {"cluster file": 1 * MiB, "profile file": 16 * MiB}
MAX_DEPTH = 32  # real files nest at most 5 levels; PyYAML's composer recurses once per level


class _TooDeep(yaml.YAMLError):
    def __init__(self, mark: yaml.Mark):
        super().__init__(f"nested more than {MAX_DEPTH} levels deep")
        self.problem, self.problem_mark = str(self), mark


class _SafeLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, plus: a key repeated in one mapping is an error (PyYAML would keep the
    last value silently); nesting deeper than MAX_DEPTH is an error (the composer recurses per level, so
    a deep file would otherwise end in RecursionError); a scalar that its tag cannot convert (2001-99-99,
    !!int x) is a YAML error with its position, not a ValueError."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: _SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *x` merges (and may be overridden) by design
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
        except TypeError:
            continue
        if dup:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {show(key)}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


def _checked_scalar(construct):
    def wrapped(loader: _SafeLoader, node: yaml.Node):
        try:
            return construct(loader, node)
        except (ValueError, TypeError, OverflowError) as e:
            raise yaml.constructor.ConstructorError(
                None, None, f"invalid {node.tag.rsplit(':', 1)[-1]} {show(node.value)}: {e}", node.start_mark
            ) from None

    return wrapped


_SafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
for _tag in ("null", "bool", "int", "float", "binary", "timestamp"):
    _SafeLoader.add_constructor(f"tag:yaml.org,2002:{_tag}",
                                _checked_scalar(yaml.SafeLoader.yaml_constructors[f"tag:yaml.org,2002:{_tag}"]))


def _read_text(path: Path, what: str) -> str:
    """The file's text, refusing (before reading it whole) a file larger than the limit for its kind."""
    shown, limit = str(path), MAX_BYTES[what]
    try:
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
        if len(raw) > limit:
            raise UserError(f"{what} is larger than {limit // MiB} MiB, the limit for a {what}", path=shown)
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} not found", path=shown) from None
    except IsADirectoryError:
        raise UserError(f"{what} is a directory, not a file", path=shown) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {what}: {e}", path=shown) from None


def read_yaml(path: Path, what: str) -> Any:
    """The parsed document of a "cluster file" or "profile file" (`what`); any problem is a UserError
    naming the file."""
    shown = str(path)
    text = _read_text(path, what)
    try:
        return yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - a SafeLoader subclass
    except _TooDeep as e:
        m = e.problem_mark
        raise UserError(f"YAML nested more than {MAX_DEPTH} levels deep (line {m.line + 1}, column {m.column + 1})",
                        path=shown) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise UserError(f"YAML syntax error: {where}{problem}", path=shown) from None
    except RecursionError:  # the depth limit keeps PyYAML's recursion shallow; this guards what it cannot see
        raise UserError("YAML structure too deeply nested or recursive", path=shown) from None
