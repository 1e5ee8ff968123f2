"""Run coroutines from synchronous code: `run_coroutine`, and `run_serving` for episodes whose model calls
must run on the calling thread."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# How long an interrupted `run_serving` waits for its coroutine to unwind (its `finally` blocks) before
# leaving its thread behind.
_UNWIND_S = 10.0
_POLL_S = 0.1


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, also from code that already runs a loop (a notebook, an async trainer): there the
    coroutine gets a fresh loop on a helper thread instead of failing."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class CallerThread(Executor):
    """An executor whose calls run on the thread that called `run_serving`, one at a time, in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._closed:
            raise RuntimeError("submit after shutdown")
        future: Future[Any] = Future()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more calls. Never waits: the thread that runs them is the caller of `run_serving`."""
        self._closed = True

    def _serve(self) -> None:
        """Run calls until `_stop`. KeyboardInterrupt (Ctrl-C, SIGTERM) leaves at once, from inside a call
        too (torch code checks for signals between its Python lines)."""
        while True:
            try:
                # A bounded wait: a signal can land on any thread, and the main thread runs Python's
                # handlers (KeyboardInterrupt) only once it wakes.
                job = self._jobs.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if job is None:
                return
            future, call = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except Exception as e:  # handed to the waiting coroutine
                future.set_exception(e)
            except BaseException:
                future.set_exception(RuntimeError("interrupted"))
                raise
            else:
                future.set_result(result)

    def _stop(self) -> None:
        self._closed = True
        self._jobs.put(None)

    def _cancel_queued(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job[0].cancel()


def run_serving(make: Callable[[Executor], Coroutine[Any, Any, T]]) -> T:
    """Run `make(engine)` on an event loop in a helper thread while this thread runs every call the
    coroutine submits to `engine`; return its result or raise its error.

    Why this way round: torch work belongs on the thread that trains. Two threads taking turns at torch
    ops each keep an OpenMP thread team; with more team threads than cores libgomp stops spinning between
    parallel regions and every op pays a futex wake-up (measured: the demo's sampling 60 -> 87 ms a step
    when it moved to a helper thread, bench/README.md). The event loop, which only steps environments,
    tokenizes and awaits rewards, takes the helper thread instead. Ctrl-C and SIGTERM reach this thread
    (the main one) as before: the coroutine is cancelled and given `_UNWIND_S` to run its cleanup.
    """
    engine = CallerThread()
    outcome: list[tuple[bool, Any]] = []
    handles: dict[str, Any] = {}
    cancelled = threading.Event()

    async def main() -> T:
        handles["task"], handles["loop"] = asyncio.current_task(), asyncio.get_running_loop()  # "loop" last
        if cancelled.is_set():
            raise asyncio.CancelledError
        return await make(engine)

    def body() -> None:
        try:
            outcome.append((True, asyncio.run(main())))
        except BaseException as e:  # handed to the calling thread
            outcome.append((False, e))
        finally:
            engine._stop()

    thread = threading.Thread(target=body, name="hone-episodes", daemon=True)
    thread.start()
    try:
        engine._serve()
    except BaseException:
        cancelled.set()
        engine._closed = True
        engine._cancel_queued()
        if "loop" in handles:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to cancel
                handles["loop"].call_soon_threadsafe(handles["task"].cancel)
        thread.join(timeout=_UNWIND_S)
        raise
    thread.join()
    ok, value = outcome[0]
    if ok:
        return value
    raise value
