"""Turn-level GRPO: hand-computed values, reduction to GRPO, and masking of observation tokens."""

from __future__ import annotations

import pytest
import torch

from hone.algorithms import ADVANTAGE_ESTIMATORS, scores_to_token_rewards

# Two trajectories of one prompt. Response positions: A = a0 a0 o a1 o a2, B = b0 o b1 pad pad pad
# (o = observation tokens, -1 = not an assistant token).
TOKEN_TURNS = torch.tensor([[0, 0, -1, 1, -1, 2], [0, -1, 1, -1, -1, -1]])
RESPONSE_MASK = (TOKEN_TURNS >= 0).float()
TURN_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
GROUPS = torch.tensor([0, 0])


def turn_grpo(turn_rewards: list[list[float]], gamma: float) -> torch.Tensor:
    advantages, returns = ADVANTAGE_ESTIMATORS["turn_grpo"](
        response_mask=RESPONSE_MASK,
        group_ids=GROUPS,
        turn_rewards=torch.tensor(turn_rewards),
        turn_mask=TURN_MASK,
        token_turns=TOKEN_TURNS,
        gamma=gamma,
        eps=0.0,
    )
    assert torch.equal(advantages, returns)
    return advantages


def test_outcome_reward_with_gamma_one_is_exactly_grpo_on_every_turn() -> None:
    advantages = turn_grpo([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], gamma=1.0)
    token_rewards = scores_to_token_rewards(torch.tensor([1.0, 0.0]), RESPONSE_MASK)
    grpo, _ = ADVANTAGE_ESTIMATORS["grpo"](
        token_rewards=token_rewards, response_mask=RESPONSE_MASK, group_ids=GROUPS, eps=0.0
    )
    torch.testing.assert_close(advantages, grpo)
    # by hand: mean 0.5, unbiased std 0.70711 → ±0.70711 on assistant tokens, 0 on observations
    expected = torch.tensor([[0.70711, 0.70711, 0, 0.70711, 0, 0.70711], [-0.70711, 0, -0.70711, 0, 0, 0]])
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)


def test_per_turn_rewards_and_discount_move_credit_to_the_turns_that_earned_it() -> None:
    # A: r = [0.5, 0, 1], gamma 0.5 → G = [0.5 + 0.5*(0 + 0.5*1), 0 + 0.5*1, 1] = [0.75, 0.5, 1]
    # B: r = [0, 0] → G = [0, 0]. Trajectory returns [0.75, 0]: mean 0.375, std 0.530330.
    advantages = turn_grpo([[0.5, 0.0, 1.0], [0.0, 0.0, 0.0]], gamma=0.5)
    std = 0.530330
    a = [(0.75 - 0.375) / std, (0.5 - 0.375) / std, (1 - 0.375) / std]
    b = (0 - 0.375) / std
    expected = torch.tensor([[a[0], a[0], 0, a[1], 0, a[2]], [b, 0, b, 0, 0, 0]])
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)


def test_without_turns_the_response_is_one_turn_and_turn_grpo_is_grpo() -> None:
    token_rewards = scores_to_token_rewards(torch.tensor([1.0, 0.0]), RESPONSE_MASK)
    kwargs = {"token_rewards": token_rewards, "response_mask": RESPONSE_MASK, "group_ids": GROUPS, "eps": 0.0}
    torch.testing.assert_close(
        ADVANTAGE_ESTIMATORS["turn_grpo"](**kwargs), ADVANTAGE_ESTIMATORS["grpo"](**kwargs)
    )
    with pytest.raises(ValueError, match="needs turn_rewards or token_rewards"):
        ADVANTAGE_ESTIMATORS["turn_grpo"](response_mask=RESPONSE_MASK, group_ids=GROUPS)
