"""Local workers forked from a warm process (a zygote) instead of started from scratch.

A local worker (`python -m edgec.runtime.device.worker`) spends about 0.3 s of CPU importing onnxruntime,
numpy and pyzmq before it does anything, once per worker per run: on a 2-core board starting four workers,
more than a second. The zygote pays it once per coordinator process: started the first time a local worker is
needed, it imports the worker's modules, then forks one child per worker, which runs the worker's command with
the argv, environment, working directory and standard streams the coordinator gives it. What the coordinator
holds for each child (Child) answers as the subprocess.Popen it replaces: pid, stdin, stdout, poll(), wait(),
send_signal(), terminate(), kill().

Lifetimes: the zygote reads its requests from a Unix socket whose other end only the coordinator process holds
(not inherited by its other children). When that process ends, however it ends, the zygote reads the end of
the socket and exits; each child, whose parent-death signal is armed on the zygote (worker --exit-with-parent
--parent ZYGOTE), then stops as a worker stops on SIGTERM. The zygote reaps its children and reports each exit
code on the socket. The coordinator signals a child through a pidfd opened right after the fork, so a pid the
system has handed to another process since is never signalled.

Environment: the variables read while onnxruntime and numpy load (thread pools, allocators, search paths:
IMPORT_TIME_ENV) cannot change in a forked child, so each set of their values has a zygote of its own.

On the socket, requests and reports are msgpack; the child's standard streams pass as file descriptors
(SCM_RIGHTS). Where a zygote cannot work (no pidfd: Linux before 5.3, other systems), `available()` is False
and local workers start as processes of their own (coordinator/connect.py)."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import msgpack

__all__ = ["available", "spawn", "Child", "IMPORT_TIME_ENV", "zygote_pids"]

# Prefixes of the environment variables read when the zygote imports onnxruntime, numpy and pyzmq.
IMPORT_TIME_ENV = ("OMP_", "OPENBLAS_", "GOTO", "MKL_", "KMP_", "ORT_", "ONNXRUNTIME", "PYTHON", "LD_", "MALLOC_",
                   "NUMPY", "ZMQ", "VIRTUAL_ENV")
_MAX_MESSAGE = 1 << 20  # a request: an argv and an environment
_STREAMS = 3  # stdin, stdout, stderr


def _packb(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpackb(data: bytes):
    return msgpack.unpackb(data, raw=False, strict_map_key=True)


def available() -> bool:
    """Whether local workers can be forked from a zygote on this system."""
    if sys.platform != "linux" or not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds") \
            or not hasattr(signal, "pidfd_send_signal"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel before 5.3, or a seccomp filter
        return False
    return True


# -- the zygote process ------------------------------------------------------------------------------------
def _serve(sock: socket.socket) -> None:
    """Fork a worker per request until the coordinator's end of `sock` closes; report every exit."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD wakes select() via wake_w
    me = os.getpid()
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 4096):
                        break
                except BlockingIOError:
                    break
        _reap(sock)
        if sock not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, _STREAMS)
        except OSError:
            return
        if not data:
            return  # the coordinator's process ended
        try:
            if len(fds) != _STREAMS:
                raise ValueError(f"expected {_STREAMS} file descriptors, got {len(fds)}")
            request = _unpackb(data)
            pid = os.fork()
            if pid == 0:
                _child(request, fds, sock, (wake_r, wake_w), me)
            reply = {"spawned": pid}
        except Exception as exc:  # noqa: BLE001 - the coordinator raises it as its own error
            reply = {"refused": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(_packb(reply))


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(_packb({"exit": pid, "code": os.waitstatus_to_exitcode(status)}))


def _child(request: dict, fds: list[int], sock: socket.socket, wake: tuple[int, int], zygote: int) -> None:
    """In the forked child: become the worker `request` describes; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for fd in wake:
            os.close(fd)
        if request["setsid"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from .worker import worker
        argv = [*request["argv"], "--parent", str(zygote)]
        sys.argv = ["edgec worker", *argv]
        worker.main(args=argv, prog_name="edgec worker", standalone_mode=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:  # noqa: BLE001 - the worker's log (stderr) tells the coordinator why
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: nothing more can be said
                pass
        os._exit(code)


def main() -> None:
    """`python -m edgec.runtime.device.zygote FD`: FD is the socket to the coordinator."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    from . import worker  # noqa: F401 - the imports every child would otherwise pay for
    _serve(sock)


# -- the coordinator's side ----------------------------------------------------------------------------------
class _Zygote:
    """A running zygote: its socket, and the exit codes it has reported."""

    def __init__(self, timeout: float):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        try:
            # A session of its own, as the workers: Ctrl-C in a terminal reaches the coordinator alone.
            self.proc = subprocess.Popen([sys.executable, "-m", "edgec.runtime.device.zygote", str(theirs.fileno())],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True)
        finally:
            theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}
        self.ended = False

    def spawn(self, argv: list[str], fds: tuple[int, int, int], setsid: bool, timeout: float) -> int:
        request = _packb({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "setsid": setsid})
        deadline = time.monotonic() + timeout
        with self.lock:
            try:
                socket.send_fds(self.sock, [request], list(fds))
            except OSError as exc:
                self.ended = True
                raise OSError(f"the local workers' zygote is gone ({exc}){self._why()}") from None
            while True:
                msg = self._next(deadline)
                if msg is None:
                    raise OSError(f"the local workers' zygote did not answer in {timeout:g} s{self._why()}")
                if "spawned" in msg:
                    return msg["spawned"]
                if "refused" in msg:
                    raise OSError(f"the local workers' zygote could not fork: {msg['refused']}")

    def exit_code(self, pid: int, deadline: float | None = None) -> int | None:
        """pid's exit code if the zygote reported it (waiting until `deadline` for it, if given)."""
        with self.lock:
            while pid not in self.exits and not self.ended:
                if self._next(time.monotonic() if deadline is None else deadline) is None:
                    break
            return self.exits.get(pid)

    def _next(self, deadline: float) -> dict | None:
        """The zygote's next message (an exit report is also kept in `exits`), or None at the deadline or its
        end; the caller holds the lock."""
        while not self.ended:
            remaining = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], remaining)
            if not ready:
                return None
            data = self.sock.recv(_MAX_MESSAGE)
            if not data:
                self.ended = True
                return None
            msg = _unpackb(data)
            if "exit" in msg:
                self.exits[msg["exit"]] = msg["code"]
            return msg
        return None

    def _why(self) -> str:
        try:
            self.log.seek(0)
            lines = [ln for ln in self.log.read()[-2000:].decode(errors="replace").splitlines() if ln.strip()]
        except (OSError, ValueError):
            return ""
        return f": {lines[-1]}" if lines else ""


_zygotes: dict[tuple, _Zygote] = {}
_zygotes_lock = threading.Lock()


def _environment_key() -> tuple:
    return (os.getpid(), sys.executable,
            tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(IMPORT_TIME_ENV))))


def _zygote(timeout: float) -> _Zygote:
    key = _environment_key()
    with _zygotes_lock:
        z = _zygotes.get(key)
        if z is None or z.ended or z.proc.poll() is not None:
            z = _zygotes[key] = _Zygote(timeout)
        return z


def zygote_pids() -> list[int]:
    """The pids of this process's running zygotes (their CPU time, reaped workers' included, is this process's
    work: runtime/profile/load.py)."""
    with _zygotes_lock:
        return [z.proc.pid for k, z in _zygotes.items() if k[0] == os.getpid() and z.proc.poll() is None]


class Child:
    """A worker forked by a zygote, with the part of subprocess.Popen's interface the coordinator uses."""

    def __init__(self, zygote: _Zygote, pid: int, stdin, stdout):
        self.zygote, self.pid, self.stdin, self.stdout = zygote, pid, stdin, stdout
        self.returncode: int | None = None
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # already exited and reaped: its exit report is on the socket
            self.pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._ended(self.zygote.exit_code(self.pid))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            step = time.monotonic() + 0.5 if deadline is None else deadline
            self._ended(self.zygote.exit_code(self.pid, step))
            if self.returncode is None and deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"local worker {self.pid}", timeout)
        return self.returncode

    def _ended(self, code: int | None) -> None:
        if code is None and self.zygote.ended and not self._alive():
            code = -signal.SIGTERM  # the zygote died first: its parent-death signal stopped the worker
        if code is not None:
            self.returncode = code
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None

    def _alive(self) -> bool:
        if self.pidfd is None:
            return False
        ready, _, _ = select.select([self.pidfd], [], [], 0)
        return not ready

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        if getattr(self, "pidfd", None) is not None:
            os.close(self.pidfd)


def spawn(argv: list[str], *, keys: bytes | None, stderr, timeout: float) -> Child:
    """A worker running `edgec worker ARGV` (with --exit-with-parent; the zygote adds --parent), its stdout a
    pipe to read, its stderr the file `stderr`, and `keys` (one line) on its stdin if given, else no stdin."""
    z = _zygote(timeout)
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe() if keys is not None else (os.open(os.devnull, os.O_RDONLY), None)
    try:
        pid = z.spawn(argv, (in_r, out_w, stderr.fileno()), True, timeout)
    except BaseException:
        for fd in (out_r, in_w):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(in_r)
    stdin = None
    if in_w is not None:
        stdin = os.fdopen(in_w, "wb")
        try:  # one line, far below a pipe's buffer: never blocks
            stdin.write(keys)
            stdin.close()
        except OSError:  # the worker already exited: its exit code and log say why
            pass
    return Child(z, pid, stdin, os.fdopen(out_r, "rb"))


if __name__ == "__main__":
    main()
