"""Multi-agent control (issue 32): IPPO / MAPPO on PettingZoo's parallel API, agents as batch rows."""

from __future__ import annotations

import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

from hone.cli import main
from hone.config import ControlConfig, load_config
from hone.control.envs import ControlEnvError
from hone.control.multiagent import ParallelBatch, SharedActorCritic
from hone.control.normalize import Normalizer
from hone.orchestration.control_loop import _collect
from hone.tracking import read_metrics

pytest.importorskip("pettingzoo")
simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")


def _control(*overrides: str) -> ControlConfig:
    cfg = load_config("simple-spread-mappo", list(overrides))
    assert cfg.control is not None
    return cfg.control


def _reference(seed: int) -> tuple[object, np.ndarray]:
    """A plain simple_spread (the recipe's arguments) reset with `seed`: its [agent, obs] observations."""
    env = simple_spread_v3.parallel_env(N=3, max_cycles=25, local_ratio=0.5, continuous_actions=False)
    obs, _ = env.reset(seed=seed)
    return env, np.stack([obs[a] for a in env.possible_agents])


def test_agents_are_rows_and_the_centralised_critic_reads_the_joint_observation() -> None:
    batch = ParallelBatch(_control(), num_envs=2, centralized=True)
    rows, _ = batch.reset(seed=7)
    assert batch.num_rows == 6 and batch.obs_dim == 18 and batch.critic_dim == 3 * 18 + 3
    assert rows.shape == (6, 18 + 57)
    for e in range(2):  # copy e is reset with seed + e; its agent a is row e*3 + a
        _, ref = _reference(7 + e)
        for a in range(3):
            row = rows[e * 3 + a]
            assert np.allclose(row[:18], ref[a])  # the actor's input: the agent's own observation
            assert np.allclose(row[18:72], ref.reshape(-1))  # the critic's: every agent's, in agent order
            assert row[72:].tolist() == np.eye(3)[a].tolist()  # ... and the agent's index
    # actions go to their rows' agents: stepping copy 1 by hand with the same actions gives the same rows
    actions = np.array([0, 1, 2, 3, 4, 1])
    rows, reward, terminated, truncated, info = batch.step(actions)
    env, _ = _reference(8)
    obs, rew, _, _, _ = env.step({a: int(x) for a, x in zip(env.possible_agents, actions[3:], strict=True)})
    assert np.allclose(rows[3:, :18], np.stack([obs[a] for a in env.possible_agents]))
    assert np.allclose(reward[3:], [rew[a] for a in env.possible_agents])
    assert reward.shape == terminated.shape == truncated.shape == (6,) and "episode" not in info
    batch.close()

    independent = ParallelBatch(_control(), num_envs=2, centralized=False)
    rows, _ = independent.reset(seed=7)
    assert independent.critic_dim == 0 and rows.shape == (6, 18)
    policy = SharedActorCritic(18, 0, independent.single_action_space, [8], "tanh")
    assert policy.critic[0].in_features == 18
    independent.close()


@pytest.mark.parametrize("critic", ["centralized", "independent"])
def test_mappo_and_ippo_train_through_hone_train(
    tmp_path: Path, critic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "simple-spread-mappo",
        f"run.dir={tmp_path}",
        "run.name=m",
        "run.eval_every=1",
        "control.num_envs=2",
        "control.rollout_steps=32",
        "control.env_steps=128",
        "control.eval_episodes=2",
        f"control.multi_agent_critic={critic}",
        "logging.progress=false",
        "logging.tensorboard=false",
        "logging.plot=[]",
    ]
    assert main(["train", *args]) == 0
    rows = read_metrics(tmp_path / "m" / "metrics.jsonl")
    steps = [row for row in rows if row["step"] > 0]
    assert len(steps) == 2 and steps[-1]["env/steps"] == 128  # 128 / (2 envs x 32 steps)
    keys = {"episode/return", "episode/length", "eval/return", "loss/policy", "loss/value", "entropy"}
    assert keys <= set(steps[-1])
    assert steps[-1]["episode/length"] == 25  # MPE's max_cycles: 64 steps = 2 whole episodes per copy
    assert -400 < steps[-1]["episode/return"] < 0  # a team return: the sum over the 3 agents
    assert (tmp_path / "m" / "model" / "policy.safetensors").is_file()
    assert "eval return after" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("blocked", "env", "message"),
    [
        ((), "pettingzoo:mpe2.simple_spred_v3", "cannot import 'mpe2.simple_spred_v3'"),
        ((), "pettingzoo:hone.config", "hone.config has no parallel_env()"),
        (("pettingzoo",), "pettingzoo:mpe2.simple_spread_v3", "needs pettingzoo: pip install"),
        (("mpe2", "mpe2.simple_spread_v3"), "pettingzoo:mpe2.simple_spread_v3", "cannot import 'mpe2."),
    ],
)
def test_a_missing_package_or_an_unknown_env_is_one_line_and_writes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    blocked: tuple[str, ...],
    env: str,
    message: str,
) -> None:
    for module in blocked:  # None in sys.modules: `import` raises ImportError, as when not installed
        monkeypatch.setitem(sys.modules, module, None)
    args = ["simple-spread-mappo", f"run.dir={tmp_path}", "run.name=m", f"control.env={env}"]
    assert main(["train", *args, "logging.progress=false"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"control.env {env!r}" in err and message in err, err
    assert not (tmp_path / "m").exists()


def test_an_env_error_is_a_control_env_error() -> None:
    with pytest.raises(ControlEnvError, match="TypeError"):
        ParallelBatch(_control("control.env_args={bogus: 1}"), num_envs=1, centralized=True)


@pytest.mark.parametrize("centralized", [True, False])
def test_truncation_at_max_cycles_is_bootstrapped_from_the_final_observation(centralized: bool) -> None:
    """max_cycles 3: every agent is truncated (not terminated) at step 3; SAME_STEP autoreset puts the next
    episode's first observation in the next rows and the final one in info: next_values at step 3 must be
    V(final rows), per agent row, and not V(the new episode's first rows)."""
    control = _control("control.env_args={N: 3, max_cycles: 3, local_ratio: 0.5, continuous_actions: false}")
    batch = ParallelBatch(control, num_envs=1, centralized=centralized)
    policy = SharedActorCritic(batch.obs_dim, batch.critic_dim, batch.single_action_space, [16], "tanh")
    identity = Normalizer(1, 3, observations=False, rewards=False, gamma=0.99, clip_obs=10, clip_reward=10)
    episodes: deque[tuple[float, int]] = deque(maxlen=100)
    obs = torch.as_tensor(batch.reset(seed=3)[0])
    out, _ = _collect(policy, batch, obs, 4, identity, (None, None), episodes)
    batch.close()
    assert out["dones"].shape == (3, 4)  # [env x agent, time]
    assert out["dones"].tolist() == [[False, False, True, False]] * 3
    assert not out["terminated"].any()
    # replay the same actions to get the final observation of the truncated episode
    replay = ParallelBatch(control, num_envs=1, centralized=centralized)
    replay.reset(seed=3)
    for k in range(3):
        _, _, _, truncated, info = replay.step(out["actions"][:, k].numpy())
    replay.close()
    assert truncated.all()
    with torch.no_grad():
        final_values = policy.value(torch.as_tensor(info["final_obs"]))
        reset_values = policy.value(out["obs"][:, 3])  # the next episode's first rows
    assert torch.allclose(out["next_values"][:, 2], final_values)
    assert not torch.allclose(out["next_values"][:, 2], reset_values)
    assert torch.allclose(out["next_values"][:, 1], policy.value(out["obs"][:, 2]))  # mid-episode: V(s')
    assert len(episodes) == 1 and episodes[0][1] == 3  # one team episode, on the first agent's row
    assert episodes[0][0] == pytest.approx(float(out["rewards"][:, :3].sum()))
