"""The environment's own verdict as the reward, for multi-turn runs (`reward.fn: env`)."""

from __future__ import annotations

from hone.rewards.base import RewardFn, Score
from hone.rewards.registry import register_reward
from hone.types import Rollout, Sample

_PARTS = "env/reward/"  # what the rollout loop makes of an environment's info["reward/<name>"]


@register_reward("env")
def env_reward() -> RewardFn:
    """The sum of the rewards the environment gave over the episode (`rollout.turn_rewards`). An environment
    that reports its reward's components as `StepResult.info["reward/<name>"]` (a verifiers rubric) has
    them logged as `reward/<name>` (the parts of the score; they are not re-summed)."""

    def reward(rollout: Rollout, sample: Sample) -> Score | float:
        total = float(sum(rollout.turn_rewards))
        parts = {k.removeprefix(_PARTS): v for k, v in rollout.metrics.items() if k.startswith(_PARTS)}
        return Score(total, parts) if parts else total

    return reward
