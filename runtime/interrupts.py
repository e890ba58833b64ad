"""SIGTERM and SIGINT as an exception that unwinds through every cleanup, and raised again at
checkpoints in case its first raise was swallowed."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

__all__ = ["Interrupted", "interrupt_on_signals", "check_interrupted"]


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived: unwinds like KeyboardInterrupt (every `finally` and context manager
    cleans up), and is no Exception, so no `except Exception` swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}"


_pending: list[int] = []  # signals received inside interrupt_on_signals, first first


def check_interrupted() -> None:
    """Raise Interrupted if a signal arrived. Python runs a signal handler at the next bytecode of the
    main thread, and when that bytecode belongs to a `__del__` or a weakref callback (the garbage
    collector freeing an onnxruntime session, say) the handler's exception is only reported, not raised:
    long-running work calls this between its steps so that such a signal still stops it."""
    if _pending:
        raise Interrupted(_pending[0])


@contextlib.contextmanager
def interrupt_on_signals():
    """Within: SIGTERM and SIGINT raise Interrupted (in the main thread; elsewhere signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        _pending.append(signum)
        raise Interrupted(signum)

    def unraisable(info, default=sys.unraisablehook):
        if not isinstance(info.exc_value, Interrupted):  # a swallowed interrupt: check_interrupted raises it
            default(info)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)  # None: a handler set outside Python
        sys.unraisablehook = previous_hook
        _pending.clear()
