"""The in-process executors of the rollout source (`rollouts.Executor`): inline and threads(k).

`InlineExecutor` produces a share when its result is asked for, in the caller's thread: with η = 0 that
is synchronous training, `learn(produce(step))`. `ThreadExecutor` runs k producers in threads, each with
its own sampler (its own copy of the weights) and the channel that feeds it: the sampler and the reward
release the GIL in torch and I/O, and a thread shares the sampler's weights with the channel's in-process
copy (a process would need the Ray executor's transport). The Ray executor is `ray_executor.RayExecutor`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence

from hone.rl.placement.source import produce_with_retries
from hone.rl.placement.weights import WeightChannel
from hone.rl.producer import Producer, PromptBatch, ScoredGroups

# How often a blocked `result` looks up from its wait: Ctrl-C reaches the main thread only between waits.
_POLL_S = 0.1
# How long `close` waits for a producer to finish the share it is on before leaving it (a daemon) behind.
_CLOSE_S = 10.0


class _Deferred:
    """A share produced when its result is asked for."""

    def __init__(self, produce: Callable[[], ScoredGroups]) -> None:
        self._produce = produce

    def result(self) -> ScoredGroups:
        return self._produce()

    def peek(self) -> ScoredGroups | None:
        return None


class InlineExecutor:
    """One producer, run inside `Pending.result()` in the caller's thread with the sampler's weights held
    for the whole share: every rollout of a step comes from the one version published before it."""

    inline = True

    def __init__(self, producer: Producer, weights: WeightChannel, *, retries: int = 0) -> None:
        self.producer, self.weights, self.retries = producer, weights, retries

    @property
    def width(self) -> int:
        return 1

    def submit(self, k: int, prompts: PromptBatch) -> _Deferred:
        return _Deferred(
            lambda: produce_with_retries(self.producer, prompts, self.retries, hold=self.weights.hold)
        )

    def publish(self, version: int) -> None:
        self.weights.publish(version)

    def idle_s(self) -> float | None:
        return None

    def close(self) -> None:
        pass


class _Queued:
    def __init__(self, executor: ThreadExecutor, k: int, step: int) -> None:
        self._executor, self._key = executor, (k, step)

    def result(self) -> ScoredGroups:
        return self._executor._wait(self._key)

    def peek(self) -> ScoredGroups | None:
        item = self._executor._done.get(self._key)
        return item if isinstance(item, ScoredGroups) else None


class ThreadExecutor:
    """Producers in background threads while the learner trains (`cluster.mode: async`).

    Producer k (a producer and the weight channel feeding its sampler: `workers[k]`) produces the shares
    submitted to it in order, each with its sampler's weights held (`WeightChannel.hold`), so every
    rollout of a share comes from one version; a publish made meanwhile does not wait for the share to
    end (the learner trains on) but lands as that producer starts its next share. A share whose producing
    raises past its retries ends that producer, and the share's `result` raises the error, so the run
    stops with its one line instead of hanging; so does a publish the producer does not take within the
    channel's timeout (`WeightChannel.raise_if_overdue`).
    """

    inline = False

    def __init__(
        self,
        workers: Sequence[tuple[Producer, WeightChannel]],
        *,
        retries: int = 0,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._workers = list(workers)
        self._on_close = on_close  # stops what the producers beyond the first own (their engines)
        self.retries = retries
        self._stopping = threading.Event()
        self._todo: list[queue.Queue[PromptBatch | None]] = [queue.Queue() for _ in self._workers]
        self._done: dict[tuple[int, int], ScoredGroups | BaseException] = {}
        self._ready = threading.Condition()
        self._idle_s = 0.0  # summed over producers
        self._threads = [
            threading.Thread(target=self._produce_all, args=(k,), name=f"hone-producer-{k}", daemon=True)
            for k in range(len(self._workers))
        ]
        for thread in self._threads:
            thread.start()

    @property
    def width(self) -> int:
        return len(self._workers)

    def _produce_all(self, k: int) -> None:
        producer, weights = self._workers[k]
        while True:
            waited = time.perf_counter()
            prompts = self._todo[k].get()
            with self._ready:
                self._idle_s += time.perf_counter() - waited
            if prompts is None:
                return
            try:
                result: ScoredGroups | BaseException = produce_with_retries(
                    producer, prompts, self.retries, hold=weights.hold, stopping=self._stopping
                )
            except BaseException as e:  # handed to the learner's thread, which raises it
                result = e
            with self._ready:
                self._done[(k, prompts.step)] = result
                self._ready.notify_all()
            if isinstance(result, BaseException):
                return

    def submit(self, k: int, prompts: PromptBatch) -> _Queued:
        self._todo[k].put(prompts)
        return _Queued(self, k, prompts.step)

    def _wait(self, key: tuple[int, int]) -> ScoredGroups:
        with self._ready:
            while key not in self._done:
                self._ready.wait(timeout=_POLL_S)
                for _, weights in self._workers:
                    weights.raise_if_overdue()  # a producer wedged inside its share: a line, not a hang
                if key not in self._done and not self._threads[key[0]].is_alive():
                    raise RuntimeError(f"producer thread {key[0]} stopped without a result")
            item = self._done.pop(key)
        if isinstance(item, BaseException):
            raise item
        return item

    def publish(self, version: int) -> None:
        for _, weights in self._workers:
            weights.publish(version)

    def idle_s(self) -> float | None:
        with self._ready:
            return self._idle_s

    def close(self) -> None:
        """Stop the producers without retrying their shares: a generate call running now is interrupted
        where the engine allows it (`Interruptible`), and the threads are waited for at most `_CLOSE_S`
        (daemons beyond that)."""
        self._stopping.set()
        for producer, _ in self._workers:
            producer.interrupt()
        for todo in self._todo:
            while not todo.empty():
                try:
                    todo.get_nowait()
                except queue.Empty:
                    break
            todo.put(None)
        deadline = time.monotonic() + _CLOSE_S
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._on_close is not None:
            self._on_close()
