"""GeneratePool: the worker pool of a generative build, whose requests are steps of sequences. Each sequence is
opened on every worker (`begin`, with how its tokens are chosen) before its first step, every step's `run` names
its sequence, and `drop` frees it once its last step is done everywhere (wire/protocol.py). A step's result is
the token id the device that gives the logits chose (TOKEN_TENSOR), with the logits only when asked (--verify);
the outputs' shapes are those of the step."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..coordinator.pool import WorkerPool
from ..device.choose import Sampler
from ..manifest.types import Manifest, OutputSpec
from ..wire.protocol import TOKEN_TENSOR
from .feeds import step_shape

__all__ = ["GeneratePool", "StepInputs"]


class StepInputs(dict):
    """A step's model inputs, with the sequence it belongs to and its place in it."""

    def __init__(self, inputs: Mapping[str, np.ndarray], seq: int, new: int, past: int):
        super().__init__(inputs)
        self.seq, self.new, self.past = seq, new, past


class GeneratePool(WorkerPool):
    """A WorkerPool for a manifest with a `generate` block; stream() takes StepInputs and gives each step's
    TOKEN_TENSOR (and its logits with `logits`)."""

    def __init__(self, manifest: Manifest, *, sampler: Sampler, logits: bool = False, **kwargs):
        super().__init__(manifest, **kwargs)
        g = manifest.generate
        self.gen, self.sampler, self.logits = g, sampler, logits
        device = self.collects[g.logits_output]
        if not logits:
            del self.collects[g.logits_output]
        self.collects[TOKEN_TENSOR] = device
        self.specs[TOKEN_TENSOR] = OutputSpec(TOKEN_TENSOR, (1,), "int64", device)
        self.shapes: dict[int, tuple[int, int]] = {}  # open request -> (new tokens, past) of its step
        # The largest output a step can give: every step-varying dimension at the whole context.
        self.max_output_bytes = max(
            math.prod(step_shape(g.shapes.get(o.name, o.shape), g.max_context, 0)) * np.dtype(o.dtype).itemsize
            for o in manifest.outputs)

    def begin(self, seq: int, drawn: int = 0) -> None:
        """Open sequence `seq` on every worker, its state empty, its next token its token number `drawn`."""
        msg = {"t": "begin", "seq": seq, "temperature": self.sampler.temperature, "seed": self.sampler.seed,
               "logits": self.logits, "drawn": drawn}
        for w in self.workers.values():
            self._send(w, msg)

    def drop(self, seq: int) -> None:
        """Free sequence `seq` on every worker (its last step is done on all of them)."""
        for w in self.workers.values():
            self._send(w, {"t": "drop", "seq": seq})

    def _run_fields(self, req: int, inputs: Mapping[str, np.ndarray]) -> dict:
        if not isinstance(inputs, StepInputs):
            raise TypeError("a generative pool runs StepInputs")
        for done in [r for r in self.shapes if r not in self.open]:
            del self.shapes[done]
        self.shapes[req] = (inputs.new, inputs.past)
        return {"seq": inputs.seq}

    def _output_shape(self, name: str, req: int) -> tuple[int, ...]:
        dims = self.gen.shapes.get(name)
        if dims is None or req not in self.shapes:
            return super()._output_shape(name, req)
        return step_shape(dims, *self.shapes[req])
