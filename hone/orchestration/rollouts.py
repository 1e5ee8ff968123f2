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
from collections.abc import Callable, Sequence
from typing import Protocol

from hone.errors import HoneError
from hone.orchestration.producer import Producer, PromptBatch, ScoredGroups
from hone.orchestration.replay import is_replayed
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


class ProducerError(HoneError, RuntimeError):
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
    """Producing ahead in background threads while the learner trains (`trainer.mode: async`).

    Each producer (one, or `trainer.producers`) takes the next submitted step and produces it with its
    sampler's weights held (`WeightChannel.hold`), so every rollout of a step comes from one version; a
    publish made meanwhile does not wait for the step to end (the learner trains on) but lands as that
    producer starts its next step. How far ahead they run is set by what the loop has submitted: AReaL's
    admission rule (a rollout may start only while accepted + running < (η + v + 1)·B) counted in whole
    steps of B groups, the loop submits step s only once the learner has finished s - η steps. A step is
    then sampled with the weights after step s - η or later and trained with those after step s - 1, and a
    version counts publishes (at most one a step), so staleness (the learner's version when it trains,
    minus the rollout's) is at most η, and with η = 0 each step is produced after the previous update:
    synchronous training, in another thread. Work is never thrown away: producers idle instead
    (`time/producer_idle_frac` is the throttled share). `take` returns steps in the order submitted, so
    a step is trained with the same prompts whichever producer finished first.

    Several producers (`replicas`: each a producer with its own sampler, i.e. its own copy of the
    weights, and the channel that feeds it) keep more than one step in flight: while one waits on its
    slowest response, tool call or judge, another samples the next step. That is where asynchronous
    training gains more than overlapping two stages can (at most 2x): synchronous training has one
    step's requests in flight and waits for the longest of them.

    Threads, not processes: the sampler and the reward release the GIL in torch and I/O, and a thread
    shares the sampler's weights with the channel's in-process copy (a process would need the Ray-style
    transport).

    A step whose producing raises (sampler, reward, environment) is produced again, up to `retries` times,
    in the same hold (`produce_with_retries`); past that, or on an error that is not retried, the next
    `take` of that step raises the error, so the run stops with its one line instead of hanging.
    """

    def __init__(
        self,
        producer: Producer,
        weights: WeightChannel,
        *,
        retries: int = 0,
        replicas: Sequence[tuple[Producer, WeightChannel]] = (),
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._on_close = on_close  # stops what the replicas own (their samplers' engines)
        self.weights = weights  # the first producer's: its `published` is the learner's version
        self._workers = [(producer, weights), *replicas]
        self.retries = retries
        self._stopping = threading.Event()
        self._todo: queue.Queue[PromptBatch | None] = queue.Queue()
        self._order: deque[int] = deque()  # submitted steps not yet taken, oldest first
        self._done: dict[int, ScoredGroups | BaseException] = {}
        self._ready = threading.Condition()
        self._producer_idle_s = 0.0  # summed over producers
        self._last_take = time.perf_counter()
        self._idle_at_last_take = 0.0
        self._threads = [
            threading.Thread(target=self._produce_all, args=worker, name=f"hone-producer-{i}", daemon=True)
            for i, worker in enumerate(self._workers)
        ]
        for thread in self._threads:
            thread.start()

    def _produce_all(self, producer: Producer, weights: WeightChannel) -> None:
        while True:
            waited = time.perf_counter()
            prompts = self._todo.get()
            with self._ready:
                self._producer_idle_s += time.perf_counter() - waited
            if prompts is None:
                return
            try:
                result: ScoredGroups | BaseException = produce_with_retries(
                    producer, weights, prompts, self.retries, self._stopping
                )
            except BaseException as e:  # handed to the learner's thread, which raises it
                result = e
            with self._ready:
                self._done[prompts.step] = result
                self._ready.notify_all()
            if isinstance(result, BaseException):
                return

    def submit(self, prompts: PromptBatch) -> None:
        self._order.append(prompts.step)
        self._todo.put(prompts)

    def take(self) -> ScoredGroups:
        """The oldest submitted step's groups (blocking), with staleness, buffer and idle metrics."""
        if not self._order:
            raise RuntimeError("take() with no prompts submitted")
        step = self._order[0]
        waited = time.perf_counter()
        with self._ready:
            while step not in self._done:
                self._ready.wait(timeout=_POLL_S)
                for _, weights in self._workers:
                    weights.raise_if_overdue()  # a producer wedged inside its step: a line, not a hang
                if step not in self._done and not any(t.is_alive() for t in self._threads):
                    raise RuntimeError("the producer threads stopped without a result")
            item = self._done.pop(step)
            buffered = sum(_groups(g) for g in self._done.values())
            idle_total = self._producer_idle_s
        self._order.popleft()
        now = time.perf_counter()
        if isinstance(item, BaseException):
            raise item
        since = max(now - self._last_take, 1e-9)
        idle = (idle_total - self._idle_at_last_take) / len(self._workers)
        self._last_take, self._idle_at_last_take = now, idle_total
        # Replayed successes (`algorithm.replay`) are old on purpose: staleness is of what was sampled.
        lags = [self.weights.published - r.policy_version for r in item.rollouts if not is_replayed(r)] or [0]
        item.metrics |= {
            "staleness/mean": sum(lags) / len(lags),
            "staleness/max": float(max(lags)),
            "buffer/groups": float(buffered),
            "time/learner_idle_frac": (now - waited) / since,
            "time/producer_idle_frac": min(idle / since, 1.0),
        }
        return item

    def publish(self, version: int) -> None:
        for _, weights in self._workers:
            weights.publish(version)

    def close(self) -> None:
        """Stop the producers after the steps they are on, without retrying them (daemons: an interrupted
        run waits at most `_CLOSE_S` for them)."""
        self._stopping.set()
        while not self._todo.empty():
            try:
                self._todo.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._todo.put(None)
        deadline = time.monotonic() + _CLOSE_S
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._on_close is not None:
            self._on_close()


def _groups(item: ScoredGroups | BaseException) -> int:
    """How many groups (prompts) a finished step holds after its filters."""
    return 0 if isinstance(item, BaseException) else len({r.group_id for r in item.rollouts})
