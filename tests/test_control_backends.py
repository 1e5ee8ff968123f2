"""Control's environment backends (issue 32): gymnasium sync/async and envpool behind one SAME_STEP
contract, observation flattening, episode info metrics, and one-line errors for missing packages."""

from __future__ import annotations

import sys
import warnings
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

from hone.cli import main
from hone.config import load_config
from hone.control.algos.ppo import collect as _collect
from hone.control.envs import make_vector_env
from hone.control.normalize import Normalizer
from hone.control.policy import ActorCritic
from hone.tracking import read_metrics

gym = pytest.importorskip("gymnasium")


def _quick(tmp_path: Path, **extra: object) -> list[str]:
    settings = {
        "run.dir": tmp_path,
        "run.name": "c",
        "control.env_steps": 512,
        "control.eval_episodes": 1,
        "logging.progress": "false",
        "logging.tensorboard": "false",
        "logging.plot": "[]",
        **extra,
    }
    return ["cartpole-ppo", *(f"{k}={v}" for k, v in settings.items())]


def _one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], **extra: object) -> str:
    assert main(["train", *_quick(tmp_path, **extra)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert not (tmp_path / "c").exists()
    return err


def _check_cartpole_contract(backend: str, steps: int = 300, limit: int = 20) -> tuple[int, int]:
    """Random actions on CartPole-v1 (4 envs, episodes cut at `limit` steps). Every transition a backend
    hands out must be a real CartPole step, replayed from its observation on gymnasium's own CartPole:
    `next_obs`, or at an episode end `info["final_obs"]`; the next episode's first observation comes in
    the same step (SAME_STEP: no fake reward-0 transition after an end), and the episode statistics are
    the sums of the rewards handed out. Returns (terminated, truncated) episode counts."""
    cfg = load_config(
        "cartpole-ppo",
        [
            f"control.vectorization={backend}",
            "control.num_envs=4",
            f"control.env_args={{max_episode_steps: {limit}}}",
        ],
    )
    assert cfg.control is not None
    envs = make_vector_env(cfg.control, seed=3)
    ref = gym.make("CartPole-v1").unwrapped
    ref.reset(seed=0)
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=3)
    returns, lengths, counts = np.zeros(4), np.zeros(4, int), [0, 0]
    try:
        for _ in range(steps):
            actions = rng.integers(0, 2, 4)
            next_obs, reward, terminated, truncated, info = envs.step(actions)
            for i in range(4):
                ended = bool(terminated[i] or truncated[i])
                landed = info["final_obs"][i] if ended else next_obs[i]
                ref.state, ref.steps_beyond_terminated = obs[i].astype(np.float64), None
                expected, ref_reward, ref_terminated, _, _ = ref.step(int(actions[i]))
                assert np.allclose(landed, expected, atol=1e-4), (backend, i, obs[i], landed, expected)
                returns[i], lengths[i] = returns[i] + reward[i], lengths[i] + 1
                assert reward[i] == ref_reward == 1.0 and bool(truncated[i]) == (lengths[i] == limit)
                # (a fall on the limit's step: gymnasium says terminated and truncated, envpool only
                # truncated, its terminated being done & ~trunc)
                assert bool(terminated[i]) == ref_terminated or (backend == "envpool" and truncated[i])
                if ended:
                    assert info["_episode"][i]
                    assert info["episode"]["r"][i] == returns[i] and info["episode"]["l"][i] == lengths[i]
                    assert np.all(np.abs(next_obs[i]) <= 0.05)  # CartPole's reset draws from ±0.05
                    counts[0 if terminated[i] else 1] += 1
                    returns[i], lengths[i] = 0.0, 0
                elif "_episode" in info:
                    assert not info["_episode"][i]
            obs = next_obs
    finally:
        envs.close()
    return counts[0], counts[1]


@pytest.mark.parametrize("backend", ["sync", "envpool"])
def test_every_backend_hands_out_real_transitions_with_same_step_resets(backend: str) -> None:
    if backend == "envpool":
        pytest.importorskip("envpool")
    terminated, truncated = _check_cartpole_contract(backend)
    assert terminated > 5 and truncated > 5  # both kinds of episode end were met and checked


def test_raw_envpool_is_next_step_so_the_adapter_is_needed() -> None:
    """The premise of hone.control.envpool_env: envpool's own gymnasium API returns, on the step after an
    episode end, the reset observation with reward 0 and the action ignored. If a new envpool changes this,
    the adapter's extra reset must be revisited."""
    envpool = pytest.importorskip("envpool")
    with warnings.catch_warnings():  # its Box spaces cast float64 bounds to float32, with a warning
        warnings.simplefilter("ignore", UserWarning)
        pool = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=1, seed=0, max_episode_steps=3)
        assert pool.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    pool.reset()
    for _ in range(3):
        _, reward, _, truncated, info = pool.step(np.zeros(1, dtype=np.int64))
    assert truncated[0]
    _, reward, terminated, truncated, info = pool.step(np.zeros(1, dtype=np.int64))
    assert reward[0] == 0.0 and not terminated[0] and not truncated[0] and info["elapsed_step"][0] == 0
    pool.close()


def test_ppo_trains_on_envpool_through_hone_train(tmp_path: Path) -> None:
    """envpool's pool keys (num_threads) in control.env_args reach envpool, not gymnasium's eval env."""
    pytest.importorskip("envpool")
    extra = {"control.vectorization": "envpool", "control.env_args": "{num_threads: 2}"}
    assert main(["train", *_quick(tmp_path, **extra)]) == 0
    rows = [row for row in read_metrics(tmp_path / "c" / "metrics.jsonl") if row["step"] > 0]
    assert rows[-1]["env/steps"] == 512 and rows[-1]["episode/length"] > 0


def test_envpool_takes_only_its_own_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("envpool")
    walk = "tests.control_envs_for_tests:Walk"
    err = _one_line_error(tmp_path, capsys, **{"control.vectorization": "envpool", "control.env": walk})
    assert "not an envpool id" in err and "control.vectorization: sync" in err


def test_a_missing_envpool_is_one_line_with_its_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool -> ImportError
    err = _one_line_error(tmp_path, capsys, **{"control.vectorization": "envpool"})
    assert "needs envpool: pip install -e '.[envpool]'" in err


@pytest.mark.parametrize(
    ("env", "module", "install"),
    [
        ("HalfCheetah-v5", "mujoco", 'pip install "gymnasium[mujoco]==1.4.*"'),
        ("ALE/Pong-v5", "ale_py", "pip install -e '.[atari]'"),
        ("highway-fast-v0", "highway_env", "pip install -e '.[highway]'"),
        ("my_driving_envs:road-v0", "my_driving_envs", "ModuleNotFoundError"),
    ],
)
def test_a_missing_env_package_is_one_line_before_anything_runs(
    env: str,
    module: str,
    install: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed, even where it is
    err = _one_line_error(tmp_path, capsys, **{"control.env": env})
    needs = "ale-py" if module == "ale_py" else module
    assert f"control.env '{env}' needs {needs}" in err and install in err


def test_module_colon_id_imports_the_registering_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gymnasium's own `pkg.mod:env-id` spelling: the module is imported (it registers the id), then the id
    is made; a `pkg.mod:Class` (an identifier after the colon) stays Hone's class form."""
    from hone.control.envs import env_id

    (tmp_path / "registers_a_walk.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('hone-test/Walk-v0', entry_point='tests.control_envs_for_tests:Walk')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "hone-test/Walk-v0" not in gym.registry
    cfg = load_config("cartpole-ppo", ["control.env=registers_a_walk:hone-test/Walk-v0"])
    assert cfg.control is not None and env_id(cfg.control) == "hone-test/Walk-v0"
    assert "hone-test/Walk-v0" in gym.registry
    del gym.registry["hone-test/Walk-v0"]
    cfg = load_config("cartpole-ppo", ["control.env=tests.control_envs_for_tests:Walk"])
    assert cfg.control is not None and env_id(cfg.control).startswith("hone-user/")


def _identity(size: int) -> Normalizer:
    return Normalizer(size, 2, observations=False, rewards=False, gamma=0.99, clip_obs=10, clip_reward=10)


@pytest.mark.parametrize("backend", ["sync", "async"])
def test_flattened_observations_and_episode_info_keys(backend: str) -> None:
    """Grid: 2x2 observations flattened to 4; each 2-step episode ends with info hit = its last action.
    Always acting 1, every finished episode has hit 1.0, read from the ended step's info (final_info)."""
    cfg = load_config(
        "cartpole-ppo",
        [
            "control.env=tests.control_envs_backends:Grid",
            "control.num_envs=2",
            f"control.vectorization={backend}",
            "control.flatten_obs=true",
            "control.episode_info_keys=[hit]",
        ],
    )
    assert cfg.control is not None
    envs = make_vector_env(cfg.control, seed=0)
    assert envs.single_observation_space.shape == (4,)
    policy = ActorCritic(4, envs.single_action_space, [8])
    with torch.no_grad():  # always action 1
        policy.actor[-1].bias.copy_(torch.tensor([-50.0, 50.0]))
    obs = torch.as_tensor(envs.reset(seed=0)[0])
    episodes: deque[tuple[float, int]] = deque(maxlen=100)
    ended: deque[dict[str, float]] = deque(maxlen=100)
    batch, _ = _collect(policy, envs, obs, 4, _identity(4), (None, None), episodes, (cfg.control, ended))
    envs.close()
    assert batch["obs"].shape == (2, 4, 4)
    assert list(ended) == [{"hit": 1.0}] * 4 and [length for _, length in episodes] == [2] * 4


def test_an_info_key_the_env_does_not_give_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *_quick(tmp_path, **{"control.episode_info_keys": "[crashd]"})]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "control.episode_info_keys ['crashd']" in err


def test_the_highway_recipe_trains_and_reports_its_collision_rate(tmp_path: Path) -> None:
    """recipes/highway-ppo.yaml on highway-env itself, a few steps: the id registers by Hone's import, the
    5x5 Kinematics observation is flattened, and episode/crashed comes from the info of episode ends."""
    pytest.importorskip("highway_env")
    args = [
        "highway-ppo",
        f"run.dir={tmp_path}",
        "run.name=c",
        "control.num_envs=2",
        "control.rollout_steps=16",
        "control.env_steps=64",
        "control.eval_episodes=1",
        "control.ppo.mini_batches=2",
        "logging.progress=false",
        "logging.tensorboard=false",
        "logging.plot=[]",
    ]
    assert main(["train", *args]) == 0
    rows = [row for row in read_metrics(tmp_path / "c" / "metrics.jsonl") if row["step"] > 0]
    crashed = [row["episode/crashed"] for row in rows if "episode/crashed" in row]
    assert crashed and all(0.0 <= c <= 1.0 for c in crashed) and "eval/return" in rows[-1]
