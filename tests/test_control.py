"""Control on the shared core (issue 32): PPO on gymnasium environments through `hone train`."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

from hone.algorithms.utils import masked_whiten
from hone.cli import main
from hone.config import load_config
from hone.control.algos.ppo import _whiten
from hone.control.algos.ppo import collect as _collect
from hone.control.envs import make_vector_env
from hone.control.normalize import Normalizer
from hone.control.policy import ActorCritic
from hone.tracking import read_metrics

pytest.importorskip("gymnasium")


def _quick(tmp_path: Path, recipe: str = "cartpole-ppo", **extra: object) -> list[str]:
    settings = {
        "run.dir": tmp_path,
        "run.name": "c",
        "run.eval_every": 2,
        "control.env_steps": 1024,
        "control.eval_episodes": 2,
        "logging.progress": "false",
        "logging.tensorboard": "false",
        "logging.plot": "[]",
        **extra,
    }
    return [recipe, *(f"{k}={v}" for k, v in settings.items())]


def test_cartpole_ppo_trains_through_hone_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *_quick(tmp_path)]) == 0
    rows = read_metrics(tmp_path / "c" / "metrics.jsonl")
    steps = [row for row in rows if row["step"] > 0]
    assert len(steps) == 4 and steps[-1]["env/steps"] == 1024  # 1024 / (8 envs x 32 steps)
    assert {"episode/return", "loss/policy", "loss/value", "entropy", "approx_kl"} <= set(steps[-1])
    assert [row["step"] for row in rows if "eval/return" in row] == [0, 2, 4]
    assert (tmp_path / "c" / "model" / "policy.safetensors").is_file()
    assert "eval return after" in capsys.readouterr().out


def test_a_continuous_env_with_normalisation_trains_and_saves_its_statistics(tmp_path: Path) -> None:
    args = _quick(
        tmp_path,
        **{
            "control.env": "Pendulum-v1",
            "control.normalize_obs": "true",
            "control.normalize_reward": "true",
            "control.eval_episodes": 1,
        },
    )
    assert main(["train", *args]) == 0
    stats = json.loads((tmp_path / "c" / "model" / "normalization.json").read_text())
    assert len(stats["mean"]) == 3 and any(abs(m) > 0 for m in stats["mean"])


def test_an_unknown_env_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *_quick(tmp_path, **{"control.env": "CartPol-v1"})]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "control.env 'CartPol-v1'" in err and "NameNotFound" in err
    assert not (tmp_path / "c").exists()


def test_control_takes_no_critic_section_and_no_language_model_key() -> None:
    from hone.config import ConfigError

    with pytest.raises(ConfigError, match=r"control: needs no critic section"):
        load_config("cartpole-ppo", ["critic.lr=1e-3"])
    with pytest.raises(ConfigError, match=r"control: algorithm\.advantage: language-model keys"):
        load_config("cartpole-ppo", ["algorithm.advantage=rloo"])


def _identity() -> Normalizer:
    return Normalizer(1, 1, observations=False, rewards=False, gamma=0.99, clip_obs=10, clip_reward=10)


def test_running_normalisation_matches_numpy_over_the_whole_stream() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(8, 3)) for _ in range(5)]
    norm = Normalizer(3, 8, observations=True, rewards=False, gamma=0.99, clip_obs=100, clip_reward=10)
    for batch in batches:
        out = norm.observations(batch)
    everything = np.concatenate(batches)
    assert norm.obs_rms is not None
    assert np.allclose(norm.obs_rms.mean, everything.mean(0), atol=1e-6)
    assert np.allclose(norm.obs_rms.var, everything.var(0), atol=1e-6)
    assert np.allclose(out, (batches[-1] - everything.mean(0)) / np.sqrt(everything.var(0) + 1e-8), atol=1e-5)
    frozen = norm.observations(batches[0], update=False)
    assert np.allclose(norm.obs_rms.mean, everything.mean(0), atol=1e-6) and frozen.shape == (8, 3)


def test_reward_scaling_divides_by_the_std_of_the_discounted_return() -> None:
    norm = Normalizer(1, 1, observations=False, rewards=True, gamma=0.5, clip_obs=10, clip_reward=100)
    seen = []
    for reward, done in [(1.0, False), (1.0, False), (1.0, True), (1.0, False)]:
        out = norm.rewards(np.array([reward]), np.array([done]))
        seen.append(float(out[0]))
    returns = np.array([1.0, 1.5, 1.75, 1.0])  # G = 0.5 G + r, reset after the episode end
    assert seen[-1] == pytest.approx(1.0 / np.sqrt(returns.var() + 1e-8), rel=1e-4)


def test_truncation_is_bootstrapped_from_the_final_observation_and_termination_is_not() -> None:
    """Walk (limit 3): always moving right, an episode is truncated at step 3 (position 3 < goal 5);
    SAME_STEP autoreset puts the next episode's first observation (0) in the next obs, and the final
    observation (0.3) in info: next_values must be V(0.3), not V(0)."""
    cfg = load_config("cartpole-ppo", ["control.env=tests.control_envs_for_tests:Walk", "control.num_envs=1"])
    assert cfg.control is not None
    envs = make_vector_env(cfg.control, seed=0)
    policy = ActorCritic(1, envs.single_action_space, [8])
    with torch.no_grad():  # always move right
        policy.actor[-1].bias.copy_(torch.tensor([-50.0, 50.0]))
    obs = torch.as_tensor(envs.reset(seed=0)[0])
    batch, _ = _collect(policy, envs, obs, 4, _identity(), (None, None), deque(maxlen=100))
    envs.close()
    value = lambda x: float(policy.value(torch.tensor([[x]])))  # noqa: E731
    assert batch["dones"][0].tolist() == [False, False, True, False]
    assert batch["terminated"][0].tolist() == [False, False, False, False]
    # step 3 is truncated at 0.3 (its next obs is the new episode's 0.0); step 4 goes 0.0 -> 0.1
    expected = [value(0.1), value(0.2), value(0.3), value(0.1)]
    assert batch["next_values"][0].tolist() == pytest.approx(expected)
    assert batch["obs"][0, :, 0].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.0])
    assert np.allclose(batch["rewards"][0].numpy(), [1, 1, 1, 1])


@pytest.mark.parametrize("rows", [2, 7, 256])
def test_ppo_whitens_a_mini_batch_as_the_shared_masked_whiten_does_bit_for_bit(rows: int) -> None:
    advantages = torch.randn(rows, 1, generator=torch.Generator().manual_seed(rows)) * 3 + 1
    whitened = _whiten(advantages)
    assert torch.equal(whitened, masked_whiten(advantages, torch.ones(rows, 1)))
    assert float(whitened.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(whitened.std()) == pytest.approx(1.0, abs=1e-6)


def test_hone_eval_of_a_control_run_plays_its_saved_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *_quick(tmp_path, **{"control.normalize_obs": "true"})]) == 0
    trained = read_metrics(tmp_path / "c" / "metrics.jsonl")[-1]["eval/return"]
    capsys.readouterr()
    assert main(["eval", "--run", str(tmp_path / "c"), "--out", str(tmp_path / "e.json")]) == 0
    # The same deterministic policy, the same eval seeds and frozen statistics: the same return.
    assert json.loads((tmp_path / "e.json").read_text())["eval/return"] == pytest.approx(trained)
