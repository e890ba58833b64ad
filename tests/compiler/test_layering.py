"""The import graph runs one way: a declared order of layers for compiler/ and runtime/, bottom to top, no
cycle anywhere, the cost model below the planners, the planners below the emitter, and the runtime on its
own. Read from the source with `ast`: every import, those inside functions and under TYPE_CHECKING
included (a cycle hidden in a function is still a cycle)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"compiler": "edgec.compiler", "runtime": "edgec.runtime"}

# Bottom to top: a module may import a module of a lower layer, or of its own unit (a package, or the
# module itself); never one of a higher layer or of another unit of its own layer.
COMPILER_LAYERS = [
    ["", "errors", "units", "progress", "text", "names"],  # "": the edgec.compiler package itself
    ["graph"],
    ["plan_types"],
    ["spatial"],
    ["quant"],
    ["layers"],
    ["ingest"],
    ["cluster"],
    ["cost"],
    ["plan"],
    ["emit"],
    ["profile", "allocate", "report", "plot"],  # the libraries beside the driver
    ["driver"],
    ["api"],
    ["cli"],
    ["__main__"],
    ["_root"],  # the `edgec` package: edgec.compile and edgec.run
]
# The runtime in rooms (packages by concern, each __init__ saying what it holds and may import) over a base of
# small modules at the top of runtime/.
RUNTIME_LAYERS = [
    ["", "errors", "interrupts", "linkmodel", "machine", "providers"],  # "": the edgec.runtime package (format constants)
    ["files", "command"],  # the base's helpers: files written all or nothing; what the commands share
    ["manifest"],  # the contract: types, parsing, schedule checks, signatures, the planner's replay
    ["wire"],  # addresses, keys, codecs, framing, the protocol's messages
    ["device"],  # the worker daemon, its sessions, onnxruntime, the fragment cache
    ["coordinator"],  # the worker pool, failover, adaptation, emulation, the run's report and trace
    ["profile"],  # `edgec profile`'s measuring: the device alone, or through the coordinator's pool
    ["generate"],  # a generative build's sequences: the pool of steps, the decode loop, its verification
    ["serve"],  # the long-lived session and the network front over it
    ["front"],  # the commands and edgec.run
    ["__main__"],
]
LAYERS = {FOLDERS["compiler"]: COMPILER_LAYERS, FOLDERS["runtime"]: RUNTIME_LAYERS}


def _module(path: Path) -> tuple[str, bool]:
    """(dotted name, is a package's __init__) of a source file under ROOT."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _sources() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if "dist" not in p.parts]


_KNOWN = {_module(p)[0] for p in _sources()}


def _imports(path: Path) -> set[str]:
    return _imports_of(path.read_text(), *_module(path), str(path))


def _imports_of(source: str, name: str, package: bool, where: str = "<probe>") -> set[str]:
    """Every module the source of module `name` imports, absolute: `from .x import y` counts as x.y when
    x.y is a module of ours (a submodule imported by name), else as x."""
    here = name.split(".") if package else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names}
            out.update(subs)
            if not subs <= _KNOWN:
                out.add(mod)
    return out


def _modules(folder: str) -> dict[str, set[str]]:
    return dict(_parsed_modules(folder))  # a copy: a test may not change what the next one reads


@functools.lru_cache(maxsize=None)
def _parsed_modules(folder: str) -> dict[str, frozenset[str]]:
    """Parsed once per session: the sources do not change while the tests run."""
    return {_module(p)[0]: frozenset(_imports(p)) for p in _sources() if p.relative_to(ROOT).parts[0] == folder}


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (itself left out)."""
    graph = {**_modules("compiler"), **_modules("runtime")}
    return {m: {i for i in imps if i in graph and i != m} for m, imps in graph.items()}


def _unit(module: str) -> tuple[str, str]:
    """(edgec.compiler or edgec.runtime, the first name below it: its unit in the layers; "" for the root)."""
    top = next(t for t in LAYERS if module == t or module.startswith(t + "."))
    rest = module[len(top) + 1:]
    return top, rest.split(".")[0]


def _layer(module: str) -> int:
    """Its layer's index; -1 for a unit no layer lists (test_every_unit_has_a_layer names it)."""
    top, unit = _unit(module)
    return next((i for i, layer in enumerate(LAYERS[top]) if unit in layer), -1)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_unit_has_a_layer():
    missing = sorted({".".join(_unit(m)) for m in _graph()
                      if not any(_unit(m)[1] in layer for layer in LAYERS[_unit(m)[0]])})
    assert missing == []


def test_imports_run_down_the_layers():
    graph = _graph()
    assert graph["edgec.compiler.driver"] and graph["edgec.runtime.front.cli"]  # the walk sees imports
    bad = sorted(f"{m} imports {i}" for m, imps in graph.items() for i in imps
                 if _unit(m)[0] == _unit(i)[0] and _unit(m) != _unit(i) and _layer(i) >= _layer(m) >= 0)
    assert bad == []


def test_the_walk_sees_imports_inside_functions_and_under_type_checking():
    code = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..driver import x\n"
            "def f():\n    from ..cli import y\n")
    assert {"edgec.compiler.driver", "edgec.compiler.cli"} <= _imports_of(code, "edgec.compiler.cost.probe", False)


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("library", ["edgec.compiler.allocate", "edgec.compiler.report", "edgec.compiler.plan",
                                     "edgec.compiler.profile"])
@pytest.mark.parametrize("front", ["edgec.compiler.driver", "edgec.compiler.cli", "edgec.compiler.api"])
def test_libraries_never_import_the_driver_or_the_cli(library, front):
    assert _violations(library, front) == []


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


@pytest.mark.parametrize("dependency", ["ortools", "networkx", "onnx_graphsurgeon", "pydantic"])
def test_runtime_imports_no_compiler_dependency(dependency):
    assert _violations("edgec.runtime", dependency) == []


def test_only_the_allocator_solves_with_ortools():
    assert _violations("edgec.compiler", "ortools") == ["edgec.compiler.allocate.solve imports ortools.sat.python",
                                                        "edgec.compiler.allocate.solve imports ortools.sat.python.cp_model"]


@pytest.mark.parametrize("below", ["edgec.compiler.plan", "edgec.compiler.cost", "edgec.compiler.emit",
                                   "edgec.compiler.driver", "edgec.compiler.cluster"])
def test_nothing_below_the_allocator_imports_it(below):
    assert _violations(below, "edgec.compiler.allocate") == []


def _rooms() -> list[Path]:
    return sorted(p for p in (ROOT / "runtime").rglob("__init__.py") if p.parent != ROOT / "runtime"
                  and "dist" not in p.relative_to(ROOT).parts)


def test_every_runtime_room_says_what_it_holds_and_may_import():
    rooms = _rooms()
    assert {p.parent.name for p in rooms} >= {"manifest", "wire", "device", "coordinator", "serve", "front"}
    for init in rooms:
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc, f"{init.relative_to(ROOT)}: its docstring does not say what it may import"


def test_runtime_rooms_reexport_nothing():
    """A room's __init__ is its docstring: importers name the module that defines what they import, so a
    room imports none of its modules merely by being imported."""
    for init in _rooms():
        assert _imports(init) == set(), f"{init.relative_to(ROOT)} imports {sorted(_imports(init))}"
