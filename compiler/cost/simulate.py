"""`edgec simulate`: a manifest's static schedule replayed with its predicted fragment times and its
network (the runtime's replay, runtime/manifest/replay.py), with the energy of the request."""

from __future__ import annotations

from edgec.runtime.manifest.types import Manifest
from edgec.runtime.manifest.replay import replay

from ..cluster.power import DevicePower
from .energy import Energy, request_energy

__all__ = ["simulate_manifest", "manifest_power"]


def simulate_manifest(manifest: Manifest) -> dict:
    """Replay a manifest's static schedule with its predicted fragment times and its network: the runtime's
    replay (runtime/manifest/replay.py, the planner's timeline), with the energy of the request.

    `manifest` is the runtime's parsed Manifest (parse_manifest or load_manifest), so the schedule has
    been validated: every fragment a run names exists, and no recv waits for a send that never comes.
    """
    t = replay(manifest)
    busy = {d: t.busy_ms(d) for d in t.finish_ms}
    latency = t.latency_ms
    energy = request_energy(latency, busy, t.sent, t.received, manifest_power(manifest))
    return {
        "latency_ms": latency,
        "devices": {d: {"busy_ms": busy[d], "finish_ms": t.finish_ms[d], **_energy_of(energy, d)} for d in t.finish_ms},
        "bytes_transferred": t.bytes_transferred,
        "predicted_energy_mj": energy.total_mj,
        "energy": energy.to_dict(),
        "timeline": t.events,
    }


def manifest_power(manifest: Manifest) -> dict[str, DevicePower]:
    """{device: the power figures the manifest was compiled with}."""
    return {d.name: DevicePower(d.idle_w, d.busy_w, d.tx_nj_per_byte, d.rx_nj_per_byte) for d in manifest.devices}


def _energy_of(energy: Energy, device: str) -> dict:
    e = energy.devices.get(device)
    return {"predicted_energy_mj": None if e is None else e.total_mj}
