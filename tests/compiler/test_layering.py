"""The import graph runs one way: the cost model below the planners, the planners below the emitter, and
the runtime on its own. Read from the source with `ast` (every import, deferred ones included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"compiler": "edgec.compiler", "runtime": "edgec.runtime"}


def _module(path: Path) -> tuple[str, bool]:
    """(dotted name, is a package's __init__) of a source file under ROOT."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, absolute: `from .x import y` counts as x and x.y."""
    name, package = _module(path)
    here = name.split(".") if package else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def _modules(folder: str) -> dict[str, set[str]]:
    return {_module(p)[0]: _imports(p) for p in sorted((ROOT / folder).rglob("*.py")) if "dist" not in p.parts}


def _violations(importers: str, forbidden: str) -> list[str]:
    graph = {**_modules("compiler"), **_modules("runtime")}
    return sorted(f"{m} imports {i}" for m, imps in graph.items() if m == importers or m.startswith(importers + ".")
                  for i in imps if i == forbidden or i.startswith(forbidden + "."))


def test_the_walk_sees_the_packages():
    graph = _modules("compiler")
    assert {"edgec.compiler.cost", "edgec.compiler.cost.evaluate", "edgec.compiler.plan.registry"} <= graph.keys()
    assert "edgec.compiler.plan.spatial" in graph["edgec.compiler.plan.registry"]  # relative imports resolve
    assert "edgec.compiler.cost" in graph["edgec.compiler.plan.spatial"]


def test_cost_model_imports_no_planner():
    assert _violations("edgec.compiler.cost", "edgec.compiler.plan") == []


def test_planners_import_no_emitter():
    assert _violations("edgec.compiler.plan", "edgec.compiler.emit") == []


def test_spatial_builds_no_onnx():
    """spatial/ is row-range algebra; the tiles' ONNX models are emit/'s."""
    assert "onnx" in _modules("compiler")["edgec.compiler.emit.tiles"]  # the rule below can be broken
    assert _violations("edgec.compiler.spatial", "onnx") == []


@pytest.mark.parametrize("below", ["edgec.compiler.plan", "edgec.compiler.cost", "edgec.compiler.spatial"])
def test_nothing_below_the_emitter_imports_it(below):
    graph = _modules("compiler")
    assert any(m.startswith(below + ".") for m in graph) and "edgec.compiler.emit.fragments" in graph
    assert _violations(below, "edgec.compiler.emit") == []


def test_runtime_imports_nothing_of_the_compiler():
    assert _violations("edgec.runtime", "edgec.compiler") == []


@pytest.mark.parametrize("dependency", ["ortools", "networkx", "onnx_graphsurgeon"])
def test_runtime_imports_no_compiler_dependency(dependency):
    assert _violations("edgec.runtime", dependency) == []


def test_only_the_allocator_solves_with_ortools():
    assert _violations("edgec.compiler", "ortools") == ["edgec.compiler.allocate.solve imports ortools.sat.python",
                                                        "edgec.compiler.allocate.solve imports ortools.sat.python.cp_model"]


@pytest.mark.parametrize("below", ["edgec.compiler.plan", "edgec.compiler.cost", "edgec.compiler.emit",
                                   "edgec.compiler.driver", "edgec.compiler.cluster"])
def test_nothing_below_the_allocator_imports_it(below):
    assert _violations(below, "edgec.compiler.allocate") == []
