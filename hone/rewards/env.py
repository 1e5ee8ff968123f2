"""The environment's own verdict as the reward, for multi-turn runs (`reward.fn: env`)."""

from __future__ import annotations

from hone.rewards.base import RewardFn
from hone.rewards.registry import register_reward
from hone.types import Rollout, Sample


@register_reward("env")
def env_reward() -> RewardFn:
    """The sum of the rewards the environment gave over the episode (`rollout.turn_rewards`)."""

    def reward(rollout: Rollout, sample: Sample) -> float:
        return float(sum(rollout.turn_rewards))

    return reward
