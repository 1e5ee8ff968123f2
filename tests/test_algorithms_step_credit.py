"""Step-level credit for multi-turn episodes: `turn_grpo`'s turn-index baseline, GiGPO's anchor-state
groups, REINFORCE over discounted turn returns (hand-computed values), the anchors collation builds, the
collapse diagnostics and the entropy guard."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hone.algorithms import ADVANTAGE_ESTIMATORS, scores_to_token_rewards
from hone.cli import main
from hone.config import load_config
from hone.rl.collapse import collapse_metrics, group_reward_std, turn_entropies
from hone.tracking import read_metrics, read_samples
from hone.training.advantages import anchored_fraction, entropy_guard, turn_advantage_metrics
from hone.training.collate import collate, turn_tensors
from hone.types import Rollout, TrainBatch
from tests.helpers import tiny_run

# One token per turn, an observation token between turns. Rows: A (3 turns), B (2), C (3), D (2).
TOKEN_TURNS = torch.tensor([[0, -1, 1, -1, 2], [0, -1, 1, -1, -1], [0, -1, 1, -1, 2], [0, -1, 1, -1, -1]])
RESPONSE_MASK = (TOKEN_TURNS >= 0).float()
TURN_MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]])


def per_token(per_turn: list[list[float]]) -> torch.Tensor:
    """Turn values laid out on TOKEN_TURNS' positions (0 on observations and padding)."""
    out = torch.zeros(TOKEN_TURNS.shape)
    for i, row in enumerate(per_turn):
        for k, value in enumerate(row):
            out[i][TOKEN_TURNS[i] == k] = value
    return out


def estimate(name: str, turn_rewards: list[list[float]], **kwargs: object) -> torch.Tensor:
    advantages, _ = ADVANTAGE_ESTIMATORS[name](
        response_mask=RESPONSE_MASK,
        group_ids=torch.zeros(4, dtype=torch.long),
        turn_rewards=torch.tensor(turn_rewards),
        turn_mask=TURN_MASK,
        token_turns=TOKEN_TURNS,
        eps=0.0,
        **kwargs,
    )
    return advantages


# A solves on turn 3, B on turn 2; C and D fail (D's episode ended after 2 turns).
OUTCOMES = [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_turn_index_baseline_compares_each_turn_with_the_same_turn_of_the_others() -> None:
    # gamma 1: G = A [1, 1, 1], B [1, 1], C [0, 0, 0], D [0, 0].
    # turns 1 and 2: {1, 1, 0, 0}: mean 0.5, unbiased std 1/sqrt(3) → ±0.866025
    # turn 3 (A and C only): {1, 0}: mean 0.5, std 1/sqrt(2) → ±0.707107
    advantages = estimate("turn_grpo", OUTCOMES, gamma=1.0, turn_baseline="turn_index")
    a, b = math.sqrt(3) / 2, 1 / math.sqrt(2)
    expected = per_token([[a, a, b], [a, a], [-a, -a, -b], [-a, -a]])
    torch.testing.assert_close(advantages, expected, atol=1e-6, rtol=0)
    # The trajectory baseline gives every turn the episode's ±0.866: turn 3 differs.
    trajectory = estimate("turn_grpo", OUTCOMES, gamma=1.0)
    torch.testing.assert_close(
        trajectory, per_token([[a] * 3, [a] * 2, [-a] * 3, [-a] * 2]), atol=1e-6, rtol=0
    )


def test_turn_index_baseline_removes_the_bias_against_late_turns_under_per_turn_rewards() -> None:
    # Every turn pays 1 (a per-turn reward), so every turn did equally well; gamma 1.
    # G = A [3, 2, 1], B [2, 1], C [3, 2, 1], D [2, 1]. Trajectory baseline: mean(G_0) = 2.5, so every
    # third turn (G = 1) gets a negative advantage; per turn index, no turn is better than its peers
    # except by how many turns remain, and the equal ones get exactly 0.
    rewards = [[1.0, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]]
    trajectory = estimate("turn_grpo", rewards, gamma=1.0)
    assert float(trajectory[0, 4]) < 0 and float(trajectory[2, 4]) < 0
    by_index = estimate("turn_grpo", rewards, gamma=1.0, turn_baseline="turn_index")
    assert torch.equal(by_index[:, 4], torch.zeros(4))  # turn 3: {1, 1}, all equal → 0
    assert float(by_index[0, 0]) > 0 > float(by_index[1, 0])  # turn 1: 3 remaining beats 2 remaining


def test_an_unknown_turn_baseline_is_named() -> None:
    with pytest.raises(ValueError, match="turn_baseline must be"):
        estimate("turn_grpo", OUTCOMES, turn_baseline="per_step")


# Anchors: turn 1 is the prompt's state for all; A and B made the same first move (anchor 1), C and D
# another (anchor 2); A's and C's third turns are singletons.
ANCHORS = torch.tensor([[0, 1, 3], [0, 1, -1], [0, 2, 4], [0, 2, -1]])


def test_gigpo_adds_the_anchor_groups_step_advantage_to_the_episodes() -> None:
    advantages = estimate("gigpo", OUTCOMES, gamma=0.5, turn_anchors=ANCHORS, step_advantage_weight=1.0)
    # gamma 0.5: G = A [0.25, 0.5, 1], B [0.5, 1], C [0, 0, 0], D [0, 0].
    # Episode: R = [1, 1, 0, 0]: mean 0.5, std 1/sqrt(3) → A^E = ±0.866025.
    episode = math.sqrt(3) / 2
    # Step, turn 1 (all four): G = {0.25, 0.5, 0, 0}: mean 0.1875, squared deviations sum 0.171875,
    # std sqrt(0.171875 / 3) = 0.239357 → A 0.261116, B 1.305582, C and D -0.783349.
    std = math.sqrt(0.171875 / 3)
    s1 = [(0.25 - 0.1875) / std, (0.5 - 0.1875) / std, -0.1875 / std]
    # Turn 2: anchor 1 {A 0.5, B 1}: ∓0.707107 (B reached the same state and solved sooner); anchor 2
    # {0, 0}: no signal. Turn 3: singletons, 0.
    s2 = 1 / math.sqrt(2)
    expected = per_token(
        [
            [episode + s1[0], episode - s2, episode],
            [episode + s1[1], episode + s2],
            [-episode + s1[2], -episode, -episode],
            [-episode + s1[2], -episode],
        ]
    )
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)


def test_gigpo_without_its_step_term_is_grpo() -> None:
    advantages = estimate("gigpo", OUTCOMES, gamma=0.5, turn_anchors=ANCHORS, step_advantage_weight=0.0)
    token_rewards = scores_to_token_rewards(torch.tensor([1.0, 1.0, 0.0, 0.0]), RESPONSE_MASK)
    grpo, _ = ADVANTAGE_ESTIMATORS["grpo"](
        token_rewards=token_rewards, response_mask=RESPONSE_MASK, group_ids=torch.zeros(4), eps=0.0
    )
    torch.testing.assert_close(advantages, grpo)


def test_gigpo_never_anchors_turns_of_different_prompt_groups_together() -> None:
    # Same anchors, but A and B are one group and C and D another: turn 1's anchor spans both groups in
    # ANCHORS, and must split by group: {0.25, 0.5} and {0, 0}.
    advantages, _ = ADVANTAGE_ESTIMATORS["gigpo"](
        response_mask=RESPONSE_MASK,
        group_ids=torch.tensor([0, 0, 1, 1]),
        turn_rewards=torch.tensor(OUTCOMES),
        turn_mask=TURN_MASK,
        token_turns=TOKEN_TURNS,
        turn_anchors=ANCHORS,
        gamma=0.5,
        eps=0.0,
    )
    # Both groups have equal episode returns within them: A^E = 0. Step: turn 1 {0.25, 0.5} → ∓0.707107;
    # turn 2 {0.5, 1} → ∓0.707107; C, D all 0.
    s = 1 / math.sqrt(2)
    expected = per_token([[-s, -s, 0.0], [s, s], [0.0, 0.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(advantages, expected, atol=1e-6, rtol=0)


def test_turn_reinforce_whitens_discounted_turn_returns_over_the_batch() -> None:
    # Two rows: A r = [0, 1] (gamma 0.5 → G = [0.5, 1]), B r = [0] (G = [0]).
    # {0.5, 1, 0}: mean 0.5, unbiased std 0.5 → A [0, 1], B [-1].
    token_turns = torch.tensor([[0, -1, 1], [0, -1, -1]])
    mask = (token_turns >= 0).float()
    advantages, returns = ADVANTAGE_ESTIMATORS["turn_reinforce"](
        response_mask=mask,
        turn_rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        turn_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        token_turns=token_turns,
        gamma=0.5,
        eps=0.0,
    )
    torch.testing.assert_close(advantages, torch.tensor([[0.0, 0, 1], [-1, 0, 0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.5, 0, 1], [0, 0, 0]]))


def rollout(group: int, response: list[int], turns: list[tuple[int, int]], reward: float) -> Rollout:
    """Prompt [1, 2]; loss 1 on the turns' tokens."""
    loss_mask = [0] * len(response)
    for start, end in turns:
        loss_mask[start:end] = [1] * (end - start)
    logprobs = [-0.5 * (t + 1) for t in range(len(response))]
    return Rollout("s", group, [1, 2, *response], 2, loss_mask, logprobs, turns=turns, reward=reward)


def test_collation_anchors_turns_by_the_context_before_them() -> None:
    # Turn 2 of the first two follows the same move and observation (5, 9); the third moved 6.
    rollouts = [
        rollout(0, [5, 9, 7], [(0, 1), (2, 3)], 1.0),
        rollout(0, [5, 9, 8, 9, 3], [(0, 1), (2, 3), (4, 5)], 0.0),
        rollout(0, [6, 9, 7], [(0, 1), (2, 3)], 0.0),
    ]
    anchors = turn_tensors(rollouts, collate(rollouts, pad_id=0).response_mask.shape[1])["turn_anchors"]
    assert anchors[0, 0] == anchors[1, 0] == anchors[2, 0]  # the prompt
    assert anchors[0, 1] == anchors[1, 1] != anchors[2, 1]
    assert len({int(anchors[0, 1]), int(anchors[1, 2]), int(anchors[2, 1]), int(anchors[0, 0])}) == 4
    assert anchors[0, 2] == anchors[2, 2] == -1  # no third turn


def test_collapse_diagnostics_by_hand() -> None:
    rollouts = [
        rollout(0, [5, 9, 7], [(0, 1), (2, 3)], 1.0),  # -log p: turn 1 0.5, turn 2 1.5
        rollout(0, [5, 9, 8, 9, 3], [(0, 1), (2, 3), (4, 5)], 0.0),  # 0.5, 1.5, 2.5
        rollout(1, [6, 9, 7], [(0, 1), (2, 3)], 1.0),
        rollout(1, [6, 9, 7], [(0, 1), (2, 3)], 1.0),
    ]
    assert group_reward_std(rollouts) == pytest.approx((0.5 + 0.0) / 2)
    assert turn_entropies(rollouts) == {"entropy/turn_1": 0.5, "entropy/turn_2": 1.5, "entropy/turn_3": 2.5}
    assert collapse_metrics(rollouts)["groups/reward_std"] == pytest.approx(0.25)
    single = [Rollout("s", 0, [1, 5], 1, [1], [-0.1], turns=[(0, 1)], reward=1.0)]
    assert collapse_metrics(single) == {}


def test_turn_advantage_metrics_by_hand() -> None:
    advantages = per_token([[1.0, -1.0, 0.5], [2.0, -3.0], [-1.0, 1.0, -0.5], [0.0, 0.0]])
    metrics = turn_advantage_metrics(advantages, TOKEN_TURNS, TURN_MASK)
    assert metrics["advantage/turn_1"] == pytest.approx(0.5)
    assert metrics["advantage/turn_2"] == pytest.approx(-0.75)
    assert metrics["advantage/turn_2_negative"] == pytest.approx(0.5)
    assert metrics["advantage/turn_3"] == pytest.approx(0.0)
    assert metrics["advantage/turn_3_negative"] == pytest.approx(0.5)


def train_batch(sampled_logp: float) -> TrainBatch:
    mask = torch.ones(2, 3)
    zeros = torch.zeros(2, 3)
    return TrainBatch(
        input_ids=torch.zeros(2, 4, dtype=torch.long),
        attention_mask=torch.ones(2, 4),
        loss_mask=mask,
        behaviour_logp=torch.full((2, 3), sampled_logp),
        old_logp=zeros,
        advantages=zeros,
        returns=zeros,
    )


def test_the_entropy_guard_turns_the_bonus_on_below_its_floor_only() -> None:
    cfg = load_config(None, ["algorithm.entropy_guard.floor=0.5", "algorithm.entropy_guard.coef=0.02"])
    guard = cfg.algorithm.entropy_guard
    assert entropy_guard(guard, 0.0, train_batch(-0.3)) == 0.02  # sampled entropy 0.3 < 0.5
    assert entropy_guard(guard, 0.0, train_batch(-0.8)) is None  # above: the configured coefficient
    assert entropy_guard(guard, 0.05, train_batch(-0.3)) == 0.05  # never lowers a configured bonus
    off = load_config(None, []).algorithm.entropy_guard
    assert entropy_guard(off, 0.0, train_batch(-0.0)) is None


def test_a_multi_turn_run_logs_its_collapse_diagnostics_and_per_turn_credit(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """`agent-guess` with GiGPO and an entropy guard whose floor is always above the sampled entropy: every
    step logs the collapse diagnostics, the credit by turn and the guard's bonus; samples.jsonl has each
    episode's conversation and, for the trained ones, one advantage per assistant turn."""
    overrides = tiny_run(
        tmp_path,
        micro_model_dir,
        **{
            "rollout.n": 4,
            "rollout.temperature": 1.0,
            "env.args.high": 8,
            "algorithm.advantage": "gigpo",
            "algorithm.gamma": 0.9,
            "algorithm.skip_zero_variance_groups": "false",
            "algorithm.entropy_guard.floor": 100.0,
            "algorithm.entropy_guard.coef": 0.03,
            "logging.samples": 8,
        },
    )
    assert main(["train", "agent-guess", *overrides]) == 0
    rows = read_metrics(tmp_path / "r" / "metrics.jsonl")
    step = next(r for r in rows if "loss/policy" in r)
    assert step["guard/entropy_coef"] == 0.03
    assert step["loss/total"] < step["loss/policy"]  # the bonus, -0.03 x entropy, is in the update's loss
    assert {"groups/reward_std", "entropy/turn_1", "answers/top_share"} <= set(step)
    assert step["entropy/turn_1"] > 0
    records = read_samples(tmp_path / "r" / "samples.jsonl")
    assert records and all(r["messages"][0]["content"] == "Guess my number (1-8)." for r in records)
    trained = [r for r in records if r["turn_advantages"] is not None]
    assert trained
    for r in trained:
        replies = [m for m in r["messages"] if m["role"] == "assistant"]
        assert len(r["turn_advantages"]) == len(replies)
    if any(len(r["turn_advantages"]) > 1 for r in trained):
        assert "advantage/turn_2" in next(r for r in rows if "advantage/turn_1" in r)


def test_the_anchored_fraction_counts_later_turns_another_trajectory_of_the_group_met() -> None:
    # Turns 2 and 3 of ANCHORS: anchor 1 (A, B) and 2 (C, D) are shared, 3 and 4 are singletons.
    assert anchored_fraction(ANCHORS, torch.zeros(4, dtype=torch.long)) == pytest.approx(4 / 6)
    # In two groups (A, C) and (B, D) nothing after the first turn is shared.
    assert anchored_fraction(ANCHORS, torch.tensor([0, 1, 0, 1])) == 0.0
