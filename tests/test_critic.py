"""PPO with a critic: the `critic` config, GAE in the learner (KL in the reward included), the critic's
warm-up, its metrics, and its checkpoint/resume."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from hone.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, scores_to_token_rewards
from hone.algorithms.advantages import hyperparameters, reads_values
from hone.config import ConfigError, load_config
from hone.rl.loop import train
from hone.training.advantages import compute_advantages
from hone.types import Rollout
from tests.helpers import assert_same_weights, killed_and_resumed, tiny_overrides

PPO = {"algorithm.advantage": "gae", "critic.lr": 1e-3}
VALUE_METRICS = ("value/loss", "value/clip_frac", "value/explained_variance", "value/mean", "returns/mean")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.advantage=gae"], "algorithm.advantage: gae needs a critic section"),
        (["critic.lr=0.001"], "critic: set only with an estimator that reads values (gae), not 'grpo'"),
        (
            ["algorithm.advantage=rloo", "critic={}"],
            "critic: set only with an estimator that reads values (gae), not 'rloo'",
        ),
        (
            ["algorithm.advantage=gae", "critic.value_clip=0"],
            "critic.value_clip: Input should be greater than 0",
        ),
        (["algorithm.advantage=gae", "critic.warmup=3"], "critic.warmup: unknown key"),
    ],
)
def test_critic_config_errors_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_saved_config_keeps_its_critic_on_or_off(tmp_path: Path) -> None:
    """config.yaml (what --resume reads) writes `critic: null` for a run without one: that stays off,
    where an empty required section (`trainer:`) means its defaults."""
    for overrides in ([], [*[f"{k}={v}" for k, v in PPO.items()], "critic.value_clip=0.2"]):
        cfg = load_config(None, overrides)
        saved = tmp_path / "config.yaml"
        saved.write_text(cfg.to_yaml())
        assert load_config(saved) == cfg


def test_demo_ppo_recipe_is_the_default_with_gae_and_a_critic() -> None:
    ppo, default = load_config("demo-ppo"), load_config("default")
    assert ppo.algorithm.advantage == "gae" and ppo.critic is not None and ppo.critic.path is None
    assert ppo.data == default.data and ppo.rollout == default.rollout and ppo.sft == default.sft
    assert ppo.trainer == default.trainer and ppo.run.time_limit_s == default.run.time_limit_s


def test_gae_reads_the_kl_penalty_placed_in_the_reward() -> None:
    """`kl.placement: reward` (the classic RLHF placement): GAE runs on the score minus coef x KL per
    token, and returns = A + V are the critic's targets."""
    cfg = load_config(
        None,
        [
            *[f"{k}={v}" for k, v in PPO.items()],
            "algorithm.kl.coef=0.5",
            "algorithm.kl.placement=reward",
            "algorithm.kl.estimator=k1",
            "algorithm.lam=0.9",
        ],
    )
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    old = torch.tensor([[-1.0, -0.5, -2.0], [-0.1, -0.3, 0.0]])
    ref = torch.tensor([[-1.5, -0.5, -1.0], [-0.2, -0.1, 0.0]])
    values = torch.tensor([[0.2, 0.4, 0.6], [0.5, 0.1, 0.0]])
    rollouts = [
        Rollout(
            sample_id=str(i),
            group_id=0,
            token_ids=[0] * 4,
            prompt_len=1,
            loss_mask=[1] * 3,
            sampler_logprobs=[0.0] * 3,
            reward=reward,
        )
        for i, reward in enumerate([1.0, 0.0])
    ]
    advantages, returns_, metrics = compute_advantages(
        rollouts,
        cfg.algorithm,
        response_mask=mask,
        old_logp=old,
        ref_logp=ref,
        values=values,
        group_ids=torch.tensor([0, 0]),
    )
    # k1 = old - ref per token: [0.5, 0, -1] and [0.1, -0.2]; the reward pays 0.5 x it on every token.
    kl = KL_ESTIMATORS["k1"](old, ref) * mask
    rewards = scores_to_token_rewards(torch.tensor([1.0, 0.0]), mask) - 0.5 * kl
    expected, returns = ADVANTAGE_ESTIMATORS["gae"](
        token_rewards=rewards, response_mask=mask, values=values, gamma=1.0, lam=0.9
    )
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns_, returns)
    # Row 1 by hand: r = [-0.05, 0.1] (its score 0 on the last token, minus 0.5 x [0.1, -0.2]);
    # delta_1 = 0.1 - 0.1 = 0, delta_0 = -0.05 + 0.1 - 0.5 = -0.45; A_0 = -0.45 + 0.9 x 0 = -0.45.
    torch.testing.assert_close(advantages[1], torch.tensor([-0.45, 0.0, 0.0]))
    assert math.isclose(metrics["value/mean"], (0.2 + 0.4 + 0.6 + 0.5 + 0.1) / 5, rel_tol=1e-6)
    assert set(VALUE_METRICS[2:]) <= metrics.keys() and "kl" in metrics


def _rows(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_ppo_run_logs_value_metrics_and_only_the_critic_trains_during_warm_up(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    cfg = load_config(
        None,
        tiny_overrides(
            tmp_path,
            micro_model_dir,
            "ppo",
            **PPO,
            **{
                "run.steps": 3,
                "run.eval_every": 0,
                "run.save_every": 1,
                "run.keep_last": "null",
                "critic.warmup_steps": 2,
                "critic.value_clip": 0.2,
                "reward.fn": "tests.rewards_for_tests:token_id_reward",  # a gradient at every step
            },
        ),
    )
    train(cfg)
    run = tmp_path / "ppo"
    rows = _rows(run)
    for row in rows[1:]:
        assert all(math.isfinite(row[key]) for key in VALUE_METRICS), row
    assert rows[1]["value/mean"] == 0  # the zero-initialised head
    assert all("loss/policy" not in row for row in rows[1:3]) and "loss/policy" in rows[3]
    checkpoints = run / "checkpoints"
    # Warm-up: the policy is the model it started from, and nothing was published (version 0).
    assert_same_weights(micro_model_dir, checkpoints / "step-2" / "model")
    state = [json.loads((checkpoints / f"step-{s}" / "state.json").read_text()) for s in (1, 2, 3)]
    assert [s["version"] for s in state] == [0, 0, 1]
    assert [s["critic"]["updates"] for s in state] == [1, 2, 3]
    # The critic trained at every step, warm-up included; the policy from step 3 on.
    critic = [load_file(str(checkpoints / f"step-{s}" / "critic" / "value_head.safetensors")) for s in (1, 2)]
    assert not torch.equal(critic[0]["weight"], critic[1]["weight"])
    policy = [load_file(str(checkpoints / f"step-{s}" / "model" / "model.safetensors")) for s in (2, 3)]
    assert any(not torch.equal(policy[0][k], policy[1][k]) for k in policy[0])


def test_a_resumed_ppo_run_ends_with_the_same_policy_and_critic(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """SIGKILL between checkpoints 4 and 8, then `--resume`: the critic's weights, optimizer and update
    count come back with the policy's, so both end bit for bit as in an unbroken run."""
    straight, killed = killed_and_resumed(
        tmp_path, micro_model_dir, **PPO, **{"critic.warmup_steps": 2, "critic.value_clip": 0.2}
    )
    assert_same_weights(straight, killed)
    assert_same_weights(straight.parent / "critic", killed.parent / "critic")
    rows = [_rows(tmp_path / run) for run in ("straight", "killed")]
    assert [r.get("value/loss") for r in rows[0]] == [r.get("value/loss") for r in rows[1]]


def test_an_estimators_hyperparameters_are_its_keyword_parameters_beyond_the_batch() -> None:
    assert hyperparameters("grpo") == {"eps", "norm_by_std", "std_over"}
    assert hyperparameters("gae") == {"gamma", "lam", "whiten", "eps"}
    assert reads_values("gae") and not reads_values("grpo") and not reads_values("turn_grpo")


def test_a_new_estimator_gets_its_hyperparameters_from_the_algorithm_section(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An estimator function that names a hyperparameter with an `algorithm` key receives that key's value
    (one without is `algorithm.advantage_args`: tests/test_advantage_args.py); one that reads `values`
    makes the critic required."""
    seen: dict[str, float] = {}

    def discounted_mean(
        *,
        token_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        gamma: float,
        lam: float = 9.0,
        **_: object,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seen.update(gamma=gamma, lam=lam)
        return token_rewards * gamma, token_rewards

    def with_values(*, token_rewards: torch.Tensor, values: torch.Tensor, **_: object) -> tuple[Any, Any]:
        return token_rewards - values, token_rewards

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "discounted_mean", discounted_mean)
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "with_values", with_values)
    cfg = load_config(
        None, ["algorithm.advantage=discounted_mean", "algorithm.gamma=0.5", "algorithm.lam=0.25"]
    )
    rollouts = [Rollout("s", 0, [5, 6, 7], 1, [1, 1], [0.0, 0.0], reward=2.0)]
    mask = torch.tensor([[1.0, 1.0]])
    advantages, _, _ = compute_advantages(rollouts, cfg.algorithm, response_mask=mask, old_logp=mask * 0)
    assert seen == {"gamma": 0.5, "lam": 0.25}
    assert advantages.tolist() == [[0.0, 1.0]]  # the reward on the last token, times gamma
    with pytest.raises(ConfigError, match=r"algorithm\.advantage: with_values needs a critic section"):
        load_config(None, ["algorithm.advantage=with_values"])
    assert load_config(None, ["algorithm.advantage=with_values", "critic={}"]).critic is not None
