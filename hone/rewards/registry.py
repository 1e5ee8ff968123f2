"""Built-in reward functions by name, so a recipe can say `reward.fn: math`.

An entry is a *factory*: it takes the recipe's `args` as keyword arguments and returns either a
per-rollout `RewardFn` (sync or `async`) or a `BatchRewardFn` (an object with `score_batch`, for
reward models that want one forward pass over many responses). A new reward is one class or
function plus `@register_reward("name")`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hone.registry import Registry

RewardFactory = Callable[..., Any]
REWARDS: Registry[RewardFactory] = Registry("reward")
# Built-ins that score `rollout.response_text`: a recipe's `text: all` arg has them score every
# assistant message of an episode instead of the final one (`Rollout.assistant_text`).
TEXT_REWARDS = frozenset({"math", "format", "code", "judge", "reward_model"})


def register_reward(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator: make `factory(**args)` available as `reward.fn: name` in recipes."""
    return REWARDS.register(name)
