"""Off-policy control (issue 32): SAC and TD3 through `hone train`, the replay buffer, the critic target."""

from __future__ import annotations

import json
import math
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

from hone.cli import main
from hone.config import load_config
from hone.control.algos import check_algorithm
from hone.control.algos.sac_td3 import OffPolicyLearner
from hone.control.envs import ControlEnvError, make_vector_env
from hone.control.loops.offpolicy import env_step
from hone.control.replay import ReplayBuffer
from hone.tracking import read_metrics

pytest.importorskip("gymnasium")

SLIDE = "tests.control_envs_for_tests:Slide"


def _quick(tmp_path: Path, recipe: str = "pendulum-sac", **extra: object) -> list[str]:
    settings = {
        "run.dir": tmp_path,
        "run.name": "c",
        "run.eval_every": 2,
        "control.env_steps": 400,
        "control.rollout_steps": 100,
        "control.offpolicy.learning_starts": 100,
        "control.offpolicy.batch_size": 32,
        "control.hidden_sizes": "[32,32]",
        "control.eval_episodes": 1,
        "logging.progress": "false",
        "logging.tensorboard": "false",
        "logging.plot": "[]",
        **extra,
    }
    return [recipe, *(f"{k}={v}" for k, v in settings.items())]


def test_pendulum_sac_trains_through_hone_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *_quick(tmp_path)]) == 0
    rows = read_metrics(tmp_path / "c" / "metrics.jsonl")
    steps = [row for row in rows if row["step"] > 0]
    assert [row["env/steps"] for row in steps] == [100, 200, 300, 400]  # 1 env x 100 steps per RL step
    assert "loss/q" not in steps[0]  # the first 100 steps are random actions: no update yet
    assert {"loss/q", "loss/actor", "alpha", "loss/alpha", "q/mean", "episode/return"} <= set(steps[-1])
    assert 0 < steps[-1]["alpha"] < 1  # autotuned from 1.0
    assert [row["step"] for row in rows if "eval/return" in row] == [0, 2, 4]
    assert (tmp_path / "c" / "model" / "policy.safetensors").is_file()
    assert "eval return after" in capsys.readouterr().out


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_hone_eval_of_an_offpolicy_run_plays_its_deterministic_actor(
    tmp_path: Path, algorithm: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {"control.algorithm": algorithm, "control.env_steps": 200, "run.eval_every": 0}
    assert main(["train", *_quick(tmp_path, **settings)]) == 0
    last = read_metrics(tmp_path / "c" / "metrics.jsonl")[-1]
    assert {"loss/q", "loss/actor", "q/mean", "eval/return", "env/steps", "env/steps_per_s"} <= set(last)
    assert ("alpha" in last) == (algorithm == "sac") and ("entropy" in last) == (algorithm == "sac")
    capsys.readouterr()
    assert main(["eval", "--run", str(tmp_path / "c"), "--out", str(tmp_path / "e.json")]) == 0
    # tanh(μ(s)) (SAC) or μ(s) (TD3) on the same eval seeds: the return the run logged at its end
    assert json.loads((tmp_path / "e.json").read_text())["eval/return"] == pytest.approx(last["eval/return"])


def test_a_discrete_env_with_sac_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *_quick(tmp_path, **{"control.env": "CartPole-v1"})]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "control.algorithm sac needs a Box action space; CartPole-v1 has Discrete(2): use ppo" in err
    assert not (tmp_path / "c").exists()


def test_sac_refuses_keys_of_another_algorithm_and_normalisation() -> None:
    cfg = load_config("pendulum-sac")
    assert cfg.control is not None and cfg.control.algorithm == "sac"
    with pytest.raises(ControlEnvError, match=r"control\.ppo\.lam: not read by control\.algorithm sac"):
        check_algorithm(load_config("pendulum-sac", ["control.ppo.lam=0.9"]))
    with pytest.raises(ControlEnvError, match=r"not with control\.algorithm sac"):
        check_algorithm(load_config("pendulum-sac", ["control.normalize_obs=true"]))


def _slide(goal: int, limit: int, algorithm: str = "sac") -> tuple[object, OffPolicyLearner]:
    cfg = load_config(
        "pendulum-sac",
        [
            f"control.env={SLIDE}",
            "control.num_envs=1",
            f"control.env_args={{goal: {goal}, limit: {limit}}}",
            f"control.algorithm={algorithm}",
            "control.hidden_sizes=[8]",
            "control.offpolicy.init_alpha=1.0e-9",
        ],
    )
    assert cfg.control is not None
    envs = make_vector_env(cfg.control, seed=0)
    return envs, OffPolicyLearner(cfg.control, 1, envs.single_action_space, sac=algorithm == "sac")


@pytest.mark.parametrize(
    ("goal", "limit", "terminated"),
    [(5, 3, [0, 0, 0, 0]), (2, 9, [0, 1, 0, 1])],  # truncated at step 3; terminated at steps 2 and 4
)
def test_the_buffer_stores_the_final_observation_and_terminated_not_truncated(
    goal: int, limit: int, terminated: list[int]
) -> None:
    """Slide, always +1: an episode ends at step 3 by its time limit (goal 5) or at step 2 at its goal
    (goal 2). SAME_STEP autoreset hands back the next episode's first observation (0.0); the buffer must
    hold the ended episode's final one instead, and mark only the goal as terminal."""
    envs, _ = _slide(goal, limit)
    buffer = ReplayBuffer(10, 1, 1, seed=0)
    episodes: deque[tuple[float, int]] = deque(maxlen=100)
    obs = envs.reset(seed=0)[0]  # type: ignore[attr-defined]
    seen = []
    for _ in range(4):
        seen.append(float(obs[0, 0]))
        one = np.ones((1, 1), np.float32)
        obs = env_step(envs, obs, one, one, buffer, episodes)
    envs.close()  # type: ignore[attr-defined]
    end = min(goal, limit) / 10
    expected_next = [0.1, 0.2, 0.3, 0.1] if goal > limit else [0.1, end, 0.1, end]
    assert buffer.obs[:4, 0].tolist() == pytest.approx(seen)
    assert buffer.next_obs[:4, 0].tolist() == pytest.approx(expected_next)
    assert buffer.terminated[:4].tolist() == terminated
    assert buffer.rewards[:4].tolist() == [1, 1, 1, 1] and len(buffer) == 4
    assert [length for _, length in episodes] == ([3] if goal > limit else [2, 2])


def test_buffer_sampling_is_seeded_and_its_state_round_trips() -> None:
    def filled(seed: int) -> ReplayBuffer:
        buffer = ReplayBuffer(4, 2, 1, seed=seed)
        for i in range(6):  # wraps: rows hold transitions 4, 5, 2, 3
            x = np.full((1, 2), float(i), np.float32)
            buffer.add(x, x[:, :1], np.array([i], np.float32), x + 1, np.array([i == 5]))
        return buffer

    a, b = filled(7), filled(7)
    assert len(a) == 4 and a.pos == 2 and a.rewards.tolist() == [4, 5, 2, 3]
    assert torch.equal(a.sample(16)["rewards"], b.sample(16)["rewards"])
    assert not torch.equal(filled(8).sample(16)["rewards"], filled(7).sample(16)["rewards"])
    state = a.state_dict()
    expected = a.sample(32)
    c = ReplayBuffer(4, 2, 1, seed=123)
    c.load_state_dict(state)
    got = c.sample(32)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert (c.pos, len(c)) == (a.pos, len(a))
    batch = a.sample(64)
    assert torch.equal(batch["next_obs"], batch["obs"] + 1) and set(batch["terminated"].tolist()) <= {
        0.0,
        1.0,
    }


def _constant_critic(learner: OffPolicyLearner, value: float) -> None:
    """Every target critic outputs `value` whatever (s, a): zero weights, the last bias at `value`."""
    with torch.no_grad():
        for net in (learner.critic_target.q1, learner.critic_target.q2):
            for p in net.parameters():
                p.zero_()
            net[-1].bias.fill_(value)


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_the_critic_target_does_not_bootstrap_a_terminated_transition(algorithm: str) -> None:
    """With target critics fixed at Q' = 5 (and SAC's α ≈ 0): y = r + γ·5 for a live or truncated
    transition, y = r for a terminated one."""
    envs, learner = _slide(5, 3, algorithm)
    envs.close()  # type: ignore[attr-defined]
    _constant_critic(learner, 5.0)
    batch = {
        "obs": torch.zeros(3, 1),
        "actions": torch.zeros(3, 1),
        "rewards": torch.tensor([1.0, 2.0, -3.0]),
        "next_obs": torch.tensor([[0.1], [0.2], [0.3]]),
        "terminated": torch.tensor([0.0, 1.0, 0.0]),
    }
    y = learner.critic_targets(batch)
    gamma = learner.gamma
    assert gamma == 0.99
    assert y.tolist() == pytest.approx([1.0 + gamma * 5, 2.0, -3.0 + gamma * 5], abs=1e-5)
    assert not math.isnan(float(y.sum()))


def test_halfcheetah_sac_has_cleanrls_two_learning_rates_and_delayed_actor() -> None:
    """CleanRL's sac_continuous_action: policy lr 3e-4, q lr 1e-3 (also α's), policy_frequency 2 = two actor
    (and α) steps every second update, the critics and their targets every update."""
    overrides = [f"control.env={SLIDE}", "control.hidden_sizes=[8]", "control.offpolicy.batch_size=4"]
    cfg = load_config("halfcheetah-sac", overrides)
    assert cfg.control is not None
    control = cfg.control
    assert (control.env_steps, control.offpolicy.buffer_size, control.offpolicy.learning_starts) == (
        1_000_000,
        1_000_000,
        5000,
    )
    assert (
        control.offpolicy.batch_size,
        control.offpolicy.tau,
        cfg.control.gamma,
        control.offpolicy.autotune,
    ) == (4, 0.005, 0.99, True)
    envs = make_vector_env(control, seed=0)
    learner = OffPolicyLearner(control, 1, envs.single_action_space, sac=True)
    envs.close()
    assert [g["lr"] for g in learner.actor_opt.param_groups] == [3e-4]
    assert learner.alpha_opt is not None
    assert [g["lr"] for g in (*learner.critic_opt.param_groups, *learner.alpha_opt.param_groups)] == [
        1e-3
    ] * 2
    buffer = ReplayBuffer(16, 1, 1, seed=0)
    x = np.zeros((16, 1), np.float32)
    buffer.add(x, x, np.ones(16, np.float32), x, np.zeros(16))
    steps = []
    for _ in range(4):
        metrics = learner.update(buffer.sample(4))
        steps.append([_adam_steps(o) for o in (learner.critic_opt, learner.actor_opt, learner.alpha_opt)])
        assert ("loss/actor" in metrics) == (learner.updates % 2 == 0)
    assert steps == [[1, 0, 0], [2, 2, 2], [3, 2, 2], [4, 4, 4]]


def _adam_steps(optimizer: torch.optim.Optimizer) -> int:
    states = list(optimizer.state.values())
    return int(states[0]["step"]) if states else 0
