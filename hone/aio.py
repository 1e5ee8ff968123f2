"""Run a coroutine to completion from synchronous code, whether or not an event loop is running."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, also from code that already runs a loop (a notebook, an async trainer): there the
    coroutine gets a fresh loop on a helper thread instead of failing."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
