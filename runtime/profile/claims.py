"""Which of a model's nodes the CPU provider runs in a session whose providers put an accelerator first
(`edgec profile --providers ... --model`, and the compiler where its onnxruntime has the device's providers).

onnxruntime's profiler says it: each kernel run is an event with `args.provider` and `args.op_name`; a node
the CPU provider runs is an event of its own, named after the node, and an accelerator's fused subgraph is one
event (OpenVINO: `OpenVINO-EP-subgraph_1`) for all the nodes it took. So the CPU provider's events name the
nodes it runs, and every other node of the graph is the accelerator's (or folded away: it runs nowhere).

The session runs at ORT_ENABLE_BASIC. onnxruntime assigns nodes to providers after the basic optimisations
and before the extended ones, which rewrite only the CPU provider's share (Conv+Relu into a FusedConv named
after the Relu's output, NCHWc nodes named `<tensor>_nchwc`): at basic the claims are the same as at the
default level, and a CPU node keeps its own name. Names are mapped back to the original graph's node keys as
nodes.py maps them, through the basic-optimised graph of a CPU-only session (a session with an accelerator's
compiled subgraphs cannot save its graph; nodes.py `node_map`). Nodes onnxruntime creates without a name (the parts of an
expanded function op such as Mish: Softplus, Tanh, Mul) are named `<op type>_<index>` in the profile, an
index the saved graph does not carry: such an event claims every unnamed node of its op type for the CPU.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from edgec.runtime.errors import InputError, one_line
from edgec.runtime.providers import CPU, Provider, missing_provider, ort_providers

from .nodes import NodeMap, _feeds, basic_graph, kernel_events, node_keys, node_map

__all__ = ["cpu_nodes_of", "cpu_nodes"]


def cpu_nodes_of(events: Iterable[dict], nodes: NodeMap) -> frozenset[str]:
    """The original node keys the CPU provider ran in a profiler trace (events of one or more runs)."""
    out: set[str] = set()
    for e in kernel_events(events):
        if e.provider == CPU:
            out |= nodes.keys_of(e)
    return frozenset(out)


def _named(model: onnx.ModelProto, keys: Sequence[str]) -> onnx.ModelProto:
    """`model` with its nodes named by their keys (onnxruntime refuses repeated names; unnamed ones get theirs)."""
    if list(keys) == [n.name for n in model.graph.node]:
        return model
    named = onnx.ModelProto.FromString(model.SerializeToString())
    for k, n in zip(keys, named.graph.node):
        n.name = k
    return named


def cpu_nodes(model: onnx.ModelProto, providers: Sequence[Provider], feeds: dict[str, np.ndarray] | None = None,
              where: str = "model") -> frozenset[str]:
    """The node keys (nodes.node_keys) of `model` that the CPU provider runs in a session on `providers` (in
    order; onnxruntime adds the CPU's behind them): a session at ORT_ENABLE_BASIC with the profiler on, run once
    on `feeds` (None: random inputs, as nodes.py makes them). InputError (one line naming `where`) when
    onnxruntime cannot load or run it.

    >>> cpu_nodes(onnx.load("tinychain.onnx"), [Provider("CPUExecutionProvider")])  # doctest: +SKIP
    frozenset({'Relu_0', 'Relu_1', ...})
    """
    missing = missing_provider(providers, ort.get_available_providers())
    if missing is not None:  # onnxruntime would only warn, and run it all on the CPU
        raise InputError(f"{where}: this onnxruntime does not have {missing} (it has "
                         f"{', '.join(ort.get_available_providers())})")
    keys = node_keys(model)
    data = _named(model, keys).SerializeToString()
    with tempfile.TemporaryDirectory(prefix="edgec-claims-") as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        try:
            nodes = node_map(model, keys, basic_graph(data, tmp))
            sess = ort.InferenceSession(data, so, providers=ort_providers(providers))
            sess.run(None, _feeds(sess, Path(where)) if feeds is None else feeds)
            events = json.loads(Path(sess.end_profiling()).read_text())
        except InputError:
            raise
        except Exception as e:  # onnxruntime's pybind errors: no common base
            raise InputError(f"{where}: onnxruntime cannot run the model on "
                             f"{', '.join(p.name for p in providers)}: {one_line(e, 200)}") from None
    return cpu_nodes_of(events, nodes)
