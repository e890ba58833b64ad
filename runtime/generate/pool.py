"""GeneratePool: the worker pool of a generative build, whose requests are steps of sequences. Each sequence is
opened on every worker (`begin`, with how its tokens are chosen) before its first step, every step's `run` names
its sequence, and `drop` frees it once its last step is done everywhere (wire/protocol.py). A step's result is
the token id the device that gives the logits chose (TOKEN_TENSOR), with the logits only when asked (--verify);
the outputs' shapes are those of the step.

The token's direct path: a step's `run` names the request of its sequence's next step (next_req), and the
device that chooses the token sends it there itself, to every device that takes it as a model input
(device/sequences.py token_routes), besides sending it here. That next step's `run` says its token comes from
that device (token_from), and the pool sends it the step's positions and attention mask but not the token. So a
sequence's next step is issued before its token is known, and the token takes one hop, last stage -> first stage,
as the plan prices it (compiler/cost/generate.py)."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..coordinator.pool import WorkerPool
from ..device.choose import Sampler
from ..device.sequences import MAX_SEQUENCES, token_device, token_routes
from ..device.session import MAX_INFLIGHT
from ..manifest.types import Manifest, OutputSpec
from ..wire.net import outward_host
from ..wire.protocol import TOKEN_TENSOR
from .feeds import step_shape

__all__ = ["GeneratePool", "StepInputs", "OPEN_PER_SEQUENCE"]

OPEN_PER_SEQUENCE = 2  # steps of one sequence in flight at once: the one running, the next already issued
assert OPEN_PER_SEQUENCE * MAX_SEQUENCES <= MAX_INFLIGHT


class StepInputs(dict):
    """A step's model inputs, with the sequence it belongs to and its place in it: `new` tokens after `past`;
    `ahead`, how many requests after this one its sequence's next step is (None on its last step); `direct`,
    whether its token comes from the device that chose it (then the inputs hold no token)."""

    def __init__(self, inputs: Mapping[str, np.ndarray], seq: int, new: int, past: int, ahead: int | None = None,
                 direct: bool = False):
        super().__init__(inputs)
        self.seq, self.new, self.past, self.ahead, self.direct = seq, new, past, ahead, direct


class GeneratePool(WorkerPool):
    """A WorkerPool for a manifest with a `generate` block, for `sequences` sequences in flight; stream() takes
    StepInputs and gives each step's TOKEN_TENSOR (and its logits with `logits`). Its window holds
    OPEN_PER_SEQUENCE steps per sequence."""

    def __init__(self, manifest: Manifest, *, sampler: Sampler, sequences: int, logits: bool = False, **kwargs):
        if not 1 <= sequences <= MAX_SEQUENCES:
            raise ValueError(f"sequences {sequences}: expected 1 to {MAX_SEQUENCES}")
        super().__init__(manifest, inflight=OPEN_PER_SEQUENCE * sequences, **kwargs)
        g = manifest.generate
        self.gen, self.sampler, self.logits = g, sampler, logits
        device = self.collects[g.logits_output]
        if not logits:
            del self.collects[g.logits_output]
        self.collects[TOKEN_TENSOR] = device
        self.specs[TOKEN_TENSOR] = OutputSpec(TOKEN_TENSOR, (1,), "int64", device)
        self.token_device = token_device(manifest)
        self.token_routes = token_routes(manifest)
        token_feeds = {(r.device, r.input) for r in self.token_routes}
        self.direct_feeds = [f for f in self.feeds if f not in token_feeds]  # a step whose token comes direct
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

    def _host_feeds(self, inputs: Mapping[str, np.ndarray]) -> list[tuple[str, str]]:
        return self.direct_feeds if getattr(inputs, "direct", False) else self.feeds

    def _run_fields(self, req: int, inputs: Mapping[str, np.ndarray]) -> dict:
        if not isinstance(inputs, StepInputs):
            raise TypeError("a generative pool runs StepInputs")
        for done in [r for r in self.shapes if r not in self.open]:
            del self.shapes[done]
        self.shapes[req] = (inputs.new, inputs.past)
        fields = {"seq": inputs.seq}
        if inputs.ahead is not None:
            if not 0 < inputs.ahead < self.inflight:  # the receiver keeps tensors only inside its window
                raise ValueError(f"a sequence's next step {inputs.ahead} requests ahead, outside the window of "
                                 f"{self.inflight}")
            fields["next_req"] = req + inputs.ahead
        if inputs.direct:
            fields["token_from"] = self.token_device
        return fields

    def _output_shape(self, name: str, req: int) -> tuple[int, ...]:
        dims = self.gen.shapes.get(name)
        if dims is None or req not in self.shapes:
            return super()._output_shape(name, req)
        return step_shape(dims, *self.shapes[req])

    def _local_data_host(self, name: str) -> str | None:
        """As WorkerPool's, counting the token's path: the chooser and the devices it sends the token to are
        partners too."""
        host = super()._local_data_host(name)
        if host is not None:
            return host
        routes = {r.device for r in self.token_routes}
        partners = routes if name == self.token_device else {self.token_device} if name in routes else set()
        for p in sorted(partners - {name}):
            ep = self.workers[p].endpoint if p in self.workers else None
            if ep is not None and not ep.loopback:
                return outward_host(ep)
        return None
