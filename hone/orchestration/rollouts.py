"""The one interface producers and the learner talk through: submit prompts, take scored groups,
publish weights.

The loop drives training through it alone, so where the producers run is a choice of implementation:
`SyncRollouts` produces in the caller's thread when groups are taken (synchronous training is
`learn(produce(step))`); an asynchronous one produces ahead in a thread under a staleness bound; a Ray
one keeps producers in actors and publishes through the object store.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Protocol

from hone.orchestration.producer import Producer, PromptBatch, ScoredGroups
from hone.orchestration.weights import WeightChannel
from hone.rewards.scoring import RewardOutageError

log = logging.getLogger("hone")

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


class ProducerError(RuntimeError):
    """A step's producing raised on every attempt (`trainer.producer_retries` + 1); the message is one
    line naming the step and the last error."""


# Deliberate stops, not faults: producing the step again would only repeat them.
_NOT_RETRIED = (RewardOutageError,)


def produce_with_retries(
    producer: Producer,
    weights: WeightChannel,
    prompts: PromptBatch,
    retries: int,
    stopping: threading.Event | None = None,
) -> ScoredGroups:
    """`producer.produce(prompts)` with the sampler's weights held, produced again up to `retries` times
    when it raises (a sampler, reward or environment fault: a judge's HTTP 502, a dead sandbox). The hold
    spans every attempt, so a retry samples the same prompts with the same seed (both functions of the
    step) and the same weights as the attempt that failed: a fault that passes leaves the run as if it
    had never happened. The step's `faults/producer_retries` counts its failed attempts. KeyboardInterrupt
    and SystemExit (not `Exception`s) and a reward outage (a deliberate stop) are never retried, nor is
    anything once `stopping` is set (the run is closing); the last failure raises `ProducerError`."""
    failed = 0
    with weights.hold():
        while True:
            try:
                groups = producer.produce(prompts)
            except _NOT_RETRIED:
                raise
            except Exception as e:
                failed += 1
                error = " ".join(f"{type(e).__name__}: {e}".split())  # one line, whatever the message
                if failed > retries or (stopping is not None and stopping.is_set()):
                    attempts = f"{failed} attempt{'s' if failed > 1 else ''}"
                    raise ProducerError(
                        f"stopped at RL step {prompts.step + 1}: producing its rollouts failed on "
                        f"{attempts} (trainer.producer_retries={retries}); last error: {error}"
                    ) from e
                log.warning(
                    "RL step %d: producing its rollouts failed (%s); producing it again (retry %d of %d)",
                    prompts.step + 1,
                    error,
                    failed,
                    retries,
                )
            else:
                groups.metrics["faults/producer_retries"] = float(failed)
                return groups


class SyncRollouts:
    """Producing on `take`, in the caller's thread, with the sampler's weights held for the whole batch:
    every rollout of a step comes from the one version published before it. A step that raises is
    produced again up to `retries` times (`produce_with_retries`)."""

    def __init__(self, producer: Producer, weights: WeightChannel, *, retries: int = 0) -> None:
        self.producer = producer
        self.weights = weights
        self.retries = retries
        self._submitted: deque[PromptBatch] = deque()

    def submit(self, prompts: PromptBatch) -> None:
        self._submitted.append(prompts)

    def take(self) -> ScoredGroups:
        if not self._submitted:
            raise RuntimeError("take() with no prompts submitted")
        return produce_with_retries(self.producer, self.weights, self._submitted.popleft(), self.retries)

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
    submits step s only once the learner has finished s - η steps. A step is then sampled with the weights
    after step s - η or later and trained with those after step s - 1, and a version counts publishes
    (at most one a step), so staleness (the learner's version when it trains, minus the rollout's) is at
    most η, and with η = 0 each step is produced after the previous update:
    synchronous training, in another thread. Work is never thrown away: the producer idles instead
    (`time/producer_idle_frac` is the throttled share). Threads, not processes: the sampler and the
    reward release the GIL in torch and I/O, and a thread shares the sampler's weights with the channel's
    in-process copy (a process would need the Ray-style transport).

    A step whose producing raises (sampler, reward, environment) is produced again, up to `retries` times,
    in the same hold (`produce_with_retries`); past that, or on an error that is not retried, the thread
    ends and the next `take` raises the error, so the run stops with its one line instead of hanging.
    """

    def __init__(self, producer: Producer, weights: WeightChannel, *, retries: int = 0) -> None:
        self.producer = producer
        self.weights = weights
        self.retries = retries
        self._stopping = threading.Event()
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
                groups = produce_with_retries(
                    self.producer, self.weights, prompts, self.retries, self._stopping
                )
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
        """Stop the producer after the step it is on, without retrying it (a daemon: an interrupted run
        waits at most `_CLOSE_S` for it)."""
        self._stopping.set()
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
