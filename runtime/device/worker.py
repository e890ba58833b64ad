"""`edgec worker`: the long-running daemon on each device. It serves one coordinator's run (a session) at a
time, receives the device's fragments into its cache, executes the device's steps for every request and
frees everything when the run ends. The protocol is in wire/protocol.py; the per-run state in session.py.

The command itself (`worker`) is here too, so that `python -m edgec.runtime.device.worker ...` is the same
command (the coordinator starts local workers that way) without reaching up to front/cli.py.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import time

import click
import onnxruntime as ort
import zmq

from .cache import FragmentCache, default_cache_dir
from ..command import EXIT_OK, Finite, RunCommand, runtime_log_to_stderr
from ..errors import EdgecRuntimeError, InputError, one_line
from ..interrupts import Interrupted, interrupt_on_signals
from ..wire.keys import COORDINATOR, Keyring
from ..machine import MAX_THREADS_HERE, edgec_version
from ..wire.net import Endpoint, parse_endpoint
from ..wire.protocol import PROTOCOL_VERSION, DropLog, parse
from .session import Session, SessionEnd, SessionLost
from ..wire.transport import POLL_MS, BadMessage, frame_sender, pack, recv_message, send_frames

__all__ = ["Daemon", "rss_mb", "keep_heap", "worker", "worker_main", "main", "MAX_IDLE_TIMEOUT_S", "MAX_BUFFER_MB"]

# by name, not __name__: `python -m edgec.runtime.device.worker` runs this file as __main__, whose records the
# "edgec.runtime" handler of the worker command would not see
logger = logging.getLogger("edgec.runtime.device.worker")

# The worker's option bounds: a silent coordinator loses its claim after --idle-timeout, so that must stay
# bounded; zmq's largest message size is an int64 of bytes, and no device holds a terabyte of tensors.
MAX_IDLE_TIMEOUT_S = 3600.0
MAX_BUFFER_MB = 1 << 20
DRAIN_LIMIT = 256  # messages handled per socket per poll: a flooding peer cannot starve the other socket

# glibc's mallopt parameters (malloc.h) and what `keep_heap` sets them to.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
HEAP_BLOCK_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit systems
HEAP_KEEP_BYTES = 64 << 20


class Daemon:
    """The worker: a control ROUTER on `endpoint`, a data PULL per session, the fragment cache."""

    def __init__(self, endpoint: Endpoint, *, cache: FragmentCache, keys: Keyring | None = None, threads: int = 0,
                 data_port: int = 0, data_host: str | None = None, max_buffer_bytes: int = 1 << 30,
                 max_message_bytes: int = 1 << 30, idle_timeout: float = 30.0, once: bool = False,
                 parent: int | None = None):
        for host in (endpoint, Endpoint(data_host, 1) if data_host else endpoint):
            if keys is None and not host.loopback:
                raise InputError(f"--listen {endpoint}: refusing to listen on {host.host}, which other machines can "
                                 "reach, without --keys (create them with `edgec keygen`)")
        self.keys, self.cache, self.threads = keys, cache, threads
        # The one key a run is accepted from (wire/keys.py, "Roles"): a device's key only carries tensors.
        self.coordinator = keys.coordinator_key() if keys is not None else None
        self.data_port, self.data_host = data_port, data_host or endpoint.host
        self.max_buffer_bytes, self.max_message_bytes = max_buffer_bytes, max_message_bytes
        self.idle_timeout, self.once, self.parent = idle_timeout, once, parent
        if not keep_heap():
            logger.debug("not glibc: each large message's buffers may cost fresh pages")
        self.session: Session | None = None
        self.served = 0
        self.version = edgec_version()
        self.drops = DropLog(f"worker {endpoint}")
        cache.open()
        self.ctx = zmq.Context()
        self.auth = keys.authenticator(self.ctx) if keys is not None else None
        try:
            self.control = self._socket(zmq.ROUTER)
            self.control.setsockopt(zmq.LINGER, 2000)  # a final error or "bye" still reaches the coordinator
            self.control.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished peer raises, not vanishes
            self.control.setsockopt(zmq.ROUTER_HANDOVER, 1)  # the coordinator's reconnection keeps its session
            self.endpoint = self._bind(self.control, str(endpoint), "--listen")
        except BaseException:
            self.close()
            raise
        self.poller = zmq.Poller()
        self.poller.register(self.control, zmq.POLLIN)

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        # zmq drops the connection of a peer that sends a larger message: a bound on every receive
        sock.setsockopt(zmq.MAXMSGSIZE, max(self.max_message_bytes, 128 << 20))
        if self.keys is not None:
            self.keys.serve(sock)
        return sock

    def _bind(self, sock: zmq.Socket, address: str, what: str) -> str:
        try:
            sock.bind(address)
        except zmq.ZMQError as exc:
            raise InputError(f"{what} {address}: cannot listen there ({exc.strerror})") from None
        return sock.getsockopt(zmq.LAST_ENDPOINT).decode()

    # -- sockets a session uses -------------------------------------------------------------------------
    def bind_data(self) -> zmq.Socket:
        sock = self._socket(zmq.PULL)
        # Unread messages wait in zmq per connection up to this many; past it the sender blocks.
        sock.setsockopt(zmq.RCVHWM, 64)
        try:
            self._bind(sock, f"tcp://{self.data_host}:{self.data_port}", "--data-port")
        except BaseException:
            sock.close(linger=0)
            raise
        self.poller.register(sock, zmq.POLLIN)
        return sock

    def unbind_data(self, sock: zmq.Socket) -> None:
        self.poller.unregister(sock)
        sock.close(linger=0)

    @staticmethod
    def trim() -> None:
        gc.collect()
        _trim_heap()

    def send_to(self, peer: bytes, frames: list) -> None:
        try:
            send_frames(self.control, [peer, *frames])
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer is gone
            if self.session is not None and peer == self.session.owner:
                raise SessionLost(f"the coordinator at {self.session.peer} went away ({exc.strerror})") from None
            logger.debug("reply to a departed peer dropped: %s", exc)

    # -- the loop ---------------------------------------------------------------------------------------
    def pump(self, timeout_ms: int = POLL_MS) -> None:
        """Handle what arrived on the control and data sockets (waiting up to timeout_ms for something)."""
        events = dict(self.poller.poll(timeout_ms))
        if self.control in events:
            self._drain(self.control, self._on_control)
        session = self.session
        if session is not None and session.data is not None and session.data in events:
            self._drain(session.data, session.on_data)

    @staticmethod
    def _drain(sock: zmq.Socket, handle) -> None:
        for _ in range(DRAIN_LIMIT):
            frames = recv_message(sock)
            if frames is None:
                return
            handle(frames)

    def _on_control(self, frames: list[zmq.Frame]) -> None:
        peer, body = frames[0].bytes, frames[1:]
        if self.coordinator is not None and frame_sender(frames[-1]) != self.coordinator.decode():
            self._not_coordinator(peer, body)
            return
        if self.session is not None and peer == self.session.owner:
            self.session.on_control(body)
            return
        try:
            msg, _ = parse(body, {"hello"})
        except BadMessage as exc:
            self.drops.drop("not from the coordinator of the current run", exc)
            return
        where = _peer_address(body[0])
        if msg["protocol"] != PROTOCOL_VERSION:
            logger.warning("refused a coordinator at %s: it speaks protocol %d, this worker %d", where,
                           msg["protocol"], PROTOCOL_VERSION)
            self._refuse(peer, "version", f"the worker speaks protocol {PROTOCOL_VERSION} (edgec {self.version}), "
                                          f"this coordinator {msg['protocol']} (edgec {one_line(msg['edgec'], 40)}): "
                                          "install the same edgec version on both")
        elif self.session is not None:
            since = time.strftime("%H:%M:%S", time.localtime(self.session.started))
            logger.warning("refused a coordinator at %s: busy with the run of %s", where, self.session.peer)
            self._refuse(peer, "busy", f"the worker is busy with the run of another coordinator ({self.session.peer},"
                                       f" since {since}); try again when it has finished")
        else:
            self.session = Session(self, peer, where)
            self.send_to(peer, [pack({"t": "welcome", "protocol": PROTOCOL_VERSION, "edgec": self.version,
                                      "pid": os.getpid(), "threads": self.threads, "cores": _cores(),
                                      "key": None if self.keys is None else self.keys.public.decode(),
                                      "providers": ort.get_available_providers()})])

    def _not_coordinator(self, peer: bytes, body: list[zmq.Frame]) -> None:
        """A control message from a key other than the coordinator's (a device's, say): dropped; a hello is
        told why, so that a misconfigured coordinator fails in one line rather than timing out."""
        try:
            parse(body, {"hello"})
        except BadMessage:
            self.drops.drop("control message from a key that is not the coordinator's")
            return
        sender = frame_sender(body[0]) or "?"
        member = next((n for n, k in self.keys.trusted.items() if k.decode() == sender), None)
        logger.warning("refused a run from %s: only the coordinator's key may start runs", _peer_address(body[0])
                       + (f" (key of {member})" if member else ""))
        self._refuse(peer, "role", f"the worker accepts runs only from the key named '{COORDINATOR}' "
                                   f"({self.keys.where}/{COORDINATOR}.key), and this one is "
                                   + (f"{member!r}'s" if member else "not it"))

    def _refuse(self, peer: bytes, code: str, reason: str) -> None:
        self.send_to(peer, [pack({"t": "refused", "code": code, "reason": reason, "protocol": PROTOCOL_VERSION})])

    def serve(self) -> None:
        """Serve sessions until stopped (SIGTERM raises Interrupted through here), or after one with --once."""
        print(f"edgec worker: listening on {self.endpoint}", flush=True)
        logger.info("listening on %s (%s, cache %s)", self.endpoint,
                    f"keys of {self.keys.name}" if self.keys else "no keys: loopback only", self.cache.folder)
        while not (self.once and self.served and self.session is None):
            if self.parent is not None and os.getppid() != self.parent:
                logger.info("the process that started this worker is gone; stopping")
                return
            try:
                session = self.session
                if session is not None and session.queue:
                    session.execute_next()
                else:
                    self.pump()
                if self.session is not None:
                    self.session.check_idle()
            except SessionEnd:
                self.end_session(bye=True)
            except SessionLost as exc:
                logger.warning("run abandoned: %s", exc)
                self.end_session(bye=False)
            except Exception as exc:  # a failed run must never take the daemon down
                self.fail_session(exc)

    def fail_session(self, exc: BaseException) -> None:
        session = self.session
        if not isinstance(exc, EdgecRuntimeError):
            logger.exception("unexpected failure")
        if session is None:
            return
        message = str(exc) if isinstance(exc, EdgecRuntimeError) else \
            f"device {session.device or '?'}: {type(exc).__name__}: {one_line(exc)}"
        logger.warning("run failed: %s", message)
        try:
            session.reply(t="error", kind=_error_kind(exc), req=session.queue[0] if session.queue else -1,
                          message=message)
        except (SessionLost, zmq.ZMQError):
            pass
        self.end_session(bye=False)

    def end_session(self, bye: bool) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        stats = {**session.stats, "dropped": session.drops.total + self.drops.total, "rss_mb": rss_mb()}
        if bye:
            try:
                session.reply(t="bye", stats=stats)
            except (SessionLost, zmq.ZMQError):
                pass
        session.close()
        kept = set(session.shas)
        del session
        self.trim()
        self.cache.evict(keep=kept)
        self.served += 1
        logger.info("run ended: %d request(s); %d fragment bytes, %d tensor bytes received (%d decoded), %d sent "
                    "(%d before compression); %d message(s) dropped", stats["requests"],
                    stats["fragment_bytes_received"], stats["bytes_received"], stats["bytes_received_raw"],
                    stats["bytes_sent"], stats["bytes_sent_raw"], stats["dropped"])

    def stop(self, why: str) -> None:
        """End the current run (its coordinator is told why) and release everything; idempotent."""
        if self.session is not None:
            device = self.session.device or "?"
            self.fail_session(_Stopped(f"device {device}: the worker at {self.endpoint} was stopped ({why})"))
        self.close()

    def close(self) -> None:
        if getattr(self, "auth", None) is not None:
            self.auth.stop()
            self.auth = None
        if self.ctx is not None:
            if getattr(self, "control", None) is not None:
                self.control.close()  # with its linger: what was sent last is delivered
            self.ctx.destroy(linger=0)
            self.ctx = None


class _Stopped(EdgecRuntimeError):
    exit_code = 3


def _error_kind(exc: BaseException) -> str:
    """The `error` message's kind: "input" (the coordinator's request was bad), "stopped" (this worker is going
    away: its device is lost, as if it had died, so the coordinator fails over) or "run" (the run failed here)."""
    if isinstance(exc, InputError):
        return "input"
    return "stopped" if isinstance(exc, _Stopped) else "run"


def _peer_address(frame: zmq.Frame) -> str:
    try:
        return frame.get("Peer-Address") or "?"
    except zmq.ZMQError:
        return "?"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def rss_mb() -> float:
    """This process's resident memory in MiB (Linux /proc; elsewhere the peak, from getrusage)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


def _trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc keeps them otherwise), so a finished run's memory is
    visible as free memory again, not only reusable by this process."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def keep_heap() -> bool:
    """glibc: serve buffers of up to HEAP_BLOCK_BYTES from the heap, and keep up to HEAP_KEEP_BYTES of it freed,
    rather than a fresh mmap per buffer and its pages handed back when freed; False where not glibc.

    Every message a worker sends or receives passes through buffers of its size (ZeroMQ's encrypted and plain
    frames, the decoded tensor, a fragment's outputs). glibc's defaults hand large freed blocks back to the OS,
    so the next message of that size faults in fresh zeroed pages: a 1 MiB tensor between two local workers
    took 1.26-1.43 ms (median) with the defaults, 0.98-1.02 ms with this, and its requests' hand-offs, which
    alternated between about 1.0 and 1.8 ms from one request to the next, stayed within 0.95-1.12 ms (p10-p90)
    (2026-11-27, this 2-core machine). The heap still goes back to the OS at the end of a run (`_trim_heap`)."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, HEAP_KEEP_BYTES))


def die_with_parent() -> None:
    """Linux: SIGTERM when the process that started us dies (the serve loop also checks getppid)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_WORKER_EPILOG = ("Exit codes: 0 stopped by SIGTERM or SIGINT (the run in progress, if any, is ended and its "
                  "coordinator told why; nothing is left behind), 2 bad input (an address it cannot listen on, "
                  "a non-loopback address without --keys, a bad keys folder). Prints `edgec worker: listening on "
                  "tcp://HOST:PORT` on stdout once it listens, then logs on stderr.")


@click.command("worker", cls=RunCommand, epilog=_WORKER_EPILOG, context_settings={"show_default": True})
@click.option("--listen", required=True, metavar="tcp://HOST:PORT",
              help="Where coordinators connect (port 0: any free port). Anything but a loopback address needs --keys.")
@click.option("--keys", "keys_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="The cluster's keys folder: this machine's DIR/private/NAME.key_secret and everyone's "
                   "DIR/public/*.key. Only peers holding one of those public keys get in, and only the key named "
                   f"'{COORDINATOR}' (DIR/public/{COORDINATOR}.key, required) may start a run; the devices' keys "
                   "only send tensors between workers.")
@click.option("--name", "key_name", metavar="NAME", show_default="the only key in DIR/private",
              help="This machine's key (the device's name in cluster.yaml).")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False), metavar="DIR",
              show_default="$EDGEC_CACHE_DIR, else ~/.cache/edgec/fragments",
              help="Fragment files received, by sha256: a second run of the same build transfers nothing.")
@click.option("--cache-max-mb", type=click.IntRange(min=0), default=4096,
              help="Least recently used fragments are deleted past this size (never those of the last run).")
@click.option("--threads", type=click.IntRange(min=0, max=MAX_THREADS_HERE), default=0,
              help="onnxruntime intra-op threads, 0 for onnxruntime's default (all cores).")
@click.option("--data-port", type=click.IntRange(min=0, max=65535), default=0,
              help="Port for tensors from other devices (on the --listen host), 0 for any free one.")
@click.option("--max-buffer-mb", type=click.IntRange(min=1, max=MAX_BUFFER_MB), default=1024,
              help="Tensors held for later steps and requests, at most (a run needing more fails, naming this).")
@click.option("--max-message-mb", type=click.IntRange(min=1, max=MAX_BUFFER_MB), default=1024,
              help="Largest tensor accepted; a peer sending a larger message is disconnected.")
@click.option("--idle-timeout", type=Finite(min=1, max=MAX_IDLE_TIMEOUT_S), default=30.0,
              help="Seconds of silence from the coordinator after which its run is abandoned and the worker is free "
                   "for another coordinator: the longest a coordinator that claimed this worker and then went "
                   f"silent keeps it (coordinators send a ping every second); at most {MAX_IDLE_TIMEOUT_S:g}.")
@click.option("--once", is_flag=True, hidden=True, help="Exit after one run (local workers of `edgec run`).")
@click.option("--exit-with-parent", is_flag=True, hidden=True, help="Stop when the starting process dies.")
@click.option("--parent", "parent_pid", type=click.IntRange(min=1), hidden=True,
              help="With --exit-with-parent: the starting process's pid (if it is already gone, stop at once).")
@click.option("--keys-stdin", is_flag=True, hidden=True,
              help="Read this worker's keys as one line of JSON on stdin (local workers of `edgec run`, whose "
                   "keys live in memory only).")
@click.option("--data-host", hidden=True, help="Bind the data socket on this host instead of the --listen host.")
@click.option("-v", "--verbose", is_flag=True, help="Log every dropped message and connection detail.")
@click.pass_context
def worker(ctx: click.Context, listen, keys_dir, key_name, cache_dir, cache_max_mb, threads, data_port,
           max_buffer_mb, max_message_mb, idle_timeout, once, exit_with_parent, parent_pid, keys_stdin, data_host,
           verbose) -> None:
    """Serve runs for one device: fragments arrive from the coordinator of each run (kept in a cache), and
    the device's steps run for every request. One coordinator at a time; SIGTERM stops it cleanly."""
    with _worker_logging(verbose), interrupt_on_signals():
        parent = None
        if exit_with_parent:  # Ctrl-C reaches the whole process group: the coordinator decides when we stop
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            die_with_parent()
            parent = parent_pid or os.getppid()
            if os.getppid() != parent:  # it died before the death signal was armed
                ctx.exit(EXIT_OK)
        daemon, code, why = None, EXIT_OK, "stopped"
        try:
            if key_name and not keys_dir:
                raise InputError("--name NAME picks a key in the --keys folder; give --keys DIR too")
            if keys_stdin and keys_dir:
                raise InputError("--keys-stdin and --keys DIR: give one")
            endpoint = parse_endpoint(listen, "--listen", allow_any_port=True)
            keys = Keyring.load(keys_dir, key_name) if keys_dir else \
                Keyring.from_json(sys.stdin.buffer.readline(1 << 16)) if keys_stdin else None
            cache = FragmentCache(cache_dir or default_cache_dir(), cache_max_mb << 20)
            daemon = Daemon(endpoint, cache=cache, keys=keys, threads=threads, data_port=data_port,
                            data_host=data_host, max_buffer_bytes=max_buffer_mb << 20,
                            max_message_bytes=max_message_mb << 20, idle_timeout=idle_timeout, once=once,
                            parent=parent)
            daemon.serve()
        except EdgecRuntimeError as exc:
            click.echo(f"edgec: {exc}", err=True)
            code = exc.exit_code
        except Interrupted as exc:
            why = str(exc)
            logging.getLogger("edgec.runtime").info("%s: stopping", why)
        finally:
            if daemon is not None:
                daemon.stop(why)
    ctx.exit(code)


def _worker_logging(verbose: bool):
    """A worker's log, timestamped; every dropped message too with --verbose."""
    formatter = logging.Formatter("%(asctime)s edgec worker: %(levelname)s %(message)s", "%H:%M:%S")
    return runtime_log_to_stderr(formatter, logging.DEBUG if verbose else logging.INFO)


def worker_main(prog_name: str = "edgec worker") -> None:
    worker.main(prog_name=prog_name)


def main() -> None:
    worker_main(prog_name="python -m edgec.runtime.device.worker")


if __name__ == "__main__":
    main()
