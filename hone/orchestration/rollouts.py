"""The one interface producers and the learner talk through: submit prompts, take scored groups,
publish weights.

The loop drives training through it alone, so where the producers run is a choice of implementation:
`SyncRollouts` produces in the caller's thread when groups are taken (synchronous training is
`learn(produce(step))`); an asynchronous one produces ahead in a thread under a staleness bound; a Ray
one keeps producers in actors and publishes through the object store.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Protocol

from hone.orchestration.producer import Producer, PromptBatch, ScoredGroups
from hone.orchestration.weights import WeightChannel

# How often a blocked `take` looks up from its queue: Ctrl-C reaches the main thread only between waits.
_POLL_S = 0.1
# How long `close` waits for the producer to finish the step it is on before leaving it (a daemon) behind.
_CLOSE_S = 10.0


class RolloutSource(Protocol):
    """`submit` hands over the prompts of a step; `take` returns scored groups, oldest step first (it may
    block until they are done); `publish(version)` makes the learner's current weights that version on
    every producer; `close` stops producing (submitted steps not yet taken are dropped: a resumed run
    submits them again, and their prompts and seeds are functions of the step)."""

    def submit(self, prompts: PromptBatch) -> None: ...

    def take(self) -> ScoredGroups: ...

    def publish(self, version: int) -> None: ...

    def close(self) -> None: ...


class SyncRollouts:
    """Producing on `take`, in the caller's thread, with the sampler's weights held for the whole batch:
    every rollout of a step comes from the one version published before it."""

    def __init__(self, producer: Producer, weights: WeightChannel) -> None:
        self.producer = producer
        self.weights = weights
        self._submitted: deque[PromptBatch] = deque()

    def submit(self, prompts: PromptBatch) -> None:
        self._submitted.append(prompts)

    def take(self) -> ScoredGroups:
        if not self._submitted:
            raise RuntimeError("take() with no prompts submitted")
        prompts = self._submitted.popleft()
        with self.weights.hold():
            return self.producer.produce(prompts)

    def publish(self, version: int) -> None:
        self.weights.publish(version)

    def close(self) -> None:
        self._submitted.clear()


class AsyncRollouts:
    """Producing ahead in one background thread while the learner trains (`trainer.mode: async`).

    The producer takes submitted steps in order and produces each with the sampler's weights held
    (`WeightChannel.hold`), so every rollout of a step comes from one version and a publish lands between
    steps. How far ahead it runs is set by what the loop has submitted: AReaL's admission rule (a rollout
    may start only while accepted + running < (η + v + 1)·B) counted in whole steps of B groups, the loop
    submits step s only once the learner has finished s - η steps. A step is then sampled by a version at
    least s - η and trained at version s or less, so staleness (the learner's version when it trains,
    minus the rollout's) is at most η, and with η = 0 each step is produced after the previous update:
    synchronous training, in another thread. Work is never thrown away: the producer idles instead
    (`time/producer_idle_frac` is the throttled share). Threads, not processes: the sampler and the
    reward release the GIL in torch and I/O, and a thread shares the sampler's weights with the channel's
    in-process copy (a process would need the Ray-style transport).

    A producer error (sampler, reward, environment) ends the thread and is raised by the next `take`,
    with its own type, so the run stops with its one line instead of hanging.
    """

    def __init__(self, producer: Producer, weights: WeightChannel) -> None:
        self.producer = producer
        self.weights = weights
        self._todo: queue.Queue[PromptBatch | None] = queue.Queue()
        self._done: queue.Queue[ScoredGroups | BaseException] = queue.Queue()
        self._producer_idle_s = 0.0
        self._last_take = time.perf_counter()
        self._idle_at_last_take = 0.0
        self._thread = threading.Thread(target=self._produce_all, name="hone-producer", daemon=True)
        self._thread.start()

    def _produce_all(self) -> None:
        while True:
            waited = time.perf_counter()
            prompts = self._todo.get()
            self._producer_idle_s += time.perf_counter() - waited
            if prompts is None:
                return
            try:
                with self.weights.hold():
                    groups = self.producer.produce(prompts)
            except BaseException as e:  # handed to the learner's thread, which raises it
                self._done.put(e)
                return
            self._done.put(groups)

    def submit(self, prompts: PromptBatch) -> None:
        self._todo.put(prompts)

    def take(self) -> ScoredGroups:
        """The oldest submitted step's groups (blocking), with staleness, buffer and idle metrics."""
        waited = time.perf_counter()
        while True:
            try:
                item = self._done.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._done.empty():
                    raise RuntimeError("the producer thread stopped without a result") from None
        now = time.perf_counter()
        if isinstance(item, BaseException):
            raise item
        since = max(now - self._last_take, 1e-9)
        idle = self._producer_idle_s - self._idle_at_last_take
        self._last_take, self._idle_at_last_take = now, self._producer_idle_s
        lags = [self.weights.version - r.policy_version for r in item.rollouts] or [0]
        item.metrics |= {
            "staleness/mean": sum(lags) / len(lags),
            "staleness/max": float(max(lags)),
            "buffer/groups": float(sum(_groups(g) for g in list(self._done.queue))),
            "time/learner_idle_frac": (now - waited) / since,
            "time/producer_idle_frac": min(idle / since, 1.0),
        }
        return item

    def publish(self, version: int) -> None:
        self.weights.publish(version)

    def close(self) -> None:
        """Stop the producer after the step it is on (it is a daemon: an interrupted run does not wait)."""
        while not self._todo.empty():
            try:
                self._todo.get_nowait()
            except queue.Empty:
                break
        self._todo.put(None)
        self._thread.join(timeout=_CLOSE_S)


def _groups(item: ScoredGroups | BaseException) -> int:
    """How many groups (prompts) a finished step holds after its filters."""
    return 0 if isinstance(item, BaseException) else len({r.group_id for r in item.rollouts})
