"""Rewards: `Score`, the reward-function protocols, built-in verifiers by name, and the scorer.

Importing this package registers the built-in rewards (`REWARDS`): `math`, `code`, `format`,
`overlong`, `length`, `reward_model`, `judge`, `env`. math-verify (sympy) loads on first use.
"""

# Each module registers its rewards on import.
from hone.rewards import code, env, judge, math, model, shaping  # noqa: F401
from hone.rewards.base import (
    BatchRewardFn,
    RewardFn,
    Score,
    TextVerifier,
    as_score,
    task_reward,
)
from hone.rewards.code import code_reward, extract_code
from hone.rewards.registry import REWARDS, register_reward
from hone.rewards.scoring import (
    CORRECTNESS,
    RewardComponent,
    RewardScorer,
    is_correct,
    reward_failed,
    score_rollouts,
)
from hone.rewards.shaping import overlong_penalty
from hone.verifiers.budget import own_time_budget
from hone.verifiers.math import extract_answer, math_reward, top_answer_share

__all__ = [
    "CORRECTNESS",
    "REWARDS",
    "BatchRewardFn",
    "RewardComponent",
    "RewardFn",
    "RewardScorer",
    "Score",
    "TextVerifier",
    "as_score",
    "code_reward",
    "extract_answer",
    "extract_code",
    "is_correct",
    "math_reward",
    "overlong_penalty",
    "own_time_budget",
    "register_reward",
    "reward_failed",
    "score_rollouts",
    "task_reward",
    "top_answer_share",
]
