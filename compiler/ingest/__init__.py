"""Ingest: load an ONNX file, normalise it, pin and infer static shapes, and build its LayerGraph.

One module per step, in the order load_model runs them: checks (read the file, refuse what cannot run),
normalise (fold constants, drop Identities, name nodes), shapes (pin and infer static shapes); protos holds
the helpers they share. With emit/, the only code that handles ONNX protobufs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from edgec.runtime.manifest.load import file_sha256  # the runtime owns the hashes it checks

from ..errors import UserError
from ..graph import LayerGraph
from ..layers import build_layer_graph
from .checks import read_model
from .normalise import normalise
from .protos import node_keys, skeleton
from .shapes import infer_shapes, pin_shapes

__all__ = ["Ingested", "load_model", "parse_shape_option", "file_sha256", "skeleton", "node_keys"]

@dataclass(frozen=True, eq=False)
class Ingested:
    """The normalised model (static shapes, unique node names) and its layer graph."""

    path: Path
    sha256: str
    model: onnx.ModelProto
    graph: LayerGraph


def parse_shape_option(items: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """`NAME=D0,D1,...` strings -> {name: dims}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        try:
            parsed = tuple(int(d) for d in dims.split(","))
        except ValueError:
            parsed = ()
        if not sep or not name or not parsed or any(d <= 0 for d in parsed):
            raise UserError(f"--shape {item!r}: expected NAME=D0,D1,... with positive integers")
        shapes[name] = parsed
    return shapes


def load_model(path: str | Path, shapes: dict[str, tuple[int, ...]] | None = None) -> Ingested:
    """Load, check, normalise and shape an ONNX model; build its layer graph."""
    path = Path(path)
    model = read_model(path)
    model = normalise(model, path)
    model = pin_shapes(model, shapes or {}, path)
    model = infer_shapes(model, path)
    graph = build_layer_graph(model)
    if not graph.layers:
        raise UserError("the model has no operators to run", str(path))
    return Ingested(path=path, sha256=file_sha256(path), model=model, graph=graph)
