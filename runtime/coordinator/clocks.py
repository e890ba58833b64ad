"""Clock sync for --report and --trace: every worker's clock offset estimated with Cristian's method
(accuracy.py), and the store of a run's timings. A part of WorkerPool (pool.py)."""

from __future__ import annotations

import logging
import time

from ..errors import InputError
from ..manifest.schedule import working_devices
from ..manifest.types import Manifest
from ..wire.protocol import MAX_TIMED_STEPS
from .accuracy import SYNC_ROUNDS, ClockOffset, Samples, estimate_offset
from .workers import WorkerLink

__all__ = ["Clocks", "timings_store"]

logger = logging.getLogger(__name__)


class Clocks:
    """WorkerPool's clock reads: sync_clocks() and the workers' `synced` answers."""

    def sync_clocks(self) -> None:
        """Estimate every worker's clock offset (accuracy.py: Cristian's method, the fastest of SYNC_ROUNDS
        round trips); the first `sync` also switches the workers' per-request timings on."""
        deadline = time.monotonic() + self.timeout
        for seq in range(SYNC_ROUNDS):
            for w in self.workers.values():
                w.sync = (seq, time.monotonic())
                self._send(w, {"t": "sync", "seq": seq})
            self._pump(deadline, lambda: all(w.sync is None for w in self.workers.values()), "reading the clocks")
        for w in self.workers.values():
            logger.debug("%s: clock offset %+.3f ms (+- %.3f ms)", w.where, w.offset.offset_s * 1000.0,
                         w.offset.bound_s * 1000.0)

    def _on_synced(self, w: WorkerLink, msg: dict, payload) -> None:
        received = time.monotonic()
        if w.sync is None or msg["seq"] != w.sync[0]:
            return self.drops.drop(f"'synced' from {w.name} that answers no sync")
        estimate = estimate_offset(w.sync[1], msg["clock"], received)
        if w.offset is None or estimate.bound_s < w.offset.bound_s:
            w.offset = estimate
        w.sync = None

    @property
    def offsets(self) -> dict[str, ClockOffset]:
        return {w.name: w.offset for w in self.workers.values() if w.offset is not None}


def timings_store(manifest: Manifest) -> Samples:
    """The timings store of a manifest, refusing one whose devices' timings would not fit a `done` message."""
    samples = Samples(manifest)
    for device in working_devices(manifest):
        timed = len(samples.runs[device]) + len(samples.clocks[device])
        if timed > MAX_TIMED_STEPS:
            raise InputError(f"{manifest.path}: device {device} has {timed} fragment runs, sends and receives per "
                             f"request, too many to time (at most {MAX_TIMED_STEPS}); run without --report and "
                             "--trace")
    return samples
