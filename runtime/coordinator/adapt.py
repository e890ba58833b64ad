"""`edgec run --adapt`: switch, between requests, to the kept plan that the measured figures favour.

A build compiled with `--keep N`, `--shifts` and/or `--fallbacks` holds other plans of the same model on the
same cluster: the manifest's `alternatives` (`--shifts` adds the DGPAS neighbours of a pipeline plan, each
moving one stage boundary by one layer) and its fallbacks, each without one device, which are the plans for
when that device is slow rather than gone. While a run streams, the coordinator measures, per completed request:
- each device's compute factor: the run time of its fragments over their predicted_ms (summed per request);
- each link's transfer factor: the measured time of the messages between two devices over the cost model's
  (accuracy.py times a message from the start of its send to the receiver taking it off its socket).

The figure of a device or link is over the last WINDOW requests that measured it: the median for compute;
the fastest for a link, because a message's measured time only grows by waiting (a receiver busy with a
run takes it when the run ends), so the fastest of a window is the link's own speed. A device or link that
the plan in use leaves out keeps the last figure measured on it (1, its prediction, if never measured).

Drift: once WINDOW requests have completed on the plan in use, its schedule is replayed (manifest/replay.py, the
planner's own timeline) with the measured figures, each device's fragments and each link's messages scaled
by their factors, and compared with the same replay under the figures it was chosen under (its predictions,
for the plan the run started with). A change by more than `threshold` (relative) is drift; a figure that
barely moves the plan (a slow link carrying a few bytes) is not. Then every plan of the build is re-costed
the same way, by the objective the build was compiled for (the latency of one request, or the period of a
streamed one), and the run switches to the best when it beats the plan in use by more than MARGIN; either
way the measured figures become what the plan in use assumes, so one drift leads to one decision.
The switch itself (failover.py FailoverPool): no new request is issued, those in flight complete on
the old plan, and the next one runs on the new plan: nothing is lost or re-run.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

from .accuracy import TransferKey, transfer_keys
from ..errors import InputError
from ..manifest.load import load_alternative, load_fallback
from ..manifest.types import Manifest
from ..manifest.replay import Drift, Timeline, replay

__all__ = ["WINDOW", "THRESHOLD", "MARGIN", "Option", "Measured", "Decision", "Adapter", "busiest_ms", "kept_plans"]

WINDOW = 5  # requests per figure: the median moves once 3 of the last 5 agree, so one or two odd requests do not
THRESHOLD = 0.25  # default relative change of a figure that is drift (measurement noise stays well inside)
MARGIN = 0.10  # switch only to a plan predicted this much faster: re-costing is no better than the figures


@dataclass(frozen=True)
class Option:
    """A plan the run may switch to: its manifest and how the run reports it (the build's main manifest
    "main", an alternative its folder and, for a boundary shift, the variant)."""

    manifest: Manifest
    label: str


class Measured:
    """The figures of the last WINDOW requests that measured each device and link (module docstring)."""

    def __init__(self, window: int = WINDOW):
        self.window = window
        self.compute: dict[str, deque[float]] = {}
        self.transfer: dict[tuple[str, str], deque[float]] = {}
        self._predicted: dict[int, tuple[dict[str, tuple[str, float]], dict[TransferKey, float]]] = {}

    def add(self, manifest: Manifest, fragment_ms: Mapping[str, float], transfer_ms: Mapping[TransferKey, float]) -> None:
        """One completed request's measured times (accuracy.Samples.add) on the plan `manifest`."""
        frags, links = self._predictions(manifest)
        ratios: dict[str, list[float]] = {}
        for fid, ms in fragment_ms.items():
            if fid in frags:
                device, predicted = frags[fid]
                sums = ratios.setdefault(device, [0.0, 0.0])
                sums[0] += ms
                sums[1] += predicted
        for device, (measured, predicted) in ratios.items():
            if predicted > 0:
                self._keep(self.compute, device, measured / predicted)
        pairs: dict[tuple[str, str], list[float]] = {}
        for key, ms in transfer_ms.items():
            if key in links:
                sums = pairs.setdefault(key[:2], [0.0, 0.0])
                sums[0] += ms
                sums[1] += links[key]
        for pair, (measured, predicted) in pairs.items():
            if predicted > 0:
                self._keep(self.transfer, pair, measured / predicted)

    def _keep(self, table: dict, key, ratio: float) -> None:
        table.setdefault(key, deque(maxlen=self.window)).append(ratio)

    def _predictions(self, manifest: Manifest):
        """({fragment: (device, predicted ms)}, {transfer key: predicted ms}) of a plan, computed once."""
        got = self._predicted.get(id(manifest))
        if got is None:
            frags = {f.id: (f.device, f.predicted_ms) for f in manifest.fragments.values()}
            links: dict[TransferKey, float] = {}
            for t, key in zip(manifest.transfers, transfer_keys(manifest)):
                if key is not None:
                    links[key] = links.get(key, 0.0) + manifest.network.transfer_s(t.src, t.dst, t.bytes) * 1000.0
            got = self._predicted[id(manifest)] = (frags, links)
        return got

    def drift(self) -> Drift:
        """The figures now: median compute factor per device, fastest transfer factor per link."""
        return Drift({d: statistics.median(v) for d, v in self.compute.items()},
                     {p: min(v) for p, v in self.transfer.items()})


def busiest_ms(t: Timeline) -> float:
    """The most time any one resource (a device computing; an uplink, or the shared channel, carrying
    messages) is busy per request: what bounds a streamed plan's period."""
    busy: dict[str, float] = {}
    for e in t.events:
        busy[e["resource"]] = busy.get(e["resource"], 0.0) + e["end_ms"] - e["start_ms"]
    return max(busy.values(), default=0.0)


@dataclass
class Decision:
    """A re-costing: when (the timed request count), why, every plan's re-costed figure (ms: the latency
    of one request, or the period of a streamed one), the pick."""

    at_request: int
    reason: str
    recosted_ms: dict[str, float]
    current: str
    best: str
    switched_at: int | None = None  # the completed count when the plan changed (those in flight completed first)


@dataclass
class Adapter:
    """Watches the run's measured figures and decides when to switch plans (module docstring). `options`
    holds every plan of the build, the one the run starts with first; `objective` ("latency" or
    "throughput") what a plan is re-costed by: the latency of one request, or the period of a streamed
    one (the plan's predicted 1 / throughput_ips, scaled by how much longer its busiest resource is busy)."""

    options: list[Option]
    objective: str = "latency"
    threshold: float = THRESHOLD
    window: int = WINDOW
    margin: float = MARGIN
    measured: Measured = field(init=False)
    current: Option = field(init=False)
    assumed: Drift = field(init=False, default_factory=Drift)
    since_switch: int = field(init=False, default=0)
    decisions: list[Decision] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.objective not in ("latency", "throughput"):
            raise ValueError(f"objective {self.objective!r}: expected latency or throughput")
        self.measured = Measured(self.window)
        self.current = self.options[0]

    def observe(self, manifest: Manifest, fragment_ms: Mapping[str, float],
                transfer_ms: Mapping[TransferKey, float]) -> None:
        """A completed request's measured times on the plan `manifest` (requests in flight when the adapter
        chose another plan complete on the old one)."""
        self.measured.add(manifest, fragment_ms, transfer_ms)
        if manifest is self.current.manifest:
            self.since_switch += 1

    def cost_ms(self, option: Option, drift: Drift) -> float:
        """The plan re-costed under `drift`, in ms, by the objective (class docstring)."""
        t = replay(option.manifest, drift)
        if self.objective == "latency":
            return t.latency_ms
        base = busiest_ms(replay(option.manifest))
        thr = option.manifest.predicted.get("throughput_ips")
        ok = isinstance(thr, (int, float)) and not isinstance(thr, bool) and math.isfinite(thr) and thr > 0
        period = 1000.0 / thr if ok else base
        return period * busiest_ms(t) / base if base > 0 else period

    def decide(self, at_request: int) -> Option | None:
        """The plan to switch to now, or None. Only after WINDOW requests on the plan in use, and only when
        the figures measured since it was chosen change its own re-costed figure by more than the threshold."""
        if self.since_switch < self.window:
            return None
        now = self.measured.drift()
        then_ms, now_ms = self.cost_ms(self.current, self.assumed), self.cost_ms(self.current, now)
        if then_ms <= 0 or abs(now_ms / then_ms - 1.0) <= self.threshold:
            return None
        reason = (f"the plan in use re-costs at {now_ms:.2f} ms ({self.objective}), {now_ms / then_ms - 1.0:+.0%} "
                  f"from {then_ms:.2f} ms; most changed: {self._most_changed(now)}")
        recosted = {o.label: (now_ms if o is self.current else self.cost_ms(o, now)) for o in self.options}
        best = min(self.options, key=lambda o: (recosted[o.label], o is not self.current))
        if recosted[best.label] > now_ms * (1.0 - self.margin):
            best = self.current
        self.decisions.append(Decision(at_request, reason, recosted, self.current.label, best.label))
        self.assumed = now
        if best is self.current:
            return None
        self.current, self.since_switch = best, 0
        return best

    def _most_changed(self, now: Drift) -> str:
        """The figure whose change moves the plan in use most: its relative change x the time the plan
        spends on it per request (a device's runs, a link's messages)."""
        t = replay(self.current.manifest)
        spent: dict = {}
        for e in t.events:
            key = e["device"] if e["kind"] == "compute" else (e["src"], e["dst"])
            spent[key] = spent.get(key, 0.0) + e["end_ms"] - e["start_ms"]
        best, weight = "nothing", -1.0
        for figures, assumed in ((now.compute, self.assumed.compute), (now.transfer, self.assumed.transfer)):
            for key, factor in figures.items():
                w = abs(factor / assumed.get(key, 1.0) - 1.0) * spent.get(key, 0.0)
                if w > weight:
                    name = f"compute of {key}" if isinstance(key, str) else f"link {key[0]} -> {key[1]}"
                    best, weight = f"{name} at {factor:.2f}x its prediction", w
        return best

    def as_json(self) -> list[dict]:
        """The decisions, for `edgec run --json`'s `adaptations` (docs/gen/jsonout.py documents the keys)."""
        return [{"at_request": d.at_request, "reason": d.reason, "from": d.current, "to": d.best,
                 "switched_at": d.switched_at, "objective": self.objective,
                 "recosted_ms": {k: round(v, 4) for k, v in d.recosted_ms.items()}}
                for d in self.decisions]

    def forget(self) -> None:
        """Drop what was measured so far (the warm-up's first runs allocate: they are no figure)."""
        self.measured = Measured(self.window)
        self.since_switch = 0


def kept_plans(m: Manifest, threshold: float = THRESHOLD, objective: str | None = None) -> Adapter:
    """The adapter over every plan the build kept, the main one first, re-costing by `objective` or the
    build's own; bad input without any kept plan, or for a build compiled for energy without `objective`."""
    if objective is None:
        objective = m.objective or "latency"
        if objective == "energy":
            raise InputError(f"{m.path}: the build was compiled for energy, which --adapt does not re-cost; choose "
                             "what to adapt for with --adapt-for latency or --adapt-for throughput")
    if objective not in ("latency", "throughput"):
        raise InputError(f"--adapt-for {objective!r}: expected latency or throughput")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 10:
        raise InputError(f"--adapt-threshold {threshold!r}: expected a relative change above 0 (0.25: 25%) and below 10")
    fallbacks = [fb for fb in m.fallbacks if fb.manifest is not None]
    if not m.alternatives and not fallbacks:
        raise InputError(f"{m.path}: --adapt switches between the plans a build kept, and this one kept none; compile "
                         "with --keep N, --shifts and/or --fallbacks")
    options = [Option(m, m.path.name)]
    options += [Option(load_alternative(m, alt), alt.manifest) for alt in m.alternatives]
    options += [Option(load_fallback(m, fb, check_files=False), fb.manifest) for fb in fallbacks]
    return Adapter(options, objective=objective, threshold=float(threshold))
