"""Reward functions: `Score`, the `RewardFn` protocol, `compose`, and in-place `score_rollouts`."""

from hone.rewards.base import RewardFn, Score, TextVerifier, as_score, compose, task_reward
from hone.rewards.scoring import score_rollouts

__all__ = ["RewardFn", "Score", "TextVerifier", "as_score", "compose", "score_rollouts", "task_reward"]
