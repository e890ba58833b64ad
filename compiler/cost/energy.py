"""Energy per request: what one input costs the devices a plan uses, in mJ (W x ms = mJ).

Per device the plan uses (it computes something, or sends or receives an activation):

    compute_mj = busy_w x busy_ms                 (its fragments' compute)
    idle_mj    = idle_w x (span_ms - busy_ms)     (the rest of the request's span)
    radio_mj   = (tx_nj_per_byte x bytes sent + rx_nj_per_byte x bytes received) / 10^6

The span is the request's predicted latency: from the moment the first device takes the input to the
moment the last output is out, every device the plan uses stays powered and is charged idle power
whenever it is not computing (waiting for its input, sending, or done early). Bytes are the
device-to-device activations of the plan (`Transfer`s); the model's input and output, which come from
and go to the coordinator, are not charged (they are the same for every plan). A device without radio
figures pays no radio energy (its profile does not know it); a used device without `power_w` makes the
total unknown (None): a total that silently leaves a device out would favour that device.

Devices the plan leaves out are reported apart (`idle_devices`, their idle power), not charged: whether
they are switched off or serve something else is the operator's business.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster.power import DevicePower

__all__ = ["DeviceEnergy", "Energy", "request_energy", "device_mj", "link_mj", "radio_mj"]

NJ_PER_MJ = 1e6


def device_mj(busy_w: float, idle_w: float, busy_ms: float, span_ms: float) -> tuple[float, float]:
    """(compute mJ, idle mJ) of a device busy `busy_ms` of a request's `span_ms` (module docstring); numbers
    or numpy arrays, element by element."""
    return busy_w * busy_ms, idle_w * (span_ms - busy_ms)


def link_mj(nbytes, tx_nj_per_byte, rx_nj_per_byte):
    """The radio energy of `nbytes` sent at tx_nj_per_byte and received at rx_nj_per_byte, in mJ; numbers or
    numpy arrays, element by element."""
    return nbytes * (tx_nj_per_byte + rx_nj_per_byte) / NJ_PER_MJ


def radio_mj(power: DevicePower, sent: float, received: float) -> float:
    """A device's radio energy for `sent` and `received` bytes, in mJ (0 for figures its profile lacks)."""
    return ((power.tx_nj_per_byte or 0.0) * sent + (power.rx_nj_per_byte or 0.0) * received) / NJ_PER_MJ


@dataclass(frozen=True)
class DeviceEnergy:
    compute_mj: float
    idle_mj: float
    radio_mj: float

    @property
    def total_mj(self) -> float:
        return self.compute_mj + self.idle_mj + self.radio_mj

    def to_dict(self) -> dict:
        return {"energy_mj": round(self.total_mj, 4), "compute_mj": round(self.compute_mj, 4),
                "idle_mj": round(self.idle_mj, 4), "radio_mj": round(self.radio_mj, 4)}


@dataclass(frozen=True)
class Energy:
    """One request's energy. `devices`: the used devices with power figures; `unknown`: used devices
    without them (then `total_mj` is None); `idle_devices`: {device the plan leaves out: its idle W}."""

    total_mj: float | None
    devices: dict[str, DeviceEnergy]
    unknown: tuple[str, ...]
    idle_devices: dict[str, float | None]
    span_ms: float

    def to_dict(self) -> dict:
        return {"energy_mj": None if self.total_mj is None else round(self.total_mj, 4),
                "span_ms": round(self.span_ms, 4),
                "devices": {d: e.to_dict() for d, e in sorted(self.devices.items())},
                "unknown": list(self.unknown),
                "unused_idle_w": dict(sorted(self.idle_devices.items()))}


def request_energy(span_ms: float, busy_ms: dict[str, float], sent: dict[str, float], received: dict[str, float],
                   power: dict[str, DevicePower]) -> Energy:
    """The energy of one request (module docstring). `power` lists every device of the cluster; the used
    ones are those that compute, send or receive."""
    used = {d for d, ms in busy_ms.items() if ms > 0} | {d for d, n in sent.items() if n > 0} \
        | {d for d, n in received.items() if n > 0}
    devices, unknown = {}, []
    for d in sorted(used):
        p = power.get(d, DevicePower())
        if not p.known:
            unknown.append(d)
            continue
        busy = min(busy_ms.get(d, 0.0), span_ms)
        devices[d] = DeviceEnergy(*device_mj(p.busy_w, p.idle_w, busy, span_ms),
                                  radio_mj(p, sent.get(d, 0.0), received.get(d, 0.0)))
    total = None if unknown else sum(e.total_mj for e in devices.values())
    idle = {d: p.idle_w for d, p in power.items() if d not in used}
    return Energy(total, devices, tuple(unknown), idle, span_ms)
