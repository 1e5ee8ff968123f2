"""How a command ends on a signal: SIGINT and SIGTERM alike."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def signals_interrupt() -> Iterator[dict[str, int]]:
    """SIGINT and SIGTERM (a scheduler's or `kill`'s stop) both raise KeyboardInterrupt, so either ends a
    run the same way: one line saying where it stopped. The signal received is recorded for the exit code
    (128 + signal, the shell's convention)."""
    received: dict[str, int] = {}

    def interrupt(signum: int, _frame: object) -> None:
        received["signal"] = signum
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield received
        return
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
