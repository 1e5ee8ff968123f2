"""Reward values, the reward-function protocol, and weighted composition.

Why `Score | float`: most verifiers are a plain 0/1 check and should be writable as one line, while
composite rewards need their components logged separately (`reward/<part>`) to be debuggable.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from hone.types import Rollout, Sample


@dataclass
class Score:
    """A reward `value` and its named components (`parts`), which are logged but not re-summed."""

    value: float
    parts: dict[str, float] = field(default_factory=dict)


RewardFn = Callable[[Rollout, Sample], Score | float]


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


def compose(components: Mapping[str, tuple[RewardFn, float]]) -> RewardFn:
    """Weighted sum of reward functions. Each component's unweighted value is kept as part `name`
    (and its own parts as `name/part`), so logs show e.g. accuracy as 0/1 whatever its weight.
    """
    if not components:
        raise ValueError("compose needs at least one reward component")
    for name, (_, weight) in components.items():
        _finite(weight, f"weight of {name!r}")
    items = list(components.items())

    def composed(rollout: Rollout, sample: Sample) -> Score:
        total, parts = 0.0, {}
        for name, (fn, weight) in items:
            score = as_score(fn(rollout, sample))
            total += weight * score.value
            parts[name] = score.value
            parts.update({f"{name}/{sub}": v for sub, v in score.parts.items()})
        return Score(total, parts)

    return composed


def task_reward(task: TextVerifier) -> RewardFn:
    """Adapt a task's text verifier to the `RewardFn` protocol."""

    def reward(rollout: Rollout, sample: Sample) -> float:
        return task.reward(rollout.response_text, sample)

    return reward
