"""Worker addresses: `tcp://HOST:PORT`, where HOST is an IPv4 address, [an IPv6 address] or a host name."""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from dataclasses import dataclass

from ..errors import InputError

__all__ = ["Endpoint", "parse_endpoint", "outward_host", "is_loopback"]

logger = logging.getLogger(__name__)

_ADDRESS = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9*._-]+):([0-9]{1,5})")


@dataclass(frozen=True)
class Endpoint:
    host: str  # as written (an IPv6 address keeps its brackets)
    port: int

    def __str__(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def with_port(self, port: int) -> "Endpoint":
        return Endpoint(self.host, port)

    @property
    def bare_host(self) -> str:
        return self.host[1:-1] if self.host.startswith("[") else self.host

    @property
    def ipv6(self) -> bool:
        return self.host.startswith("[")

    @property
    def loopback(self) -> bool:
        """Only this machine can reach it (a wildcard address, 0.0.0.0 or *, is reachable from anywhere)."""
        return is_loopback(self.bare_host)


def is_loopback(host: str) -> bool:
    """A host name or address (without brackets) only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_endpoint(text: str, where: str, allow_any_port: bool = False) -> Endpoint:
    """`tcp://HOST:PORT` or InputError naming `where`; port 0 only with allow_any_port (bind to a free one)."""
    m = _ADDRESS.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise InputError(f"{where}: {text!r} is not an address of the form tcp://HOST:PORT")
    port = int(m.group(2))
    if not (0 if allow_any_port else 1) <= port <= 65535:
        raise InputError(f"{where}: port {port} is out of range ({0 if allow_any_port else 1}-65535)")
    host = m.group(1)
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise InputError(f"{where}: {host} is not an IPv6 address") from None
    return Endpoint(host, port)


def outward_host(peer: Endpoint) -> str:
    """This machine's address on the route to `peer` (for a local worker that a remote one must reach).
    Connecting a UDP socket sends nothing; it only asks the kernel which source address it would use."""
    family = socket.AF_INET6 if peer.ipv6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((peer.bare_host, peer.port))
            addr = s.getsockname()[0]
    except OSError as exc:
        raise InputError(f"{peer}: no route to this address from here ({exc.strerror or exc})") from None
    return f"[{addr}]" if family == socket.AF_INET6 else addr
