"""Network model: how long a message takes between two devices. The compiler's one Mbps conversion.

A link carries bandwidth_mbps (10^6 bit/s) after a fixed latency_ms: `nbytes` cost
nbytes / bytes_per_ms(bandwidth_mbps) + latency_ms. On a "switched" medium every pair has its own link;
on a "shared" medium one channel carries every transfer (the planners and `evaluate` queue them).

The runtime's own cost of a message (the profiles' `runtime:` figures: encoding, CURVE, the ZeroMQ hand-off,
decoding, host copies) is part of every message's time: each end does half the work, so a message from a to
b pays the mean of a's and b's `message_ms`, and per byte the mean of their `message_ms_per_mb` / 10^6. It is
folded into the link's figures here (`latency_ms` holds the fixed part, `bytes_per_ms` the per-byte part), so
every planner, which reads either those or `transfer_ms`, and `evaluate` price a message alike. A device
without the figures adds 0: the links of profiles without them are exactly the cluster's.
"""

from __future__ import annotations

from edgec.runtime.replay import effective_bytes_per_ms, message_ms

from ..cluster import Cluster, RuntimeCosts

__all__ = ["bytes_per_ms", "message_ms", "fixed_message_ms", "per_byte_ms", "Network"]


def bytes_per_ms(bandwidth_mbps: float) -> float:
    """Megabits per second as bytes per millisecond: 1 Mbit/s = 10^6 / 8 bytes/s = 125 bytes/ms."""
    return bandwidth_mbps * 125.0


def fixed_message_ms(a: RuntimeCosts, b: RuntimeCosts) -> float:
    """The runtime's fixed cost of one message between devices of these costs: half of each end's figure."""
    return (a.message_ms + b.message_ms) / 2.0


def per_byte_ms(a: RuntimeCosts, b: RuntimeCosts) -> float:
    """The runtime's cost per byte of one message between devices of these costs: half of each end's."""
    return (a.message_ms_per_mb + b.message_ms_per_mb) / 2.0 / 1e6


class Network:
    """The cluster's links between named devices, priced in bytes per ms and ms.

    `bytes_per_ms(a, b)` and `latency_ms(a, b)` describe a message between two distinct devices, the
    runtime's cost of a message included (module docstring); a device's link to itself is infinitely fast
    and free. `transfer_ms` is what a tensor costs to send. `request_in_ms(d, nbytes)` / `request_out_ms(d,
    nbytes)` are the runtime's per-request cost on a device that takes model inputs / gives model outputs of
    nbytes (default: all of the model's, `io_bytes`): half of its `request_ms` each (the measurement is one
    tiny input in and one tiny output out), plus the bytes at its per-byte message cost, since inputs and
    outputs travel between the coordinator and the device through the same transport as any message.
    """

    def __init__(self, cluster: Cluster, io_bytes: tuple[int, int] = (0, 0)):
        self.io_bytes = io_bytes  # (bytes of the model's inputs, of its outputs)
        self.devices = cluster.device_names
        self.medium = cluster.medium
        self.shared = cluster.medium == "shared"
        self._costs = {d.name: d.runtime for d in cluster.devices}
        self._links: dict[tuple[str, str], tuple[float, float]] = {}
        for a in self.devices:
            for b in self.devices:
                link = cluster.link(a, b)
                bw, lat = bytes_per_ms(link.bandwidth_mbps), link.latency_ms
                if a != b:
                    ca, cb = self._costs[a], self._costs[b]
                    bw, lat = effective_bytes_per_ms(bw, per_byte_ms(ca, cb)), lat + fixed_message_ms(ca, cb)
                self._links[a, b] = (bw, lat)

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

    def runtime_ms(self, nbytes: float, src: str, dst: str) -> float:
        """The runtime's own work on a message of `nbytes` from src to dst (both ends together), without
        the wire's time, in CPU time where the profiles measured it (RuntimeCosts.cpu): what its hand-off
        costs the machines' cores (evaluate.py `_host_periods`)."""
        if src == dst:
            return 0.0
        a, b = self._costs[src].cpu(), self._costs[dst].cpu()
        return fixed_message_ms(a, b) + nbytes * per_byte_ms(a, b)

    def request_in_ms(self, device: str, nbytes: int | None = None, cpu: bool = False) -> float:
        return self._request_ms(device, self.io_bytes[0] if nbytes is None else nbytes, cpu)

    def request_out_ms(self, device: str, nbytes: int | None = None, cpu: bool = False) -> float:
        return self._request_ms(device, self.io_bytes[1] if nbytes is None else nbytes, cpu)

    def _request_ms(self, device: str, nbytes: int, cpu: bool = False) -> float:
        """Half the request's fixed cost plus the bytes at the per-byte message cost; with `cpu`, in CPU time
        where measured (RuntimeCosts.cpu)."""
        c = self._costs[device].cpu() if cpu else self._costs[device]
        return c.request_ms / 2.0 + nbytes * c.message_ms_per_mb / 1e6
