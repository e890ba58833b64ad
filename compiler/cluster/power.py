"""A device's power figures, as its profile (or its power mode) gives them; cost/energy.py prices them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DevicePower"]


@dataclass(frozen=True)
class DevicePower:
    """A device's power figures (its profile's, or its mode's): watts, and nJ per byte on its network
    interface. None: unknown."""

    idle_w: float | None = None
    busy_w: float | None = None
    tx_nj_per_byte: float | None = None
    rx_nj_per_byte: float | None = None

    @property
    def known(self) -> bool:
        return self.idle_w is not None and self.busy_w is not None

    def to_dict(self) -> dict:
        """The manifest's per-device figures (only those known)."""
        out = {}
        if self.idle_w is not None or self.busy_w is not None:
            out["power_w"] = {"idle": self.idle_w, "busy": self.busy_w}
        if self.tx_nj_per_byte is not None or self.rx_nj_per_byte is not None:
            out["radio_nj_per_byte"] = {"tx": self.tx_nj_per_byte, "rx": self.rx_nj_per_byte}
        return out
