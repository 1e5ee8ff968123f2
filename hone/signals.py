"""How a command ends on a signal: SIGINT and SIGTERM alike."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

# Signals received inside `signals_interrupt`, kept until it exits. The handler's KeyboardInterrupt can land
# where Python swallows exceptions (an object's `__del__` run by the garbage collector, a weakref callback:
# "Exception ignored in ..."); the training loops call `raise_if_signalled` at each step boundary so such a
# signal still ends the run, one step later.
_received: list[int] = []


@contextlib.contextmanager
def signals_interrupt() -> Iterator[dict[str, int]]:
    """SIGINT and SIGTERM (a scheduler's or `kill`'s stop) both raise KeyboardInterrupt, so either ends a
    run the same way: one line saying where it stopped. The signal received is recorded for the exit code
    (128 + signal, the shell's convention)."""
    received: dict[str, int] = {}

    def interrupt(signum: int, _frame: object) -> None:
        received["signal"] = signum
        _received.append(signum)
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield received
        return

    def unraisable(info: sys.UnraisableHookArgs) -> None:
        if info.exc_type is not KeyboardInterrupt:  # ours: `raise_if_signalled` raises it again
            previous_hook(info)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.unraisablehook = previous_hook
        _received.clear()


def raise_if_signalled() -> None:
    """Raise KeyboardInterrupt if a signal arrived whose own KeyboardInterrupt was swallowed."""
    if _received:
        raise KeyboardInterrupt
