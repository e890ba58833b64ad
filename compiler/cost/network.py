"""The network model: how long a message takes between two devices, on the runtime's one link model.

The formulas (Mbps as bytes per ms, a message's time, the runtime's own cost of a message folded into a
link's figures) live in runtime/linkmodel.py, which the runtime's replay and emulation use too; this module
puts them on the cluster's named devices. On a "switched" medium every pair has its own link; on a "shared"
medium one channel carries every transfer (the planners and `evaluate` queue them). Every planner, which
reads either `bytes_per_ms`/`latency_ms` or `transfer_ms`, and `evaluate` price a message alike. A device
without the runtime's figures adds 0: the links of profiles without them are exactly the cluster's.
"""

from __future__ import annotations

from edgec.runtime.linkmodel import (link, message_fixed_ms, message_ms, message_ms_per_byte, mbps_to_bytes_per_ms,
                                     request_half_ms)

from ..cluster import ClusterModel

__all__ = ["NetworkModel"]


class NetworkModel:
    """The cluster's links between named devices, priced in bytes per ms and ms.

    `bytes_per_ms(a, b)` and `latency_ms(a, b)` describe a message between two distinct devices, the
    runtime's cost of a message included (module docstring); a device's link to itself is infinitely fast
    and free. `transfer_ms` is what a tensor costs to send. `request_in_ms(d, nbytes)` / `request_out_ms(d,
    nbytes)` are the runtime's per-request cost on a device that takes model inputs / gives model outputs of
    nbytes (default: all of the model's, `io_bytes`): half of its `request_ms` each (the measurement is one
    tiny input in and one tiny output out), plus the bytes at its per-byte message cost, since inputs and
    outputs travel between the coordinator and the device through the same transport as any message.
    """

    def __init__(self, cluster: ClusterModel, io_bytes: tuple[int, int] = (0, 0), lone: bool = False):
        self.io_bytes = io_bytes  # (bytes of the model's inputs, of its outputs)
        self.devices = cluster.device_names
        self.medium = cluster.medium
        self.shared = cluster.medium == "shared"
        # lone: the runtime's costs as a lone request meets them (DeviceSpec.lone_runtime, cost/quota_burst.py)
        self._costs = {d.name: d.lone_runtime if lone else d.runtime for d in cluster.devices}
        self._links: dict[tuple[str, str], tuple[float, float]] = {}
        for a in self.devices:
            for b in self.devices:
                lk = cluster.link(a, b)
                if a == b:  # never priced (transfer_ms is 0 on one device): the bare link
                    self._links[a, b] = (mbps_to_bytes_per_ms(lk.bandwidth_mbps), lk.latency_ms)
                else:
                    self._links[a, b] = link(lk.bandwidth_mbps, lk.latency_ms, self._costs[a], self._costs[b])

    def bytes_per_ms(self, src: str, dst: str) -> float:
        return self._links[src, dst][0]

    def latency_ms(self, src: str, dst: str) -> float:
        return self._links[src, dst][1]

    def transfer_ms(self, nbytes: float, src: str, dst: str) -> float:
        """`nbytes` from src to dst: 0 on the same device or for nothing, else bytes / bandwidth + latency."""
        if src == dst:
            return 0.0
        return message_ms(nbytes, *self._links[src, dst])

    def runtime_ms(self, nbytes: float, src: str, dst: str) -> float:
        """The runtime's own work on a message of `nbytes` from src to dst (both ends together), without
        the wire's time, in CPU time where the profiles measured it (RuntimeFigures.cpu): what its hand-off
        costs the machines' cores (cpu_bounds.py `host_periods`)."""
        if src == dst:
            return 0.0
        a, b = self._costs[src].cpu(), self._costs[dst].cpu()
        return message_fixed_ms(a, b) + nbytes * message_ms_per_byte(a, b)

    def request_in_ms(self, device: str, nbytes: int | None = None, cpu: bool = False) -> float:
        return self._request_ms(device, self.io_bytes[0] if nbytes is None else nbytes, cpu)

    def request_out_ms(self, device: str, nbytes: int | None = None, cpu: bool = False) -> float:
        return self._request_ms(device, self.io_bytes[1] if nbytes is None else nbytes, cpu)

    def _request_ms(self, device: str, nbytes: int, cpu: bool = False) -> float:
        """Half the request's fixed cost plus the bytes at the per-byte message cost; with `cpu`, in CPU time
        where measured (RuntimeFigures.cpu)."""
        return request_half_ms(self._costs[device].cpu() if cpu else self._costs[device], nbytes)
