"""What a generative build costs beyond one pass: the prefill phase's cost table, each layer's cache at the
maximum context (memory it holds), and the token id the last stage sends back to the first every step.

The cost table of a generative build prices a decode step (ingest/phases.py pins it); `CostTable.generate`
carries this, and `evaluate` turns a step's prediction into per-token figures (evaluate.py `_per_token`).
Memory: a stage holds, for each state pair of its layers, the past input at max_context - 1 and the present
output at max_context (the last step reads one while it writes the other), on top of its weights and
activations.
Hand-offs (`StepIO`): a step's caches never travel to or from the coordinator (the emitter drops those host
steps, emit/state.py), and of the logits only the chosen token id leaves the last stage (runtime/device/steps.py
send_token), so the per-request costs of a step (cpu_bounds.py request_costs, network.py request_in_ms /
request_out_ms) count the other model inputs in and TOKEN_BYTES out, both for a decode step and for the prefill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from ..graph import LayerGraph
from .network import NetworkModel
from .table import CostTable

__all__ = ["TOKEN_BYTES", "StepIO", "GenerateCost", "GenerativeCostTable", "generate_cost", "generative_table"]

TOKEN_BYTES = 8  # the token id (int64) the last stage sends to the first stage every step


@dataclass(frozen=True)
class StepIO:
    """What a generative step exchanges with the coordinator: every model input but the caches in, and the
    token id chosen from `logits` out; the caches (`state`, inputs and outputs) stay on their stage."""

    state: frozenset[str]
    logits: str | None

    def inputs(self, graph: LayerGraph, names) -> dict[str, int]:
        """{name: bytes} of the model inputs among `names` that the coordinator sends."""
        return {t: graph.tensors[t].nbytes for t in names if t in graph.inputs and t not in self.state}

    def outputs(self, graph: LayerGraph, names) -> dict[str, int]:
        """{name: bytes} of the model outputs among `names` that go to the coordinator: the logits as the token id."""
        return {t: TOKEN_BYTES if t == self.logits else graph.tensors[t].nbytes
                for t in names if t in graph.outputs and t not in self.state}


@dataclass(frozen=True, eq=False)
class GenerateCost:
    prefill_graph: LayerGraph  # the model pinned for the prompt (seq = prompt_len, past = 0)
    prefill: CostTable  # its layers priced on the same cluster
    state_bytes: np.ndarray  # [L]: the cache bytes at max_context a layer's stage holds (0 for most layers)
    prompt_len: int
    max_context: int
    priced_past: int  # the past a decode step is priced at (ingest/phases.py)
    io: StepIO  # what a step (decode or prefill) hands to and takes from the coordinator

    def stage_state_bytes(self, lo: int, hi: int) -> int:
        return int(self.state_bytes[lo:hi].sum())

    def token_ms(self, cost: CostTable, src: str, dst: str) -> float:
        """The token id's transfer from the last stage's device to the first's (none on one device)."""
        return 0.0 if src == dst else float(cost.transfer_ms(TOKEN_BYTES, src, dst))


@dataclass(frozen=True, eq=False)
class GenerativeCostTable(CostTable):
    """A generative build's cost table: a decode step's, with `generate` beside it (a subclass, so that code
    that copies a CostTable field by field, such as allocate's restrict, copies an ordinary table)."""

    generate: GenerateCost | None = field(default=None, repr=False)
    io: StepIO | None = field(default=None, repr=False)  # None: every model input and output is a hand-off

    def _network(self, lone: bool) -> NetworkModel:
        """The cluster's links, with a step's hand-offs (`StepIO`) as the bytes of a request in and out."""
        if self.io is None or self.source is None:
            return super()._network(lone)
        graph = self.source[0]
        return NetworkModel(self.cluster, (sum(self.io.inputs(graph, graph.inputs).values()),
                                           sum(self.io.outputs(graph, graph.outputs).values())), lone)


def _with(cost: CostTable, **extra) -> GenerativeCostTable:
    return GenerativeCostTable(**{f.name: getattr(cost, f.name) for f in fields(CostTable)}, **extra)


def generative_table(cost: CostTable, generate: GenerateCost) -> GenerativeCostTable:
    return _with(cost, generate=generate, io=generate.io)


def generate_cost(phases, cost: CostTable, prefill: CostTable) -> GenerateCost:
    """The generative costs of `phases` (ingest/phases.py Phases) for the decode step's table `cost`."""
    graph = phases.decode.graph
    state = np.zeros(len(graph.layers), dtype=np.int64)
    m = phases.options.max_context
    for pair, (lo, _) in zip(phases.pairs, graph.unsplit):
        itemsize = np.dtype(pair.dtype).itemsize
        past = math.prod(phases.roles.pin(pair.dims, 1, m - 1))
        present = math.prod(phases.roles.pin(pair.dims, 1, m))  # the input's shape with m past is the output's
        state[lo] += (past + present) * itemsize
    outs = {p.output for p in phases.pairs}
    logits = [t for t in graph.outputs if t not in outs]  # one; if not, emit/state.py refuses the build
    io = StepIO(frozenset(p.input for p in phases.pairs) | outs, logits[0] if len(logits) == 1 else None)
    return GenerateCost(phases.prefill.graph, _with(prefill, io=io), state, phases.options.prompt_len, m,
                        phases.priced_past, io)
