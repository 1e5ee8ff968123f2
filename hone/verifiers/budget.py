"""How long a verifier may spend on its own work in the reward call running now.

The scorer (`hone.rewards.scoring`) marks each reward call with its deadline (`call_deadline`); a
verifier that can tell its own slowness apart (math-verify blowing up in sympy, tests that hang) asks
`own_time_budget` and stops in time to score the response instead of timing out. Here, below both
rewards and envs, so that a verifier is the same function wherever it is called from.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar

# When the scorer gives up on the reward call running in this context (time.monotonic()), if any.
_CALL_DEADLINE: ContextVar[float | None] = ContextVar("hone_reward_call_deadline", default=None)
# The share of a call's remaining time a verifier may spend on its own work; the rest covers what
# happens around it (starting and cleaning up each sandboxed program, delivering a timeout).
_OWN_SHARE = 0.85


@contextlib.contextmanager
def call_deadline(timeout_s: float) -> Iterator[None]:
    """Mark the reward call made inside as abandoned after `timeout_s` (the scorer's per-call timeout)."""
    token = _CALL_DEADLINE.set(time.monotonic() + timeout_s)
    try:
        yield
    finally:
        _CALL_DEADLINE.reset(token)


def own_time_budget(cap: float | None = None) -> float | None:
    """Seconds a verifier may spend on its own work in the reward call running now: `cap`, or less when
    the scorer's timeout for the call is nearer; None when neither limits it.

    Why: a call that times out is excluded from training (an infrastructure failure is not a wrong
    answer), so a response that makes its own verification slow (tests that hang, an answer that sends
    sympy into a blow-up) would escape a grade. A verifier that can tell its own slowness apart stops
    within this budget and scores the response instead.
    """
    deadline = _CALL_DEADLINE.get()
    if deadline is None:
        return cap
    left = max(0.0, deadline - time.monotonic()) * _OWN_SHARE
    return left if cap is None else min(cap, left)


class CompareTimeout(BaseException):
    """Raised into a thread whose work outlived its `deadline`. A BaseException, as math-verify's
    own: sympy's and math-verify's `except Exception` clauses must not swallow it."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise `CompareTimeout` in this thread if the block is still running after `seconds`."""
    thread = threading.get_ident()
    lock = threading.Lock()
    armed = [True]

    def fire() -> None:
        with lock:
            if armed[0]:
                _raise_in(thread, CompareTimeout)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:  # after this no exception can be raised into the thread, and none is pending
            armed[0] = False
            _raise_in(thread, None)


def _raise_in(thread: int, exception: type[BaseException] | None) -> None:
    """Have `thread` raise `exception` at its next bytecode (None withdraws one not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread), None if exception is None else ctypes.py_object(exception)
    )
