"""The one batcher: lock-step flushes when every open episode waits, in slot order (what bit-identical
sampling rests on); window mode batches whatever arrives within its window."""

from __future__ import annotations

import asyncio
import threading
import time

from hone.rollout.base import GenerationInterrupted, GenerationRequest
from hone.rollout.batcher import Batcher
from hone.types import Rollout, SamplingParams
from tests.helpers import FixedSampler


def _echo(request: GenerationRequest, params: SamplingParams) -> list[Rollout]:
    return [
        Rollout(
            request.sample_id, request.group_id, [*request.prompt_ids, k], len(request.prompt_ids), [1], [0.0]
        )
        for k in range(params.n)
    ]


def test_lock_step_waits_for_every_open_episode_and_orders_requests_by_slot() -> None:
    sampler = FixedSampler(_echo)
    batcher = Batcher(sampler)  # type: ignore[arg-type]
    params = SamplingParams(n=2, seed=7)

    async def main() -> list[list[Rollout]]:
        slots = [batcher.open() for _ in range(3)]

        async def episode(slot: int, delay: float) -> list[Rollout]:
            await asyncio.sleep(delay)  # arrive out of slot order
            return await batcher.generate(GenerationRequest(f"s{slot}", slot, [slot]), params, slot)

        async def ends_early(slot: int) -> list[Rollout]:
            await asyncio.sleep(0.05)
            batcher.close(slot)  # an episode that ends without asking holds no batch back
            return []

        try:
            return await asyncio.gather(episode(slots[0], 0.03), episode(slots[1], 0.0), ends_early(slots[2]))
        finally:
            await batcher.aclose()

    first, second, _ = asyncio.run(main())
    [(requests, seen)] = sampler.calls  # one engine call, after every open episode asked or ended
    assert [r.sample_id for r in requests] == ["s0", "s1"] and seen == params
    assert [r.sample_id for r in first] == ["s0", "s0"] and [r.sample_id for r in second] == ["s1", "s1"]


def test_lock_step_calls_once_per_distinct_params_and_a_failing_call_fails_its_requests_only() -> None:
    def respond(request: GenerationRequest, params: SamplingParams) -> list[Rollout]:
        if params.seed == 13:
            raise RuntimeError("engine down")
        return _echo(request, params)

    sampler = FixedSampler(respond)
    batcher = Batcher(sampler)  # type: ignore[arg-type]

    async def main() -> list[object]:
        a, b = batcher.open(), batcher.open()
        try:
            return await asyncio.gather(
                batcher.generate(GenerationRequest("a", 0, [1]), SamplingParams(seed=1), a),
                batcher.generate(GenerationRequest("b", 1, [1]), SamplingParams(seed=13), b),
                return_exceptions=True,
            )
        finally:
            await batcher.aclose()

    ok, failed = asyncio.run(main())
    assert isinstance(ok, list) and ok[0].sample_id == "a"
    assert isinstance(failed, RuntimeError) and "engine down" in str(failed)


def test_window_mode_batches_what_arrives_together_and_seeds_each_call() -> None:
    sampler = FixedSampler(_echo)
    batcher = Batcher(sampler, window_s=0.05)  # type: ignore[arg-type]
    params = SamplingParams(seed=3, max_new_tokens=64)

    async def main() -> None:
        try:
            await asyncio.gather(
                *(
                    batcher.generate(GenerationRequest(f"e{i}", 0, [i], max_new_tokens=8 + i), params)
                    for i in range(4)
                )
            )
            await batcher.generate(GenerationRequest("late", 0, [9], max_new_tokens=4), params)
        finally:
            await batcher.aclose()

    asyncio.run(main())
    assert [len(requests) for requests, _ in sampler.calls] == [4, 1]
    (_, first), (_, second) = sampler.calls
    assert first.max_new_tokens == 11 and second.max_new_tokens == 4  # the call's longest request
    assert len({first.seed, second.seed, params.seed}) == 3  # each call seeded apart


class _SlowSampler:
    """A generate call that runs until interrupted (or 30 s), like a long engine call."""

    policy_version = 0
    eos_token_ids = frozenset({0})

    def __init__(self) -> None:
        self.started, self.stop = threading.Event(), threading.Event()
        self.thread: threading.Thread | None = None

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]:
        self.thread = threading.current_thread()
        self.started.set()
        if self.stop.wait(timeout=30):
            raise GenerationInterrupted("stopped")
        return []

    def interrupt(self) -> None:
        self.stop.set()

    def load_weights(self, state_dict: object, version: int) -> None: ...

    def close(self) -> None: ...


def test_closing_mid_call_interrupts_the_engine_and_joins_the_generation_thread() -> None:
    """What a Ctrl-C does: the episodes are cancelled while a generate call runs; `aclose` must end the
    call and the thread before returning (a thread inside torch at interpreter exit aborts the process)."""
    sampler = _SlowSampler()
    batcher = Batcher(sampler)  # type: ignore[arg-type]

    async def main() -> None:
        slot = batcher.open()
        request = GenerationRequest("s", 0, [1])
        episode = asyncio.ensure_future(batcher.generate(request, SamplingParams(), slot))
        while not sampler.started.is_set():
            await asyncio.sleep(0.01)
        episode.cancel()
        t0 = time.monotonic()
        await batcher.aclose()
        assert time.monotonic() - t0 < 5  # not the call's 30 s
        assert episode.cancelled()

    asyncio.run(main())
    assert sampler.stop.is_set() and sampler.thread is not None and not sampler.thread.is_alive()
