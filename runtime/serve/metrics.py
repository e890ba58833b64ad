"""The serving figures: Prometheus metrics (prometheus-client, names prefixed edgec_) for GET /metrics, and
the one-line status `edgec serve` writes on stderr every minute."""

from __future__ import annotations

import statistics
import threading
from typing import Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..manifest.types import HOST, Manifest
from ..manifest.schedule import host_collects, host_feeds
from .session import Cluster

__all__ = ["Figures"]

# Latency buckets (seconds): a tiny model on one host answers in a millisecond; a CNN across Pis in a second.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Figures:
    """Counts requests per model as the sessions answer them (Cluster.listen) and the fronts refuse them."""

    def __init__(self, sessions: Mapping[str, Cluster]):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("edgec_requests", "Requests answered with outputs", ["model"], registry=r)
        self.failures = Counter("edgec_request_failures", "Requests refused or failed, by kind (invalid, not_found, "
                                "too_large, unauthorized, queue_full, unavailable, failed)", ["model", "kind"],
                                registry=r)
        self.latency = Histogram("edgec_request_latency_seconds", "From a request's inputs sent to the devices to "
                                 "its last output back", ["model"], buckets=_BUCKETS, registry=r)
        self.queue = Gauge("edgec_queue_depth", "Requests accepted and waiting for room in the devices", ["model"],
                           registry=r)
        self.inflight = Gauge("edgec_requests_in_flight", "Requests in the devices", ["model"], registry=r)
        self.compute = Counter("edgec_device_compute_seconds", "Time each device spent running its fragments",
                               ["model", "device"], registry=r)
        self.link = Counter("edgec_link_bytes", "Tensor bytes the plan in use moves on each link per answered request "
                            "(before compression; @host: the serving host)", ["model", "src", "dst"], registry=r)
        self.failovers = Counter("edgec_failovers", "Switches to a fallback plan after a device was lost", ["model"],
                                 registry=r)
        self.adaptations = Counter("edgec_adaptations", "Switches to another kept plan (--adapt)", ["model"],
                                   registry=r)
        self.ready = Gauge("edgec_ready", "1 when the model's session is ready", ["model"], registry=r)
        self.sessions = dict(sessions)
        self._lock = threading.Lock()
        self._window: list[float] = []  # latencies (ms) since the last status line
        self._window_errors = 0
        self._total = 0
        for name, session in self.sessions.items():
            self.requests.labels(name)
            self.latency.labels(name)
            session.listen(self._listener(name))

    def _listener(self, model: str):
        # The labelled children are looked up once (per device, per plan's links), not per request: the
        # listener runs on the session's I/O thread, between the devices' messages.
        requests, latency = self.requests.labels(model), self.latency.labels(model)
        compute: dict[str, Counter] = {}
        links: dict[str, list] = {}

        def on_event(event: str, figures: dict) -> None:
            if event == "done":
                requests.inc()
                latency.observe(figures["latency_ms"] / 1000.0)
                for device, ms in figures["run_ms"].items():
                    child = compute.get(device)
                    if child is None:
                        child = compute[device] = self.compute.labels(model, device)
                    child.inc(ms / 1000.0)
                manifest = self.sessions[model].pool.manifest
                plan = links.get(str(manifest.path))
                if plan is None:
                    plan = links[str(manifest.path)] = [(self.link.labels(model, src, dst), nbytes)
                                                        for (src, dst), nbytes in _links(manifest).items()]
                for child, nbytes in plan:
                    child.inc(nbytes)
                with self._lock:
                    self._window.append(figures["latency_ms"])
                    self._total += 1
            elif event == "failover":
                self.failovers.labels(model).inc()
            elif event == "adaptation":
                self.adaptations.labels(model).inc()
        return on_event

    def failed(self, model: str, kind: str) -> None:
        self.failures.labels(model, kind).inc()
        with self._lock:
            self._window_errors += 1

    def exposition(self) -> tuple[bytes, str]:
        """The Prometheus text format, gauges read now."""
        for name, session in self.sessions.items():
            status = session.status()
            self.queue.labels(name).set(status["queued"])
            self.inflight.labels(name).set(status["in_flight"])
            self.ready.labels(name).set(1 if status["ready"] else 0)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def status_line(self, period_s: float = 60.0) -> str:
        """Requests since the last line (`period_s` ago), their p50/p99, errors; the window starts over."""
        with self._lock:
            window, errors, total = self._window, self._window_errors, self._total
            self._window, self._window_errors = [], 0
        if len(window) >= 2:
            cuts = statistics.quantiles(window, n=100, method="inclusive")
            p50, p99 = cuts[49], cuts[98]
        else:
            p50 = p99 = window[0] if window else 0.0
        return (f"{len(window)} request(s) in the last {period_s:g} s ({total} in all), p50 {p50:.2f} ms, "
                f"p99 {p99:.2f} ms, {errors} error(s)")


def _links(m: Manifest) -> dict[tuple[str, str], int]:
    """Bytes per request on each link of a plan: its transfers, and the inputs and outputs to and from the host."""
    found: dict[tuple[str, str], int] = {}
    specs = {t.name: t for t in m.inputs}
    for device, name in host_feeds(m):
        found[(HOST, device)] = found.get((HOST, device), 0) + specs[name].nbytes
    for t in m.transfers:
        found[(t.src, t.dst)] = found.get((t.src, t.dst), 0) + t.bytes
    for name, device in host_collects(m).items():
        nbytes = next(o.nbytes for o in m.outputs if o.name == name)
        found[(device, HOST)] = found.get((device, HOST), 0) + nbytes
    return found
