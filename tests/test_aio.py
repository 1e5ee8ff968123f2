"""`run_serving`: a coroutine on a helper thread whose engine calls run on the calling thread."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Executor

import pytest

from hone.aio import run_serving


def test_engine_calls_run_on_the_calling_thread_and_the_result_comes_back() -> None:
    caller = threading.current_thread()
    seen: list[threading.Thread] = []

    def work(x: int) -> int:
        seen.append(threading.current_thread())
        return x * 2

    async def episodes(engine: Executor) -> list[int]:
        assert threading.current_thread() is not caller  # the event loop is elsewhere
        loop = asyncio.get_running_loop()
        return list(await asyncio.gather(*(loop.run_in_executor(engine, work, k) for k in range(3))))

    assert run_serving(episodes) == [0, 2, 4]
    assert seen == [caller] * 3


def test_an_engine_error_reaches_the_coroutine_and_its_error_reaches_the_caller() -> None:
    def failing() -> None:
        raise ValueError("engine down")

    async def episodes(engine: Executor) -> None:
        try:
            await asyncio.wrap_future(engine.submit(failing))
        except ValueError as e:
            raise RuntimeError(f"episode failed: {e}") from e

    with pytest.raises(RuntimeError, match="episode failed: engine down"):
        run_serving(episodes)


def test_ctrl_c_inside_an_engine_call_cancels_the_coroutine_and_runs_its_cleanup() -> None:
    """KeyboardInterrupt (what Ctrl-C and SIGTERM raise in the main thread) inside a call: the caller gets
    it, and the coroutine is cancelled and unwinds (its `finally` runs) before `run_serving` returns."""
    cleaned = threading.Event()

    def interrupted() -> None:
        raise KeyboardInterrupt

    async def episodes(engine: Executor) -> None:
        engine.submit(interrupted)
        try:
            await asyncio.sleep(30)  # only a cancellation ends this early
        finally:
            cleaned.set()

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_serving(episodes)
    assert cleaned.is_set() and time.monotonic() - t0 < 10
