"""Hone's GRPO advantage against TRL 1.16 `GRPOTrainer`'s for `scale_rewards` = "group", "batch" and
"none" (`multi_objective_aggregation="sum_then_normalize"`, TRL's default), on one fixed batch: by hand,
through the recipe keys and the producer dropping the unscorable, and through TRL's own lines with
TRL's own `nanstd`.

The batch: three prompts, four completions each. The last completion is unscorable (every TRL reward
function returned None): TRL keeps it as NaN, leaves it out of the mean and std and zeroes its advantage;
Hone drops it before the estimator (`drop_failed_rewards`), so the estimator sees 11 rows.

    group 0: 1, 0, 0, 1    mean 0.5, unbiased std sqrt(1/3) = 0.5773503
    group 1: 2, 2, 2, 2    all equal: no signal
    group 2: 4, 0, 2, NaN  over the three scorable: mean 2, unbiased std sqrt(8/2) = 2

    the batch's 11 scorable rewards: sum 16, sum of squares 38, squared deviations 38 - 16²/11 = 162/11,
    unbiased variance 162/110 = 81/55, std 9/sqrt(55) = 1.2135598

Both TRL's `nanstd` and Hone's `group_stats` use the unbiased (n - 1) std: the population std would give
group 0 ±0.5/0.5001 = ±0.99980, group 2 ±2/(1.6329932 + 1e-4) = ±1.22467 and batch std 1.1570838, none
of which TRL produces (`test_trl_and_hone_both_take_the_unbiased_std`).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from hone.algorithms import ADVANTAGE_ESTIMATORS, scores_to_token_rewards
from hone.config import load_config
from hone.rewards.scoring import UNSCORABLE
from hone.rl.producer import drop_failed_rewards
from hone.training.advantages import compute_advantages
from hone.types import Rollout

NAN = math.nan
REWARDS = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 4.0, 0.0, 2.0, NAN]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
NUM_GENERATIONS = 4
TRL_EPS = 1e-4  # TRL divides by (std + 1e-4), hard-coded

# Advantages of the 11 scorable rows (the unscorable 12th is 0 in TRL, absent in Hone), by hand:
EXPECTED = {
    # group 0: ±0.5 / (0.5773503 + 0.0001) = ±0.5 / 0.5774503 = ±0.8658754
    # group 2: (4 - 2) / (2 + 0.0001) = 2 / 2.0001 = 0.9999500; (0 - 2) / 2.0001; (2 - 2) = 0
    "group": [0.8658754, -0.8658754, -0.8658754, 0.8658754, 0, 0, 0, 0, 0.99995, -0.99995, 0.0],
    # batch std + eps = 1.2135598 + 0.0001 = 1.2136598
    # group 0: ±0.5 / 1.2136598 = ±0.4119771;  group 2: ±2 / 1.2136598 = ±1.6479083, 0
    "batch": [0.4119771, -0.4119771, -0.4119771, 0.4119771, 0, 0, 0, 0, 1.6479083, -1.6479083, 0.0],
    # reward - group mean, no division (no eps either)
    "none": [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 2.0, -2.0, 0.0],
}

# The Hone settings of each TRL `scale_rewards` value, as recipe overrides (`algorithm.eps` = TRL's 1e-4).
OVERRIDES = {
    "group": ["algorithm.eps=0.0001"],
    "batch": ["algorithm.eps=0.0001", "algorithm.advantage_args.std_over=batch"],
    "none": ["algorithm.eps=0.0001", "algorithm.norm_by_std=false"],
}
KEYWORDS: dict[str, dict[str, object]] = {
    "group": {},
    "batch": {"std_over": "batch"},
    "none": {"norm_by_std": False},
}


def _scorable() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 11 scorable rows as the estimator gets them: token rewards over a 3-token response (the score
    on the last token), its mask, and the group ids."""
    rows = [i for i, r in enumerate(REWARDS) if not math.isnan(r)]
    mask = torch.ones(len(rows), 3)
    scores = torch.tensor([REWARDS[i] for i in rows])
    return scores_to_token_rewards(scores, mask), mask, torch.tensor([GROUPS[i] for i in rows])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_the_estimator_gives_the_hand_values(scale: str) -> None:
    token_rewards, mask, group_ids = _scorable()
    adv, ret = ADVANTAGE_ESTIMATORS["grpo"](
        token_rewards=token_rewards, response_mask=mask, group_ids=group_ids, eps=TRL_EPS, **KEYWORDS[scale]
    )
    expected = torch.tensor(EXPECTED[scale])
    for column in range(3):  # the sequence's advantage on every response token
        torch.testing.assert_close(adv[:, column], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, adv)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_the_recipe_path_drops_the_unscorable_and_gives_the_hand_values(scale: str) -> None:
    cfg = load_config(None, OVERRIDES[scale])
    rollouts = []
    for reward, group in zip(REWARDS, GROUPS, strict=True):
        rollout = Rollout(f"s{group}", group, [5, 6, 7, 8], 2, [1, 1], [0.0, 0.0])
        if math.isnan(reward):  # what the scorer does when every TRL function returned None
            rollout.metrics[UNSCORABLE] = 1.0
        else:
            rollout.reward = reward
        rollouts.append(rollout)
    kept, excluded = drop_failed_rewards(rollouts)
    assert len(kept) == 11 and excluded == pytest.approx(1 / 12)
    mask = torch.ones(len(kept), 2)
    group_ids = torch.tensor([r.group_id for r in kept])
    adv, _, _ = compute_advantages(
        kept, cfg.algorithm, response_mask=mask, old_logp=mask * 0, group_ids=group_ids
    )
    torch.testing.assert_close(adv[:, 1], torch.tensor(EXPECTED[scale]), atol=1e-6, rtol=0)


# TRL 1.16's `_generate_and_score_completions`, `sum_then_normalize` branch: the advantage is inline in
# that method (no function to call), so the test runs exactly these lines, with TRL's own `nanstd`, and
# first checks that they are still TRL's, verbatim, so that a TRL that changes them fails here.
TRL_LINES = [
    "mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)",
    "mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)",
    "std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)",
    "std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)",
    "std_rewards = nanstd(rewards).expand_as(rewards)",
    "advantages = rewards - mean_grouped_rewards",
    "advantages = advantages / (std_rewards + 1e-4)",
    "advantages = torch.nan_to_num(advantages, nan=0.0)",
]


def _trl_advantages(rewards: torch.Tensor, scale_rewards: str) -> torch.Tensor:
    from trl.trainer.utils import nanstd

    num_generations = NUM_GENERATIONS
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
        std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    else:  # "batch"
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def test_trls_lines_are_the_ones_this_test_runs() -> None:
    pytest.importorskip("trl")
    spec = importlib.util.find_spec("trl.trainer.grpo_trainer")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).read_text()
    missing = [line for line in TRL_LINES if line not in source]
    assert not missing, f"TRL's GRPO advantage changed; re-read grpo_trainer.py: {missing}"
    assert 'self.scale_rewards in ["group", "none"]' in source and 'self.scale_rewards == "batch"' in source


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_trls_own_computation_matches_hone(scale: str) -> None:
    pytest.importorskip("trl")
    trl = _trl_advantages(torch.tensor(REWARDS), scale)
    assert trl[-1] == 0  # the unscorable completion: no learning signal
    torch.testing.assert_close(trl[:-1], torch.tensor(EXPECTED[scale]), atol=1e-6, rtol=0)
    token_rewards, mask, group_ids = _scorable()
    hone, _ = ADVANTAGE_ESTIMATORS["grpo"](
        token_rewards=token_rewards, response_mask=mask, group_ids=group_ids, eps=TRL_EPS, **KEYWORDS[scale]
    )
    torch.testing.assert_close(hone[:, -1], trl[:-1], atol=1e-6, rtol=0)


def test_trl_and_hone_both_take_the_unbiased_std() -> None:
    pytest.importorskip("trl")
    from trl.trainer.utils import nanstd

    from hone.algorithms.advantages import group_stats

    scores = torch.tensor([4.0, 0.0, 2.0])
    assert nanstd(torch.tensor([4.0, 0.0, 2.0, NAN])).item() == pytest.approx(2.0)  # sqrt(8 / (3 - 1))
    # the population std would be sqrt(8 / 3) = 1.633 for both
    assert group_stats(scores, torch.zeros(3, dtype=torch.long)).std[0].item() == pytest.approx(2.0)
