"""What the HTTP and gRPC fronts share: the models served (a session each), the bearer token, and one
`infer` that maps every failure to the protocol's kind of error (and counts it)."""

from __future__ import annotations

import hmac
import logging
import threading
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import EdgecRuntimeError, InputError, one_line
from ..manifest.types import Manifest
from .oip import BadRequest, InferRequest, NotFound, body_limit
from .session import Cluster, QueueFull, SessionClosed

__all__ = ["Model", "Front", "Failure", "KINDS"]

logger = logging.getLogger(__name__)

# Failure kinds, as the protocol tells them apart: HTTP status and gRPC status code name.
KINDS = {"invalid": (400, "INVALID_ARGUMENT"), "not_found": (404, "NOT_FOUND"), "too_large": (413, "INVALID_ARGUMENT"),
         "unauthorized": (401, "UNAUTHENTICATED"), "queue_full": (429, "RESOURCE_EXHAUSTED"),
         "unavailable": (503, "UNAVAILABLE"), "failed": (500, "INTERNAL")}


class Failure(Exception):
    """A request that gets no outputs: its kind (KINDS) and a one-line message."""

    def __init__(self, kind: str, message: str):
        super().__init__(one_line(message, 1000))
        self.kind = kind

    @property
    def http_status(self) -> int:
        return KINDS[self.kind][0]

    @property
    def grpc_code(self) -> str:
        return KINDS[self.kind][1]


@dataclass
class Model:
    name: str
    session: Cluster
    limit: int  # the largest request body read for it, in bytes

    @property
    def manifest(self) -> Manifest:
        return self.session.manifest


class Front:
    """The models by name, the token, the figures (metrics.Figures); thread-safe."""

    def __init__(self, models: Mapping[str, Cluster], *, token: bytes | None = None, figures=None,
                 max_body: int | None = None):
        self.models = {name: Model(name, s, max_body or body_limit(s.manifest)) for name, s in models.items()}
        self.token = token
        self.figures = figures
        self.accepting = True
        self._active = 0
        self._idle = threading.Condition()

    def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header carries the bearer token (compared in constant time)."""
        if self.token is None:
            return True
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token)

    def model(self, name: str) -> Model:
        model = self.models.get(name)
        if model is None:
            raise Failure("not_found", f"unknown model {name[:80]!r} (served: {', '.join(self.models)})")
        return model

    @property
    def ready(self) -> bool:
        return self.accepting and all(m.session.ready for m in self.models.values())

    def infer(self, model: Model, request: InferRequest) -> dict[str, np.ndarray]:
        """The request's outputs; Failure with the protocol's kind otherwise. Counted in the figures."""
        with self._idle:
            self._active += 1
        try:
            if not self.accepting:
                raise Failure("unavailable", "the server is shutting down")
            try:
                future = model.session.submit(request.inputs)
            except QueueFull as exc:
                raise Failure("queue_full", str(exc)) from None
            except SessionClosed as exc:
                raise Failure("unavailable", str(exc)) from None
            except InputError as exc:
                raise Failure("invalid", str(exc)) from None
            try:
                return future.result()
            except EdgecRuntimeError as exc:  # a device lost with no fallback, a failed worker
                raise Failure("unavailable", str(exc)) from None
        except Failure as failure:
            self.failed(model.name, failure.kind)
            raise
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def failed(self, model: str, kind: str) -> None:
        if self.figures is not None:
            self.figures.failed(model, kind)

    def bad_request(self, exc: BadRequest | InputError) -> Failure:
        return Failure("not_found" if isinstance(exc, NotFound) else "invalid", str(exc))

    def wait_idle(self, timeout: float) -> bool:
        """Until no infer is between its request and its answer (after close: answered), or `timeout`."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)
