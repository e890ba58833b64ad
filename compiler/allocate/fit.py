"""HiTDL's latency model L(n) = c0 + c1/n + c2/n^2, fitted per service to the planner's predictions.

HiTDL's n counts equal CPU cores. On a cluster of unequal devices, n here is the capacity a plan uses, in
fastest devices: the sum over the devices it uses of (the model's compute time on the fastest device /
its compute time on that device), from the cost table. A plan on the fastest device alone has n = 1; on
two devices half as fast, n = 1 too. The points are every plan the allocator made for the service; the
fit is least squares over the basis (1, 1/n, 1/n^2), with fewer terms when fewer than three distinct n
were planned (the fit is then exact), and its error is relative to each point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LatencyFit", "fit_latency", "capacity"]


@dataclass(frozen=True)
class LatencyFit:
    c0: float
    c1: float
    c2: float
    points: tuple[tuple[float, float], ...]  # (capacity n, predicted ms)
    mean_error: float  # mean of |L(n) - predicted| / predicted over the points
    max_error: float

    def __call__(self, n: float) -> float:
        return self.c0 + self.c1 / n + self.c2 / n ** 2

    def to_dict(self) -> dict:
        return {"c0": round(self.c0, 6), "c1": round(self.c1, 6), "c2": round(self.c2, 6),
                "mean_error": round(self.mean_error, 6), "max_error": round(self.max_error, 6),
                "points": [[round(n, 4), round(ms, 4)] for n, ms in self.points]}


def capacity(cost, devices) -> float:
    """The compute capacity of `devices` in fastest devices of `cost`'s cluster (see the module docstring)."""
    alone = cost.layer_ms.sum(axis=0)
    return float(sum(alone.min() / alone[cost.index(d)] for d in devices))


def fit_latency(points) -> LatencyFit | None:
    """L(n) fitted to `points` ((n, ms) pairs), or None without points.

        >>> f = fit_latency(((1, 100.0), (2, 60.0), (4, 40.0)))
        >>> round(f(2), 6), f.max_error < 1e-9
        (60.0, True)
    """
    if not points:
        return None
    n = np.array([p[0] for p in points], dtype=np.float64)
    ms = np.array([p[1] for p in points], dtype=np.float64)
    basis = np.stack([np.ones_like(n), 1.0 / n, 1.0 / n ** 2], axis=1)[:, :min(3, len(set(n.tolist())))]
    coef, *_ = np.linalg.lstsq(basis, ms, rcond=None)
    c = [*coef.tolist(), 0.0, 0.0][:3]
    rel = np.abs(basis @ coef - ms) / np.maximum(ms, 1e-12)
    return LatencyFit(c[0], c[1], c[2], tuple((float(a), float(b)) for a, b in points), float(rel.mean()),
                      float(rel.max()))
