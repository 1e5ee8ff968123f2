"""Rewards: `Score`, the reward-function protocols, built-in verifiers by name, and the scorer.

Importing this package registers the built-in rewards (`REWARDS`): `math`, `code`, `format`,
`overlong`, `length`, `reward_model`, `judge`. Heavy dependencies (transformers, math-verify) load on
first use, not here.
"""

from hone.rewards import code as _code  # noqa: F401 - registers "code"
from hone.rewards.base import BatchRewardFn, RewardFn, Score, TextVerifier, as_score, task_reward
from hone.rewards.code import code_reward, extract_code
from hone.rewards.registry import REWARDS, register_reward
from hone.rewards.scoring import RewardComponent, RewardScorer, score_rollouts

__all__ = [
    "REWARDS",
    "BatchRewardFn",
    "RewardComponent",
    "RewardFn",
    "RewardScorer",
    "Score",
    "TextVerifier",
    "as_score",
    "code_reward",
    "extract_code",
    "register_reward",
    "score_rollouts",
    "task_reward",
]
