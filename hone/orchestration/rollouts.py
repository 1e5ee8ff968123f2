"""The one interface producers and the learner talk through: submit prompts, take scored groups,
publish weights.

The loop drives training through it alone, so where the producers run is a choice of implementation:
`SyncRollouts` produces in the caller's thread when groups are taken (synchronous training is
`learn(produce(step))`); an asynchronous one produces ahead in a thread under a staleness bound; a Ray
one keeps producers in actors and publishes through the object store.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from hone.orchestration.producer import Producer, PromptBatch, ScoredGroups
from hone.orchestration.weights import WeightChannel


class RolloutSource(Protocol):
    """`submit` hands over the prompts of a step; `take` returns scored groups, oldest step first (it may
    block until they are done); `publish(version)` makes the learner's current weights that version on
    every producer."""

    def submit(self, prompts: PromptBatch) -> None: ...

    def take(self) -> ScoredGroups: ...

    def publish(self, version: int) -> None: ...


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
