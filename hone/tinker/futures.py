"""Futures, as the Tinker service hands them out: a request returns its id at once and its work runs later,
one request at a time, on one worker thread; `/api/v1/retrieve_future` asks for the result.

Why one worker: every request touches the one copy of the base model (a training client's forward/backward,
an optimizer step, a sampler's generation switch its adapter in), so running them one after another is
what keeps each client's requests in the order it sent them and their results exact. Requests wait in a
FIFO queue: a training client sends its next request only once the server has accepted the previous one
(the SDK's "turns"), so arrival order is its program order.

A retrieve long-polls: it waits up to `poll_s` for the result, then answers `try_again` (the SDK polls
again at once). The states the SDK sees: queued and running both read `try_again` with `queue_state:
active`; done is the result (JSON, or protobuf for forward/backward and sampling outputs); failed is
`{"error": ..., "category": "user" | "server"}`, which the SDK raises as `RequestFailedError`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from hone.errors import HoneError

log = logging.getLogger("hone")

State = Literal["queued", "running", "done", "failed", "cancelled"]


@dataclass
class Payload:
    """A finished request's result: a JSON object, or protobuf bytes (the types the SDK reads as proto)."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None


@dataclass
class _Entry:
    work: Callable[[], Payload]
    done: asyncio.Event
    kind: str
    state: State = "queued"
    result: Payload | None = None
    error: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Futures:
    """The request queue and its one worker thread. `submit` is called on the server's event loop (it makes
    the entry's `asyncio.Event` there); the worker sets the event through that loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, poll_s: float = 20.0) -> None:
        self._loop = loop
        self.poll_s = poll_s
        self._entries: dict[str, _Entry] = {}
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="hone-tinker-worker", daemon=True)
        self._thread.start()

    def submit(self, kind: str, work: Callable[[], Payload]) -> str:
        """Queue `work` (run on the worker thread); return the request id the SDK polls."""
        request_id = f"req-{next(self._ids)}-{kind}"
        self._entries[request_id] = _Entry(work, asyncio.Event(), kind)
        self._queue.put(request_id)
        return request_id

    def state(self, request_id: str) -> State | None:
        entry = self._entries.get(request_id)
        return None if entry is None else entry.state

    async def retrieve(self, request_id: str) -> tuple[int, Payload]:
        """(HTTP status, body) for a retrieve: the result, the failure, a `try_again` after `poll_s`, or 404
        for an id this server never gave (or gave before a restart)."""
        entry = self._entries.get(request_id)
        if entry is None:
            return 404, Payload({"detail": f"unknown request id {request_id!r} (was the server restarted?)"})
        if not entry.done.is_set():
            try:
                await asyncio.wait_for(entry.done.wait(), self.poll_s)
            except TimeoutError:
                return 200, Payload({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if entry.state == "done" and entry.result is not None:
            return 200, entry.result
        return 200, Payload(entry.error or {"error": "request cancelled", "category": "user"})

    def cancel(self, request_id: str) -> bool:
        """Cancel a request that has not started; a running or finished one is left as it is."""
        entry = self._entries.get(request_id)
        if entry is None or entry.state != "queued":
            return False
        entry.state = "cancelled"
        entry.error = {"error": f"request {request_id} was cancelled", "category": "user"}
        entry.done.set()
        return True

    def close(self) -> None:
        """Stop the worker after the request it is running (queued ones are dropped)."""
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while (request_id := self._queue.get()) is not None:
            entry = self._entries[request_id]
            if entry.state != "queued":
                continue
            entry.state = "running"
            try:
                entry.result, entry.state = entry.work(), "done"
            except HoneError as e:  # the request's own fault: one line, as the SDK's RequestFailedError
                entry.error, entry.state = {"error": _one_line(e), "category": "user"}, "failed"
            except Exception as e:
                log.exception("tinker request %s failed", request_id)
                entry.error = {"error": f"{type(e).__name__}: {_one_line(e)}", "category": "server"}
                entry.state = "failed"
            entry.work = _spent  # drop what the closure holds (a batch's tensors) once it has run
            self._loop.call_soon_threadsafe(entry.done.set)


def _spent() -> Payload:
    raise RuntimeError("a request's work ran twice")


def _one_line(e: BaseException) -> str:
    return "; ".join(part.strip() for part in str(e).splitlines() if part.strip()) or type(e).__name__
