"""Reward values, the reward-function protocol, and weighted composition.

Why `Score | float`: most verifiers are a plain 0/1 check and should be writable as one line, while
composite rewards need their components logged separately (`reward/<part>`) to be debuggable.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from hone.types import Rollout, Sample


@dataclass
class Score:
    """A reward `value` and its named components (`parts`), which are logged but not re-summed."""

    value: float
    parts: dict[str, float] = field(default_factory=dict)


RewardFn = Callable[[Rollout, Sample], "Score | float | Awaitable[Score | float]"]


@runtime_checkable
class BatchRewardFn(Protocol):
    """A reward that scores many rollouts in one call (a reward model's batched forward pass)."""

    def score_batch(self, rollouts: Sequence[Rollout], samples: Sequence[Sample]) -> list[Score | float]: ...


class TextVerifier(Protocol):
    """Anything that grades response text against a sample, such as a built-in `hone.data` task."""

    def reward(self, response_text: str, sample: Sample) -> float: ...


def as_score(result: Score | float) -> Score:
    """Normalise a reward function's result; raise `TypeError`/`ValueError` for non-numeric or non-finite."""
    if not isinstance(result, Score):
        return Score(_finite(result, "reward"))
    parts = {name: _finite(part, f"reward part {name!r}") for name, part in result.parts.items()}
    return Score(_finite(result.value, "reward"), parts)


def _finite(value: object, what: str) -> float:
    if not isinstance(value, numbers.Real):  # bools and numpy scalars are fine, strings and None are not
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{what} is not finite: {value}")
    return float(value)


def task_reward(task: TextVerifier) -> RewardFn:
    """Adapt a task's text verifier to the `RewardFn` protocol."""

    def reward(rollout: Rollout, sample: Sample) -> float:
        return task.reward(rollout.response_text, sample)

    return reward
