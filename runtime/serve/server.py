"""`edgec serve`: a session per model behind the HTTP (and gRPC) fronts, until SIGTERM or SIGINT.

On a signal the fronts stop accepting, every request accepted is answered, the workers stop, and the
process exits 0. A status line (requests, p50/p99, errors) goes to the log every `status_every` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from pathlib import Path
from typing import Mapping

from ..errors import InputError
from ..wire.net import is_loopback
from .front import Front
from .session import Cluster

__all__ = ["parse_bind", "read_token", "serve_forever", "STATUS_EVERY_S"]

logger = logging.getLogger(__name__)

STATUS_EVERY_S = 60.0
_DRAIN_S = 30.0  # after the sessions closed, how long answered requests may take to be written


def parse_bind(value: str, option: str) -> tuple[str, int]:
    """HOST:PORT (port 0: any free one) as (host, port)."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"{option} {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8000")
    return host, int(port)


def read_token(path: str | None, binds: Mapping[str, tuple[str, int]]) -> bytes | None:
    """The bearer token of --token-file; InputError for a non-loopback bind without one, or an empty file."""
    if path is None:
        for option, (host, _) in binds.items():
            if not is_loopback(host):
                raise InputError(f"{option} {host}: a non-loopback address needs --token-file FILE (clients then send "
                                 "Authorization: Bearer TOKEN)")
        return None
    try:
        token = Path(path).read_bytes().strip()
    except OSError as exc:
        raise InputError(f"--token-file {path}: cannot read it ({exc.strerror or exc})") from None
    if len(token) < 16 or any(c < 0x21 or c > 0x7E for c in token):
        raise InputError(f"--token-file {path}: expected one line of at least 16 printable characters, no spaces")
    return token


def serve_forever(builds: Mapping[str, str | Path], *, http: str = "127.0.0.1:8000", grpc: str | None = None,
                  token_file: str | None = None, max_body: int | None = None, version: str = "",
                  status_every: float = STATUS_EVERY_S, **session_options) -> int:
    """Serve each build ({model name: build folder}) until SIGTERM/SIGINT; 0 then."""
    binds = {"--http": parse_bind(http, "--http")}
    if grpc is not None:
        binds["--grpc"] = parse_bind(grpc, "--grpc")
    token = read_token(token_file, binds)
    try:
        from .metrics import Figures  # prometheus-client: the `serve` extra
        if grpc is not None:
            from . import grpc_front  # noqa: F401 - grpcio and protobuf: the `serve` extra
    except ImportError as exc:
        raise InputError(f"edgec serve needs {exc.name or 'its dependencies'}: pip install 'edgec[serve]' (or "
                         "'edgec-runtime[serve]' on a device)") from None

    with contextlib.ExitStack() as stack:
        sessions: dict[str, Cluster] = {}
        for name, build in builds.items():
            sessions[name] = Cluster(build, **session_options)
            stack.callback(sessions[name].close)
            logger.info("%s: %s, %d worker(s) ready, up to %d request(s) in flight", name, build,
                        len(sessions[name].pool.workers), sessions[name].inflight)
        figures = Figures(sessions)
        front = Front(sessions, token=token, figures=figures, max_body=max_body)
        servers = _start_fronts(front, binds, figures, version, stack)
        stop = threading.Event()
        with _on_signals(stop):
            logger.info("ready: %s", "; ".join(servers))
            while not stop.wait(status_every):
                logger.info("%s", figures.status_line(status_every))
            logger.info("stopping: answering the requests accepted, then stopping the workers")
            front.accepting = False
        # ExitStack unwinds: the fronts stop accepting, then the sessions answer what they accepted and close.
        stack.callback(front.wait_idle, _DRAIN_S)
    logger.info("stopped")
    return 0


def _start_fronts(front: Front, binds: dict, figures, version: str, stack: contextlib.ExitStack) -> list[str]:
    from .http_front import start_http

    host, port = binds["--http"]
    try:
        server = start_http(host, port, front, version, figures)
    except OSError as exc:
        raise InputError(f"--http {host}:{port}: cannot listen there ({exc.strerror or exc})") from None
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="edgec-http",
                              daemon=True)
    thread.start()
    stack.callback(server.server_close)
    stack.callback(front.wait_idle, _DRAIN_S)
    stack.callback(server.shutdown)
    bound = server.server_address
    where = [f"http://{_host(bound[0])}:{bound[1]}/v2/models/{name}" for name in front.models]
    if "--grpc" in binds:
        from .grpc_front import start_grpc

        ghost, gport = binds["--grpc"]
        gserver, gbound = start_grpc(ghost, gport, front, version)
        stack.callback(gserver.stop, None)
        where.append(f"grpc {_host(ghost)}:{gbound}")
    return where


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@contextlib.contextmanager
def _on_signals(stop: threading.Event):
    """SIGTERM and SIGINT set `stop` (in the main thread; elsewhere, an embedding application's signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
