"""Turn-level GRPO: hand-computed values, reduction to GRPO, masking of observation tokens, groups without
signal, a KL penalty in the reward, and the Dr.GRPO normaliser of multi-turn runs."""

from __future__ import annotations

import math

import pytest
import torch

from hone.algorithms import ADVANTAGE_ESTIMATORS, scores_to_token_rewards
from hone.config import load_config
from hone.rl.start import response_budget
from hone.rollout.multiturn import EpisodeLimits, Episodes
from hone.training.advantages import compute_advantages
from hone.training.collate import collate
from hone.types import Rollout

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


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize(
    ("groups", "turn_rewards"),
    [
        # gamma 0.5: A r = [0, 1, 0] → G = [0.5, 1, 0]; B r = [0.5, 0] → G = [0.5, 0]. Equal trajectory
        # returns (0.5, 0.5), std 0, yet G_1 - mean = 0.5: the old code gave A's turn 1 0.5 / 1e-6 = 5e5.
        ([0, 0], [[0.0, 1.0, 0.0], [0.5, 0.0, 0.0]]),
        # two singleton groups: no baseline at all
        ([0, 1], [[0.5, 0.0, 1.0], [0.0, 1.0, 0.0]]),
    ],
)
def test_groups_without_signal_get_zero_on_every_turn(
    groups: list[int], turn_rewards: list[list[float]], norm_by_std: bool
) -> None:
    advantages, _ = ADVANTAGE_ESTIMATORS["turn_grpo"](
        response_mask=RESPONSE_MASK,
        group_ids=torch.tensor(groups),
        turn_rewards=torch.tensor(turn_rewards),
        turn_mask=TURN_MASK,
        token_turns=TOKEN_TURNS,
        gamma=0.5,
        eps=1e-6,
        norm_by_std=norm_by_std,
    )
    assert torch.equal(advantages, torch.zeros_like(advantages))


def multi_turn_rollout(response: list[int], turns: list[tuple[int, int]], reward: float) -> Rollout:
    """A one-token prompt, so response token j sits in column j; loss 0 on tokens between turns."""
    loss_mask = [0] * len(response)
    for start, end in turns:
        loss_mask[start:end] = [1] * (end - start)
    return Rollout("s", 0, [1, *response], 1, loss_mask, [0.0] * len(response), turns=turns, reward=reward)


def test_kl_in_the_reward_is_charged_to_each_turn() -> None:
    # A: a0 a0 o a1 (turns [0,2), [3,4)), reward 1; B: b0 o b1 b1 (turns [0,1), [2,4)), reward 0.
    rollouts = [
        multi_turn_rollout([5, 5, 9, 5], [(0, 2), (3, 4)], 1.0),
        multi_turn_rollout([5, 9, 5, 5], [(0, 1), (2, 4)], 0.0),
    ]
    batch = collate(rollouts, pad_id=0)
    # old log-probs 0 and ref = -kl make k1 = log π - log π_ref exactly these per-token values
    kl = torch.tensor([[0.2, 0.4, 0.0, 0.8], [0.1, 0.0, 0.3, 0.5]])
    cfg = load_config(
        None,
        [
            "algorithm.advantage=turn_grpo",
            "algorithm.kl.coef=0.5",
            "algorithm.kl.placement=reward",
            "algorithm.kl.estimator=k1",
        ],
    )
    advantages, _, _ = compute_advantages(
        rollouts,
        cfg.algorithm,
        response_mask=batch.response_mask,
        old_logp=torch.zeros_like(kl),
        ref_logp=-kl,
        group_ids=batch.group_ids,
    )
    # Turn rewards minus 0.5 * the turn's KL sum: A = [-0.3, 1 - 0.4] → G = [0.3, 0.6];
    # B = [-0.05, -0.4] → G = [-0.45, -0.4]. G_0 = (0.3, -0.45): mean -0.075, std 0.75 / sqrt(2).
    std = 0.75 / math.sqrt(2) + cfg.algorithm.eps
    a = [(0.3 + 0.075) / std, (0.6 + 0.075) / std]
    b = [(-0.45 + 0.075) / std, (-0.4 + 0.075) / std]
    expected = torch.tensor([[a[0], a[0], 0.0, a[1]], [b[0], 0.0, b[1], b[1]]])
    # float32 sums of O(1) terms: error ~1e-7 relative, far inside 1e-5
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        (None, 48),  # single-turn: rollout.max_new_tokens
        (EpisodeLimits(max_turns=7, max_tokens_per_turn=4, max_total_tokens=256), 28),  # turns bind
        (EpisodeLimits(max_turns=8, max_tokens_per_turn=64, max_total_tokens=100), 99),  # total binds
    ],
)
def test_dr_grpo_normaliser_is_the_episode_response_budget(
    limits: EpisodeLimits | None, expected: int
) -> None:
    cfg = load_config(None, ["rollout.max_new_tokens=48"])
    episodes = None if limits is None else Episodes(make_env=lambda: None, limits=limits)
    assert response_budget(cfg, episodes) == expected
