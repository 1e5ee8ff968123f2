"""The one batcher between episodes and a synchronous `Sampler.generate`.

Episodes are coroutines that each ask for one request at a time (`await batcher.generate(request,
params)`); the engine wants large batches. The batcher collects the requests and hands them to
`Sampler.generate` on one daemon generation thread (the event loop stays free: environments step and
rewards score while the engine samples), in one of two flush modes:

* lock-step (`window_s=None`): flush when every open episode is waiting for the model. With the
  episodes of one produce call this is exactly today's batch: all prompts of a single-turn step in one
  call, all live episodes' turn in one call per turn. Requests are ordered by their episode's slot (the
  order the episodes were opened), never by arrival, and grouped by their `SamplingParams` (equal
  params: one call), so the engine sees the same calls, in the same order, with the same seeds, as a
  hand-written loop over the same episodes. Bit-identical sampling rests on this.
* window (`window_s` seconds): for agent programs behind the HTTP endpoint, whose requests arrive at
  arbitrary times and whose episode count the batcher does not know: collect for `window_s` after the
  first request (at most `max_batch`), then one call per distinct sampling setting, each seeded by its
  call number (`derive_seed(seed, "endpoint-call", k)`), since arrival order is not reproducible anyway.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from typing import Any

from hone.aio import CallerThread
from hone.rollout.base import GenerationRequest, Interruptible, Sampler
from hone.seeding import derive_seed
from hone.types import Rollout, SamplingParams


@dataclass
class _Pending:
    slot: int
    request: GenerationRequest
    params: SamplingParams
    future: asyncio.Future[list[Rollout]]


class DaemonThread(CallerThread):
    """A `CallerThread` served by a daemon thread of its own: the batcher's pool when it is given none (a
    caller already inside an event loop). Daemon, unlike a `ThreadPoolExecutor`'s (joined at exit without
    a bound): `shutdown` waits for a running call at most `join_s`, so a call that cannot be interrupted
    never holds up Ctrl-C for longer."""

    def __init__(self, name: str = "hone-generate", *, join_s: float = 10.0) -> None:
        super().__init__()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.join_s = join_s

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        if self._thread.ident is None:  # started by the first call
            self._thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Run no more calls (queued ones too, with `cancel_futures`); with `wait`, join the thread for at
        most `join_s` seconds."""
        if cancel_futures:
            self._cancel_queued()
        self._stop()
        if wait and self._thread.ident is not None:
            self._thread.join(timeout=self.join_s)


def _params_key(params: SamplingParams, *, with_cap: bool) -> tuple[Any, ...]:
    key = (params.n, params.temperature, params.top_p, params.top_k, tuple(params.stop), params.seed)
    return (*key, params.max_new_tokens) if with_cap else key


class Batcher:
    """Queue requests from many episode coroutines (on one event loop) into batched `generate` calls.

    Lock-step mode counts open episodes: `open()` returns a slot and `close(slot)` ends it (an episode
    that ends must close, or the others would wait for it forever). Window mode needs neither."""

    def __init__(
        self,
        sampler: Sampler,
        *,
        window_s: float | None = None,
        max_batch: int = 256,
        pool: Executor | None = None,
    ) -> None:
        self.sampler = sampler
        self.window_s, self.max_batch = window_s, max_batch
        self._own_pool = pool is None
        self._pool = pool or DaemonThread()
        self._open: set[int] = set()
        self._parked: set[int] = set()  # open, but waiting on other episodes (`park`)
        self._next_slot = 0
        self._pending: list[_Pending] = []
        self._calls = 0  # window mode: generate calls so far, for their seeds
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight: Future[list[Rollout]] | None = None  # the generate call running or queued now

    # --- episodes ---

    def open(self) -> int:
        """Register an episode (lock-step mode); returns its slot, the order its requests are batched in."""
        slot = self._next_slot
        self._next_slot += 1
        self._open.add(slot)
        return slot

    def close(self, slot: int) -> None:
        """The episode in `slot` will ask for nothing more (it may have ended on an error)."""
        self._open.discard(slot)
        self._parked.discard(slot)
        self._poke()

    def park(self, slot: int) -> None:
        """The episode in `slot` waits on the others (for a server session one of them holds): lock-step
        batches go on without it until `unpark`, or the wait would never end."""
        if slot in self._open:
            self._open.discard(slot)
            self._parked.add(slot)
            self._poke()

    def unpark(self, slot: int) -> None:
        """The episode in `slot` is back: the next lock-step batch waits for its request again."""
        if slot in self._parked:
            self._parked.discard(slot)
            self._open.add(slot)

    async def generate(
        self, request: GenerationRequest, params: SamplingParams, slot: int = -1
    ) -> list[Rollout]:
        """`params.n` rollouts of `request`, sampled in a batch with the other episodes' requests."""
        loop = asyncio.get_running_loop()
        self._ensure_running(loop)
        future: asyncio.Future[list[Rollout]] = loop.create_future()
        self._pending.append(_Pending(slot, request, params, future))
        self._poke()
        return await future

    async def aclose(self) -> None:
        """Stop the batching task (queued requests are cancelled) and a generate call still running (an
        `Interruptible` sampler stops it); shut the generation thread if owned, waiting for it briefly
        (`DaemonThread.join_s`): a thread left inside torch as the interpreter exits aborts the process."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for p in self._pending:
            if not p.future.done():
                p.future.cancel()
        self._pending.clear()
        call, self._in_flight = self._in_flight, None
        running = call is not None and not call.cancel() and not call.done()  # cancel() fails once it runs
        if running and isinstance(self.sampler, Interruptible):
            self.sampler.interrupt()
        if self._own_pool:
            self._pool.shutdown(wait=True)

    # --- the batching task ---

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _ensure_running(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._task is None or self._task.get_loop() is not loop or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())

    def _ready(self) -> bool:
        if not self._pending:
            return False
        if self.window_s is not None:
            return True
        # Lock-step: every open episode waits (a request from an unregistered slot never holds a batch).
        waiting = {p.slot for p in self._pending}
        return self._open <= waiting

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            while not self._ready():
                self._wake.clear()
                await self._wake.wait()
            if self.window_s is None:
                batch = sorted(self._pending, key=lambda p: p.slot)
                self._pending = []
                await self._lock_step(batch)
            else:
                await asyncio.sleep(self.window_s)
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                await self._windowed(batch)

    async def _lock_step(self, batch: list[_Pending]) -> None:
        groups: dict[tuple[Any, ...], list[_Pending]] = {}
        for p in batch:
            groups.setdefault(_params_key(p.params, with_cap=True), []).append(p)
        for items in groups.values():
            await self._call(items, items[0].params)

    async def _windowed(self, batch: list[_Pending]) -> None:
        groups: dict[tuple[Any, ...], list[_Pending]] = {}
        for p in batch:
            groups.setdefault(_params_key(p.params, with_cap=False), []).append(p)
        for items in groups.values():
            self._calls += 1
            first = items[0].params
            params = replace(
                first,
                max_new_tokens=max(p.request.max_new_tokens or 1 for p in items),
                seed=None if first.seed is None else derive_seed(first.seed, "endpoint-call", self._calls),
            )
            await self._call(items, params)

    async def _call(self, items: list[_Pending], params: SamplingParams) -> None:
        requests = [p.request for p in items]
        self._in_flight = call = self._pool.submit(self.sampler.generate, requests, params)
        try:
            outs = await asyncio.wrap_future(call)  # cancelled (aclose): `_in_flight` stays for aclose
        except Exception as e:  # every request of the call fails with the sampler's error; other calls go on
            self._in_flight = None
            for p in items:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        self._in_flight = None
        n = params.n
        for k, p in enumerate(items):
            if not p.future.done():
                p.future.set_result(outs[k * n : (k + 1) * n])
