"""Failover: a worker pool that survives the loss of a working device by finishing the run on the build's
fallback plan without it (`edgec compile --fallbacks`), and that switches between kept plans between requests
when --adapt decides (adapt.py). The serving session (edgec.Cluster) runs on one."""

from __future__ import annotations

import logging
from collections import deque
from itertools import chain
from typing import Iterable, Iterator, Mapping

import numpy as np

from ..manifest.load import check_fragment_files, load_fallback
from ..manifest.schedule import working_devices
from ..manifest.signatures import check_signatures
from ..manifest.types import Manifest
from .accuracy import ClockOffset, Samples
from .adapt import Adapter, Option
from .liveness import DeviceLost
from .pool import WorkerPool
from .window import IDLE
from .workers import WorkerLink

__all__ = ["FailoverPool"]

logger = logging.getLogger(__name__)


class FailoverPool:
    """A WorkerPool that survives the loss of a working device (DeviceLost, mid-run or as the run starts) when
    the manifest has a fallback plan without it (`edgec compile --fallbacks`): it ends the run on the other
    workers, starts the fallback's (a remote worker serves the new run, a local one is started afresh), and
    re-runs every request that had not completed, so that outputs still come in request order and none is lost.
    One failover per run (fallback plans have no fallbacks of their own), from whichever plan is in use: the
    main one or one
    --adapt switched to. Without a fallback the DeviceLost error stands.

    `completed` counts the requests whose outputs were yielded and `handed` those handed to a plan, re-runs
    not counted again (the caller may reset both, as run_manifest does after the warm-up); `failovers` lists
    the switches as [{device, at_request, plan}], at_request being `completed` at the time. The fallbacks are
    checked on construction, so a broken one is bad input before any worker starts. Use as a context
    manager, like WorkerPool.

    With an `adapter` (adapt.py: `edgec run --adapt`; the cluster must time requests, `timings`), every
    completed request's measured times go to it, and when it decides on another kept plan the cluster stops
    issuing requests, lets those in flight complete, and runs the next ones on that plan. With `slow`
    ({device: (request, factor)}, emulation only), the device's fragment runs of the requests handed from that
    index on are padded to factor x their emulated time: a device that slows down mid-run."""

    def __init__(self, manifest: Manifest, *, addresses: Mapping[str, str] | None = None,
                 inflight: int | None = None, adapter: Adapter | None = None,
                 slow: Mapping[str, tuple[int, float]] | None = None, **options):
        self.main = manifest
        self.addresses = dict(addresses or {})
        self.inflight_option = inflight
        self.options = options  # the other WorkerPool arguments, the same for every plan
        self.fallbacks = {fb.without: load_fallback(manifest, fb, check_files=False)
                          for fb in manifest.fallbacks if fb.manifest is not None}
        self.adapter = adapter
        self.slow = dict(slow or {})
        self.cluster: WorkerPool | None = None
        self.wake_fd: int | None = None
        self.completed = 0
        self.handed = 0
        self.failovers: list[dict] = []
        self.reports: dict[str, dict] = {}

    def __enter__(self) -> "FailoverPool":
        cluster = WorkerPool(self.main, addresses=self.addresses, inflight=self.inflight_option, **self.options)
        try:
            self.cluster = self._started(cluster)
        except DeviceLost as lost:  # a worker died as the run started (WorkerPool.__enter__ closed the rest)
            self._keep_report(cluster, lost.device)
            self._switch(lost, 0)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self, manifest: Manifest, addresses: Mapping[str, str]) -> WorkerPool:
        return self._started(WorkerPool(manifest, addresses=addresses, inflight=self.inflight_option, **self.options))

    def _started(self, cluster: WorkerPool) -> WorkerPool:
        cluster = cluster.__enter__()
        if self.wake_fd is not None:
            cluster.watch(self.wake_fd)
        return cluster

    def watch(self, wake_fd: int) -> None:
        """WorkerPool.watch, on the plan in use and every plan switched to."""
        self.wake_fd = wake_fd
        if self.cluster is not None:
            self.cluster.watch(wake_fd)

    # what run_manifest reads of the cluster in use
    @property
    def workers(self) -> dict[str, WorkerLink]:
        return self.cluster.workers

    @property
    def threads(self) -> int:
        return self.cluster.threads

    @property
    def inflight(self) -> int:
        return self.cluster.inflight

    @property
    def compress(self) -> str:
        return self.cluster.compress

    @property
    def manifest(self) -> Manifest:
        """The plan in use: the main one, or the fallback after a switch."""
        return self.cluster.manifest

    @property
    def samples(self) -> Samples | None:
        return self.cluster.samples

    @property
    def offsets(self) -> dict[str, ClockOffset]:
        return self.cluster.offsets

    def stream(self, requests: Iterable[Mapping[str, np.ndarray]], inflight: int | None = None
               ) -> Iterator[tuple[dict[str, np.ndarray], float, dict[str, float]]]:
        """WorkerPool.stream, switching to the fallback plan when a device is lost and re-running, first and
        in order, the requests it had been given and had not completed."""
        source = ((None, item) for item in requests)  # (index handed at, inputs); None: not handed yet
        retry: list = []
        while True:
            issued: deque = deque()
            switch_to: list[Option] = []
            try:
                for result in self.cluster.stream(self._hand(chain(retry, source), issued, switch_to), inflight):
                    issued.popleft()
                    self.completed += 1
                    if self.adapter is not None:
                        self._observe(switch_to)
                    yield result
            except DeviceLost as lost:
                retry = list(issued)
                self._switch(lost, len(retry))
                continue
            if not switch_to:
                return
            retry = []
            self._adapt(switch_to[0])

    def _hand(self, source: Iterator, issued: deque, switch_to: list) -> Iterator:
        """The inputs of `source` for the plan in use, each noted in `issued` (to re-run after a failover)
        with its index; none once the adapter chose another plan (the rest stay in `source`). Under emulated
        drift (`slow`), the devices slowed from each request's index on are set on the cluster as it goes."""
        while not switch_to:
            entry = next(source, None)
            if entry is None:
                return
            index, inputs = entry
            if inputs is IDLE:  # nothing at hand now: not a request
                yield IDLE
                continue
            if index is None:
                index, self.handed = self.handed, self.handed + 1
            issued.append((index, inputs))
            if self.slow:
                self.cluster.slowdown = {d: f for d, (at, f) in self.slow.items() if index >= at}
            yield inputs

    def _observe(self, switch_to: list) -> None:
        """Give the adapter the request's measured times; note its pick, which ends handing to this plan."""
        timed = self.cluster.last_timed
        if timed is None:
            return
        self.adapter.observe(self.cluster.manifest, *timed)
        chosen = None if switch_to else self.adapter.decide(self.completed)
        if chosen is not None:
            switch_to.append(chosen)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, dict[str, float]]:
        return next(iter(self.stream([inputs], inflight=1)))

    def _switch(self, lost: DeviceLost, pending: int) -> None:
        # One failover per run. Whichever plan is in use (the main one, or one --adapt switched to), the
        # fallback without the lost device runs on devices that are all still there.
        first = not self.failovers
        fallback = self.fallbacks.get(lost.device) if first else None
        if fallback is None:
            switched = None if first else self.failovers[-1]["device"]
            raise DeviceLost(lost.device, f"{lost}{why_no_fallback(self.main, lost.device, switched, 'the run')}") from None
        logger.warning("%s: switching to the fallback plan %s (devices %s) after %d completed request(s); "
                       "re-running the %d not completed", lost, fallback.path, ", ".join(working_devices(fallback)),
                       self.completed, pending)
        self._replace(fallback, lost.device)
        self.failovers.append({"device": lost.device, "at_request": self.completed, "plan": str(fallback.path)})
        if self.adapter is not None:  # the fallback is none of the kept plans the adapter chooses among
            logger.warning("no more adaptation: the fallback plan runs to the end")
            self.adapter = None

    def _adapt(self, option: Option) -> None:
        """Switch to a kept plan: every request handed to the old one has completed."""
        decision = self.adapter.decisions[-1]
        logger.warning("adapting after %d completed request(s): %s; switching to %s (re-costed %.2f ms, the plan "
                       "in use %.2f ms)", self.completed, decision.reason, option.label,
                       decision.recosted_ms[option.label], decision.recosted_ms[decision.current])
        decision.switched_at = self.completed
        self._replace(option.manifest)

    def _replace(self, manifest: Manifest, lost: str | None = None) -> None:
        """End the run of the plan in use and start `manifest`'s. The old workers end their session before the
        new one's opens (a worker serves one at a time), so wait for their goodbye as long as a request may take."""
        old, self.cluster = self.cluster, None
        if old is not None:  # None: lost while the first plan started, already closed
            old.close(grace=old.timeout)
            self._keep_report(old, lost)
        check_fragment_files(manifest)
        check_signatures(manifest)
        addresses = {name: a for name, a in self.addresses.items() if name in manifest.device_names}
        self.cluster = self._open(manifest, addresses)

    def _keep_report(self, cluster: WorkerPool, lost: str | None = None) -> None:
        """Each device's figures from the last run it took part in; a lost device is marked so."""
        report = cluster.device_report()
        if lost is not None:
            report[lost] = {**report.get(lost, {}), "lost": True}
        self.reports.update(report)

    def device_report(self) -> dict[str, dict]:
        return {**self.reports, **(self.cluster.device_report() if self.cluster is not None else {})}

    def close(self) -> None:
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            cluster.close()
            self._keep_report(cluster)


def why_no_fallback(main: Manifest, device: str, switched_from: str | None, what: str) -> str:
    """Why `device`'s loss ends `what` (the run, generation): the fallback plan in use (the one without
    `switched_from`) has none of its own, the build has none, or none without that device."""
    if switched_from is not None:
        return (f" ({what} had already switched to the fallback plan without {switched_from}, which has no "
                "fallbacks of its own)")
    if not main.fallbacks:
        return " (the build has no fallback plans: compile with --fallbacks to finish on the devices left)"
    entry = main.fallback_for(device)
    return f" (no fallback plan without it: {entry.error})" if entry is not None else \
        f" (the build has no fallback plan without {device})"
