"""Multi-agent control (issue 32): IPPO / MAPPO on PettingZoo's parallel API, agents as batch rows.

Exact values on `tests.control_envs_for_tests.Pair` (two agents, deterministic); mpe2's simple_spread
checked against a plain copy of itself."""

from __future__ import annotations

import json
import sys
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hone.algorithms import ADVANTAGE_ESTIMATORS
from hone.cli import main
from hone.config import ControlConfig, load_config
from hone.control.algos.ppo import collect as _collect
from hone.control.envs import ControlEnvError
from hone.control.multiagent import ParallelBatch, SharedActorCritic
from hone.control.multiagent import evaluate_team as evaluate
from hone.control.normalize import Normalizer
from hone.tracking import read_metrics

pytest.importorskip("pettingzoo")

PAIR = "pettingzoo:tests.control_envs_for_tests"


@pytest.fixture
def simple_spread_v3() -> Any:
    return pytest.importorskip("mpe2.simple_spread_v3")


def _pair(**env_args: int) -> ControlConfig:
    args = "{" + ", ".join(f"{k}: {v}" for k, v in env_args.items()) + "}"
    return _control(f"control.env={PAIR}", f"control.env_args={args}")


def _always_move(policy: SharedActorCritic) -> SharedActorCritic:
    """The actor's last layer set so every agent picks action 1 (sampled or argmax) whatever it sees."""
    with torch.no_grad():
        policy.actor[-1].weight.zero_()
        policy.actor[-1].bias.copy_(torch.tensor([-30.0, 30.0]))
    return policy


def _identity(rows: int) -> Normalizer:
    return Normalizer(1, rows, observations=False, rewards=False, gamma=0.99, clip_obs=10, clip_reward=10)


def test_agent_rows_map_to_their_envs_and_agents() -> None:
    batch = ParallelBatch(_pair(limit=5), num_envs=2, centralized=True)
    rows, _ = batch.reset(seed=10)  # copy e is reset with seed 10 + e: its observations start at 10 + e
    assert batch.num_rows == 4 and batch.obs_dim == 2 and batch.critic_dim == 2 * 2 + 2
    assert rows.tolist() == [
        # own obs | joint obs (left's, right's) | one-hot agent index
        [10, 0, 10, 0, 10, 1, 1, 0],  # copy 0, left
        [10, 1, 10, 0, 10, 1, 0, 1],  # copy 0, right
        [11, 0, 11, 0, 11, 1, 1, 0],  # copy 1, left
        [11, 1, 11, 0, 11, 1, 0, 1],  # copy 1, right
    ]
    # row e*2 + a is copy e's agent a: only copy 0's left and copy 1's right move
    rows, reward, terminated, truncated, info = batch.step(np.array([1, 0, 0, 1]))
    assert reward.tolist() == [1, 0, 0, 2]  # each agent's own reward on its own row
    assert rows[:, :2].tolist() == [[11, 0], [10, 1], [11, 0], [12, 1]]
    assert rows[0, 2:6].tolist() == [11, 0, 10, 1] and rows[3, 2:6].tolist() == [11, 0, 12, 1]
    assert not terminated.any() and not truncated.any() and "episode" not in info
    batch.close()

    independent = ParallelBatch(_pair(limit=5), num_envs=2, centralized=False)
    rows, _ = independent.reset(seed=10)
    assert independent.critic_dim == 0 and rows.tolist() == [[10, 0], [10, 1], [11, 0], [11, 1]]
    independent.close()


@pytest.mark.parametrize("centralized", [True, False])
def test_the_centralised_critic_reads_the_joint_observation_and_the_actor_its_own(centralized: bool) -> None:
    batch = ParallelBatch(_pair(), num_envs=1, centralized=centralized)
    rows = torch.as_tensor(batch.reset(seed=4)[0])
    batch.close()
    torch.manual_seed(0)
    policy = SharedActorCritic(batch.obs_dim, batch.critic_dim, batch.single_action_space, [8], "tanh")
    assert policy.critic[0].in_features == (6 if centralized else 2)
    with torch.no_grad():
        assert torch.equal(
            policy.value(rows), policy.critic(rows[:, 2:] if centralized else rows).squeeze(-1)
        )
        assert torch.equal(policy.dist(rows).logits, policy.dist(rows[:, :2]).logits)
        # left's row with right's observation changed: left's centralised value moves, its actor does not,
        # and an independent critic (left's own observation only) does not either
        moved = rows.clone()
        if centralized:
            moved[0, 4] += 5.0
        else:
            moved[1, 0] += 5.0  # right's own row changes; left's row is untouched
        assert torch.equal(policy.dist(moved[:1]).logits, policy.dist(rows[:1]).logits)
        changed = not torch.equal(policy.value(moved[:1]), policy.value(rows[:1]))
        assert changed == centralized


@pytest.mark.parametrize("centralized", [True, False])
@pytest.mark.parametrize("ending", ["truncated", "terminated"])
def test_a_truncated_episode_is_bootstrapped_and_a_terminated_one_is_not(
    centralized: bool, ending: str
) -> None:
    """Both agents always move. Truncation (limit 3) at step 3: next_values there are V(final rows) per agent
    row, not V(the next episode's first rows), and GAE bootstraps with them. Termination (goal 2) at step 2:
    GAE's advantage there is r - V(s), no bootstrap."""
    control = _pair(limit=3) if ending == "truncated" else _pair(limit=9, goal=2)
    end = 2 if ending == "truncated" else 1  # the index of the episode's last step
    batch = ParallelBatch(control, num_envs=1, centralized=centralized)
    torch.manual_seed(0)
    policy = _always_move(
        SharedActorCritic(batch.obs_dim, batch.critic_dim, batch.single_action_space, [8], "tanh")
    )
    episodes: deque[tuple[float, int]] = deque(maxlen=100)
    obs = torch.as_tensor(batch.reset(seed=5)[0])
    out, _ = _collect(policy, batch, obs, end + 2, _identity(2), (None, None), episodes)
    batch.close()
    steps = end + 1
    assert out["actions"].tolist() == [[1] * (end + 2)] * 2
    assert out["rewards"][:, :steps].tolist() == [[1.0] * steps, [2.0] * steps]  # left 1, right 2 per step
    assert out["dones"].tolist() == [[k == end for k in range(end + 2)]] * 2  # [agent row, time]
    assert out["terminated"].any().item() == (ending == "terminated")
    # the episode's final rows, built by hand: both agents at position `steps`, seed 5
    at = 5.0 + steps
    joint = [at, 0.0, at, 1.0]
    final = torch.tensor([[at, 0.0, *joint, 1.0, 0.0], [at, 1.0, *joint, 0.0, 1.0]])
    final = final if centralized else final[:, :2]
    with torch.no_grad():
        v_final = policy.value(final)
        v_reset = policy.value(out["obs"][:, end + 1])  # the next episode's first rows
    assert torch.allclose(out["next_values"][:, end], v_final)
    assert not torch.allclose(v_final, v_reset)
    assert torch.allclose(out["next_values"][:, end - 1], out["values"][:, end])  # mid-episode: V(s')
    gamma = 0.9
    advantages, _ = ADVANTAGE_ESTIMATORS["gae"](
        token_rewards=out["rewards"],
        response_mask=torch.ones_like(out["rewards"]),
        values=out["values"],
        next_values=out["next_values"],
        dones=out["dones"],
        terminated=out["terminated"],
        gamma=gamma,
        lam=0.5,
    )
    bootstrap = gamma * v_final if ending == "truncated" else torch.zeros(2)
    assert torch.allclose(advantages[:, end], out["rewards"][:, end] + bootstrap - out["values"][:, end])
    # the team's episode, once, on the first agent's row: the sum over both agents of their rewards
    assert list(episodes) == [(3.0 * steps, steps)]


def test_train_then_hone_eval_of_a_multi_agent_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "simple-spread-mappo",
        f"run.dir={tmp_path}",
        "run.name=p",
        f"control.env={PAIR}",
        "control.env_args={limit: 4}",
        "control.num_envs=2",
        "control.rollout_steps=8",
        "control.env_steps=32",
        "control.eval_episodes=2",
        "control.normalize_obs=true",
        "logging.progress=false",
        "logging.tensorboard=false",
        "logging.plot=[]",
    ]
    assert main(["train", *args]) == 0
    rows = read_metrics(tmp_path / "p" / "metrics.jsonl")
    assert rows[-1]["env/steps"] == 32 and rows[-1]["episode/length"] == 4
    trained = rows[-1]["eval/return"]
    capsys.readouterr()
    assert main(["eval", "--run", str(tmp_path / "p"), "--out", str(tmp_path / "e.json")]) == 0
    # the same shared policy, the same eval seeds and frozen statistics: the same team return
    assert json.loads((tmp_path / "e.json").read_text())["eval/return"] == pytest.approx(trained)
    # a team's run goes on from its checkpoint (exactly: tests/test_run_families.py)
    assert main(["train", "--resume", str(tmp_path / "p"), "control.env_steps=64"]) == 0
    assert read_metrics(tmp_path / "p" / "metrics.jsonl")[-1]["env/steps"] == 64


def test_the_random_team_and_a_deterministic_team_return() -> None:
    control = _pair(limit=4)
    policy = SharedActorCritic(
        2, 0, ParallelBatch(control, 1, centralized=False).single_action_space, [8], "tanh"
    )
    control = control.model_copy(update={"multi_agent_critic": "independent", "eval_episodes": 50})
    assert evaluate(_always_move(policy), control) == {"eval/return": 12.0, "eval/length": 4.0}  # 4 x (1 + 2)
    random = evaluate(None, control)["eval/return"]  # each agent moves w.p. 1/2: 4 x 1.5 = 6 expected
    assert 4.5 < random < 7.5


def _control(*overrides: str) -> ControlConfig:
    cfg = load_config("simple-spread-mappo", list(overrides))
    assert cfg.control is not None
    return cfg.control


def _reference(simple_spread_v3: Any, seed: int) -> tuple[object, np.ndarray]:
    """A plain simple_spread (the recipe's arguments) reset with `seed`: its [agent, obs] observations."""
    env = simple_spread_v3.parallel_env(N=3, max_cycles=25, local_ratio=0.5, continuous_actions=False)
    obs, _ = env.reset(seed=seed)
    return env, np.stack([obs[a] for a in env.possible_agents])


def test_simple_spread_rows_match_a_plain_copy(simple_spread_v3: Any) -> None:
    batch = ParallelBatch(_control(), num_envs=2, centralized=True)
    rows, _ = batch.reset(seed=7)
    assert batch.num_rows == 6 and batch.obs_dim == 18 and batch.critic_dim == 3 * 18 + 3
    assert rows.shape == (6, 18 + 57)
    for e in range(2):  # copy e is reset with seed + e; its agent a is row e*3 + a
        _, ref = _reference(simple_spread_v3, 7 + e)
        for a in range(3):
            row = rows[e * 3 + a]
            assert np.allclose(row[:18], ref[a])  # the actor's input: the agent's own observation
            assert np.allclose(row[18:72], ref.reshape(-1))  # the critic's: every agent's, in agent order
            assert row[72:].tolist() == np.eye(3)[a].tolist()  # ... and the agent's index
    # actions go to their rows' agents: stepping copy 1 by hand with the same actions gives the same rows
    actions = np.array([0, 1, 2, 3, 4, 1])
    rows, reward, terminated, truncated, info = batch.step(actions)
    env, _ = _reference(simple_spread_v3, 8)
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
    tmp_path: Path, critic: str, capsys: pytest.CaptureFixture[str], simple_spread_v3: Any
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
        f"control.ppo.multi_agent_critic={critic}",
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
        ((), "pettingzoo:tests.control_envs_for_testz", "no module 'tests.control_envs_for_testz'"),
        ((), "pettingzoo:hone.config", "hone.config has no parallel_env()"),
        (("pettingzoo",), "pettingzoo:mpe2.simple_spread_v3", "needs pettingzoo: pip install -e '.[marl]'"),
        (("mpe2",), "pettingzoo:mpe2.simple_spread_v3", "needs mpe2: pip install -e '.[marl]'"),
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
        for loaded in [m for m in sys.modules if m.startswith(module + ".")]:  # as if never imported
            monkeypatch.delitem(sys.modules, loaded)
    args = ["simple-spread-mappo", f"run.dir={tmp_path}", "run.name=m", f"control.env={env}"]
    assert main(["train", *args, "logging.progress=false"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"control.env {env!r}" in err and message in err, err
    assert not (tmp_path / "m").exists()


def test_a_misspelt_mpe2_env_names_the_ones_it_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], simple_spread_v3: Any
) -> None:
    env = "pettingzoo:mpe2.simple_spred_v3"
    args = ["simple-spread-mappo", f"run.dir={tmp_path}", "run.name=m", f"control.env={env}"]
    assert main(["train", *args, "logging.progress=false"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no module 'mpe2.simple_spred_v3'; mpe2 has: " in err, err
    assert "simple_spread_v3" in err


def test_an_env_error_is_a_control_env_error() -> None:
    with pytest.raises(ControlEnvError, match="TypeError"):
        ParallelBatch(_pair(bogus=1), num_envs=1, centralized=True)


@pytest.mark.parametrize("centralized", [True, False])
def test_truncation_at_max_cycles_is_bootstrapped_from_the_final_observation(
    centralized: bool, simple_spread_v3: Any
) -> None:
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


def test_a_team_run_records_eval_videos(tmp_path: Path, simple_spread_v3: Any) -> None:
    """The team's eval episodes are recorded as one agent's are (the first copy's rgb_array frames)."""
    pytest.importorskip("imageio_ffmpeg", reason="imageio-ffmpeg (the video extra) is not installed")
    args = [
        "simple-spread-mappo", f"run.dir={tmp_path}", "run.name=v", "control.num_envs=2",
        "control.rollout_steps=25", "control.env_steps=100", "control.eval_episodes=1", "logging.video=true",
        "logging.video_episodes=1", "logging.progress=false", "logging.tensorboard=false", "logging.plot=[]",
    ]  # fmt: skip
    assert main(["train", *args]) == 0
    videos = sorted(p.name for p in (tmp_path / "v" / "videos").iterdir())
    assert videos == ["step-0-episode-0.mp4", "step-2-episode-0.mp4"]
    assert all((tmp_path / "v" / "videos" / name).stat().st_size > 1000 for name in videos)
