"""The one link model: unit conversions, the time of a message, and the runtime's own cost of one.

A link carries `bandwidth_mbps` (10^6 bit/s) after a fixed `latency_ms`. A message of `nbytes` takes
nbytes / bytes_per_ms + latency_ms on the wire (`wire_ms`); where the planners price a tensor crossing
devices, one of no bytes is free, since nothing is sent (`message_ms`).

The runtime's own cost of a message (the profiles' `runtime:` figures, compiled into the manifest's
`network.costs`: encoding, CURVE, the ZeroMQ hand-off, decoding, host copies) is part of every message's
time: each end does half the work, so a message from a to b pays the mean of a's and b's `message_ms`, and
per byte the mean of their `message_ms_per_mb` / 10^6. `link` folds both into a link's figures (the
latency holds the fixed part, the bytes per ms the per-byte part), so that the compiler's network model
(compiler/cost/network.py), its pipeline planner, the replay of a manifest and the runtime's emulation
price a message alike. A device without the figures adds 0: the links are then exactly the cluster's.

`costs` arguments are anything with `message_ms`, `message_ms_per_mb` and `request_ms` (ms; the runtime's
RuntimeCosts, the compiler's profile figures). The compiler imports this module; it imports nothing.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["MB", "mbps_to_bytes_per_ms", "mbps_to_bytes_per_s", "gbps_to_bytes_per_ms", "per_million_ms",
           "MessageCosts", "message_fixed_ms", "message_ms_per_byte", "request_half_ms", "effective_bytes_per_ms",
           "link", "wire_ms", "message_ms"]

MB = 1e6  # the decimal megabyte: the profiles' per-MB figures and a GB/s (10^9 bytes/s) are in these


def mbps_to_bytes_per_ms(bandwidth_mbps: float) -> float:
    """Megabits per second as bytes per millisecond: 1 Mbit/s = 10^6 / 8 bytes/s = 125 bytes/ms."""
    return bandwidth_mbps * 125.0


def mbps_to_bytes_per_s(bandwidth_mbps: float) -> float:
    """Megabits per second as bytes per second (mbps_to_bytes_per_ms x 1000)."""
    return mbps_to_bytes_per_ms(bandwidth_mbps) * 1000.0


def gbps_to_bytes_per_ms(gbps: float) -> float:
    """Gigabytes per second (10^9 bytes/s, a memory bandwidth) as bytes per millisecond: x 10^6."""
    return gbps * MB


def per_million_ms(n: float, ms_per_million: float) -> float:
    """`n` bytes (or elements) at a cost of `ms_per_million` per 10^6 of them."""
    return n * ms_per_million / MB


class MessageCosts(Protocol):
    """The runtime's own costs on one device, in ms: per message (both ends together), per 10^6 bytes of
    a message, per request."""

    message_ms: float
    message_ms_per_mb: float
    request_ms: float


def message_fixed_ms(a: MessageCosts, b: MessageCosts) -> float:
    """The runtime's fixed cost of one message between devices of these costs: half of each end's figure."""
    return (a.message_ms + b.message_ms) / 2.0


def message_ms_per_byte(a: MessageCosts, b: MessageCosts) -> float:
    """The runtime's cost per byte of one message between devices of these costs: half of each end's."""
    return (a.message_ms_per_mb + b.message_ms_per_mb) / 2.0 / MB


def request_half_ms(c: MessageCosts, nbytes: float) -> float:
    """Half a device's per-request cost (the measurement is one tiny input in and one tiny output out),
    plus `nbytes` of model inputs or outputs at its per-byte message cost: they travel between the
    coordinator and the device through the same transport as any message."""
    return c.request_ms / 2.0 + per_million_ms(nbytes, c.message_ms_per_mb)


def effective_bytes_per_ms(bw: float, ms_per_byte: float) -> float:
    """A link's bytes per ms once the runtime's per-byte cost is added to the wire's (bw itself when that
    cost is 0, so that the figures of profiles without it are the link's, bit for bit)."""
    return bw if ms_per_byte == 0.0 else 1.0 / (1.0 / bw + ms_per_byte)


def link(bandwidth_mbps: float, latency_ms: float, a: MessageCosts, b: MessageCosts) -> tuple[float, float]:
    """(bytes per ms, latency ms) of a message from a device of costs `a` to one of costs `b` over a link
    of `bandwidth_mbps` and `latency_ms`, the runtime's cost of a message included."""
    bw = mbps_to_bytes_per_ms(bandwidth_mbps)
    return effective_bytes_per_ms(bw, message_ms_per_byte(a, b)), latency_ms + message_fixed_ms(a, b)


def wire_ms(nbytes, bytes_per_ms, latency_ms):
    """nbytes / bytes_per_ms + latency_ms (numbers or numpy arrays, element by element): the time of a
    message that is sent, whatever its size (the runtime's send steps, its emulation, the replay).
    `message_ms` is the planners' form, where a tensor of no bytes is no message."""
    return nbytes / bytes_per_ms + latency_ms


def message_ms(nbytes: float, bytes_per_ms: float, latency_ms: float) -> float:
    """One message of `nbytes` over a link of these figures (`link`): 0 for no bytes, else
    nbytes / bytes_per_ms + latency_ms."""
    return 0.0 if nbytes == 0 else wire_ms(nbytes, bytes_per_ms, latency_ms)
