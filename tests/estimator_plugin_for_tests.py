"""A plugin estimator with its own hyperparameter and its own batch input, all in this one file: a recipe
imports it through `run.plugins` and sets `algorithm.advantage: length_bonus` and
`algorithm.advantage_args: {bonus: ...}` (tests/test_advantage_args.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hone.algorithms import register_advantage, register_batch_input
from hone.algorithms.utils import sequence_scores
from hone.types import Rollout

# What each call received (its hyperparameter and its input), for the test to read.
SEEN: list[dict[str, Any]] = []


@register_batch_input("response_tokens")
def response_tokens(rollouts: Sequence[Rollout], columns: int) -> torch.Tensor:
    """Each rollout's count of response tokens in the loss, [B]."""
    return torch.tensor([float(sum(r.loss_mask)) for r in rollouts])


@register_advantage("length_bonus")
def length_bonus(
    *,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    response_tokens: torch.Tensor,
    bonus: float = 0.0,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A toy: each response's advantage is its score plus `bonus` per response token."""
    SEEN.append({"bonus": bonus, "response_tokens": response_tokens.tolist()})
    adv = (sequence_scores(token_rewards, response_mask) + bonus * response_tokens).unsqueeze(-1)
    advantages = adv * response_mask
    return advantages, advantages.clone()
