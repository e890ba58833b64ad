"""Network model: how long a message takes between two devices. The compiler's one Mbps conversion.

A link carries bandwidth_mbps (10^6 bit/s) after a fixed latency_ms: `nbytes` cost
nbytes / bytes_per_ms(bandwidth_mbps) + latency_ms. On a "switched" medium every pair has its own link;
on a "shared" medium one channel carries every transfer (the planners and `evaluate` queue them).
"""

from __future__ import annotations

from ..cluster import Cluster

__all__ = ["bytes_per_ms", "message_ms", "Network"]


def bytes_per_ms(bandwidth_mbps: float) -> float:
    """Megabits per second as bytes per millisecond: 1 Mbit/s = 10^6 / 8 bytes/s = 125 bytes/ms."""
    return bandwidth_mbps * 125.0


def message_ms(nbytes: float, bandwidth_mbps: float, latency_ms: float) -> float:
    """One message of `nbytes` over a link: transmission at the link's bandwidth, then its latency."""
    return nbytes / bytes_per_ms(bandwidth_mbps) + latency_ms


class Network:
    """The cluster's links between named devices, priced in bytes per ms and ms.

    `bytes_per_ms(a, b)` and `latency_ms(a, b)` describe the link between two distinct devices (a
    device's link to itself is infinitely fast and free); `transfer_ms` is what a tensor costs to send.
    """

    def __init__(self, cluster: Cluster):
        self.devices = cluster.device_names
        self.medium = cluster.medium
        self.shared = cluster.medium == "shared"
        self._links: dict[tuple[str, str], tuple[float, float]] = {}
        for a in self.devices:
            for b in self.devices:
                link = cluster.link(a, b)
                self._links[a, b] = (bytes_per_ms(link.bandwidth_mbps), link.latency_ms)

    def bytes_per_ms(self, src: str, dst: str) -> float:
        return self._links[src, dst][0]

    def latency_ms(self, src: str, dst: str) -> float:
        return self._links[src, dst][1]

    def transfer_ms(self, nbytes: float, src: str, dst: str) -> float:
        """`nbytes` from src to dst: 0 on the same device or for nothing, else bytes / bandwidth + latency."""
        if src == dst or nbytes == 0:
            return 0.0
        bw, lat = self._links[src, dst]
        return nbytes / bw + lat
