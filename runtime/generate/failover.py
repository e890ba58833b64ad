"""Failover mid-generation: a device lost while sequences are in flight (its worker killed, its connection lost,
or silent past the heartbeats: DeviceLost, as coordinator/failover.py for `edgec run`) ends the run of the plan
in use and starts the build's fallback plan without it (`edgec compile --generate --fallbacks`). The caches
of the lost plan are gone with it, so every unfinished sequence restarts there with a prefill of its prompt and
the tokens it has so far (loop.py), its sampling going on with its next token's own draw (device/choose.py).
One failover per generation, as for `edgec run`: fallback plans have no fallbacks of their own."""

from __future__ import annotations

import logging
from typing import Mapping

from ..coordinator.failover import why_no_fallback
from ..coordinator.liveness import DeviceLost
from ..manifest.load import check_fragment_files, load_fallback
from ..manifest.schedule import working_devices
from ..manifest.signatures import check_signatures
from ..manifest.types import Manifest
from .pool import GeneratePool

__all__ = ["Failover"]

logger = logging.getLogger(__name__)


class Failover:
    """The GeneratePool of the plan in use, the main one until a device is lost, then the fallback without it.
    `failovers` lists the switches as [{device, after_tokens, plan}], after_tokens being the tokens every
    sequence had in all when the device was lost. The fallbacks are checked on construction, so a broken one is
    bad input before any worker starts. Use as a context manager: `pool` is the plan's pool in use."""

    def __init__(self, manifest: Manifest, *, addresses: Mapping[str, str] | None = None, **options):
        self.main = manifest
        self.addresses = dict(addresses or {})
        self.options = options  # the other GeneratePool arguments, the same for every plan
        self.fallbacks = {fb.without: load_fallback(manifest, fb, check_files=False)
                          for fb in manifest.fallbacks if fb.manifest is not None}
        self.pool: GeneratePool | None = None
        self.failovers: list[dict] = []

    def __enter__(self) -> "Failover":
        try:
            self.pool = self._open(self.main)
        except DeviceLost as lost:  # a worker died as the run started (WorkerPool.__enter__ closed the rest)
            self.switch(lost, [])
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.close()

    def _open(self, manifest: Manifest) -> GeneratePool:
        addresses = {name: a for name, a in self.addresses.items() if name in manifest.device_names}
        return GeneratePool(manifest, addresses=addresses, **self.options).__enter__()

    def switch(self, lost: DeviceLost, tokens: list[int]) -> GeneratePool:
        """The fallback plan's pool, started, after `lost` with the unfinished sequences holding `tokens`
        tokens each; DeviceLost naming the device (one line) when there is none."""
        fallback = self.fallbacks.get(lost.device) if not self.failovers else None
        if fallback is None:
            switched = self.failovers[-1]["device"] if self.failovers else None
            raise DeviceLost(lost.device, f"{lost}{why_no_fallback(self.main, lost.device, switched, 'generation')}") from None
        logger.warning("%s: switching to the fallback plan %s (devices %s) after %d token(s); restarting the %d "
                       "unfinished sequence(s) with a prefill of their prompt and tokens so far", lost, fallback.path,
                       ", ".join(working_devices(fallback)), sum(tokens), len(tokens))
        old, self.pool = self.pool, None
        if old is not None:  # None: lost as the first plan started, already closed
            old.close(grace=old.timeout)
        self.failovers.append({"device": lost.device, "after_tokens": sum(tokens), "plan": str(fallback.path)})
        check_fragment_files(fallback)
        check_signatures(fallback)
        self.pool = self._open(fallback)
        return self.pool

