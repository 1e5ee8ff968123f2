"""Test helpers shared between test files."""

from __future__ import annotations

from typing import Any

from hone.orchestration.executors import InlineExecutor
from hone.orchestration.rollouts import Rollouts
from hone.types import Sample


class OneStep:
    """A prompt plan that is one step's prompts (`samples` at `step`), learning nothing from outcomes."""

    def __init__(self, step: int, samples: list[Sample]) -> None:
        self.step, self.samples = step, samples

    def batch(self, step: int) -> list[Sample]:
        assert step == self.step
        return self.samples

    def observe(self, step: int, outcomes: Any) -> dict[str, float]:
        return {}


def sync_source(
    producer: Any, weights: Any, step: int, samples: list[Sample], *, retries: int = 0
) -> Rollouts:
    """The synchronous rollout source of a run, for the one step `step` with the prompts `samples`."""
    executor = InlineExecutor(producer, weights, retries=retries)
    return Rollouts(executor, OneStep(step, samples), start=step, steps=step + 1, ahead=0, version=0)
