"""Control on image observations (issue 32): the Nature CNN, Atari preprocessing, `logging.video`."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from hone.cli import main
from hone.config import load_config
from hone.control.encoders import NatureCNN, encoder_kind, make_policy
from hone.control.envs import ControlEnvError, check_spaces, make_vector_env
from hone.tracking import read_metrics

gym = pytest.importorskip("gymnasium")

BRIGHT = "tests.control_envs_for_tests:Bright"


def _control(*overrides: str):  # type: ignore[no-untyped-def]
    cfg = load_config("cartpole-ppo", list(overrides))
    assert cfg.control is not None
    return cfg.control


def _quick(tmp_path: Path, **extra: object) -> list[str]:
    settings = {
        "run.dir": tmp_path,
        "run.name": "c",
        "logging.progress": "false",
        "logging.tensorboard": "false",
        "logging.plot": "[]",
        **extra,
    }
    return ["cartpole-ppo", *(f"{k}={v}" for k, v in settings.items())]


def _orthogonal_gain(weight: torch.Tensor) -> torch.Tensor:
    """W Wᵀ / gain² = I for an orthogonal init with fewer rows than columns: returns W Wᵀ."""
    w = weight.detach().reshape(weight.shape[0], -1)
    return w @ w.T


def test_nature_cnn_has_cleanrls_shapes_and_orthogonal_sqrt2_init() -> None:
    cnn = NatureCNN(4, 84, 84)
    convs = [m for m in cnn.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (4, 32, (8, 8), (4, 4)),
        (32, 64, (4, 4), (2, 2)),
        (64, 64, (3, 3), (1, 1)),
    ]
    linear = cnn.linear[0]
    assert (linear.in_features, linear.out_features) == (64 * 7 * 7, 512)
    for layer in [*convs, linear]:
        assert torch.allclose(_orthogonal_gain(layer.weight), 2 * torch.eye(layer.weight.shape[0]), atol=1e-4)
        assert not layer.bias.any()
    frames = torch.randint(0, 256, (3, 4, 84, 84)).float()
    out = cnn(frames)
    assert out.shape == (3, 512) and (out >= 0).all()  # ReLU features
    # Pixels are scaled by 1/255 inside: the same as the layers on frames / 255.
    assert torch.allclose(out, cnn.linear(cnn.convs(frames / 255.0)))


def test_an_image_space_gets_one_shared_cnn_and_linear_heads() -> None:
    image = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    control = _control("control.encoder=auto")
    assert encoder_kind(control, image) == "cnn"
    assert encoder_kind(control, gym.spaces.Box(-1, 1, (4,), np.float32)) == "mlp"
    policy = make_policy(control, image, gym.spaces.Discrete(6))
    assert sum(isinstance(m, NatureCNN) for m in policy.modules()) == 1
    (actor,), (critic,) = list(policy.actor), list(policy.critic)  # one linear layer each on the torso
    assert (actor.in_features, actor.out_features, critic.out_features) == (512, 6, 1)
    assert torch.allclose(_orthogonal_gain(actor.weight), 1e-4 * torch.eye(6), atol=1e-7)  # gain 0.01
    assert abs(float(critic.weight.norm()) - 1.0) < 1e-5  # gain 1 on a single row
    obs = torch.randint(0, 256, (5, 4, 84, 84)).float()
    dist, value = policy.dist_value(obs)
    assert dist.logits.shape == (5, 6) and value.shape == (5,)
    assert torch.allclose(value, policy.value(obs)) and torch.allclose(dist.logits, policy.dist(obs).logits)
    # Shared: a gradient of the value alone reaches the CNN the actor reads.
    policy.value(obs).sum().backward()
    assert policy.encoder is not None and policy.encoder.convs[0].weight.grad is not None


@pytest.mark.parametrize(
    ("overrides", "space", "message"),
    [
        (["control.encoder=cnn"], gym.spaces.Box(-1, 1, (4,), np.float32), "control.encoder cnn takes uint8"),
        (["control.encoder=mlp"], gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), "use control.encoder: cnn"),
        ([], gym.spaces.Box(0, 255, (4, 16, 16), np.uint8), "smaller than the Nature CNN's 36x36"),
        ([], gym.spaces.Box(0, 255, (210, 160, 3), np.uint8), "look channels-last"),
        (["control.normalize_obs=true"], gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), "normalize_obs"),
        ([], gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), "dict, tuple and discrete observations"),
    ],
)
def test_an_observation_space_no_policy_takes_is_one_line(
    overrides: list[str], space: object, message: str
) -> None:
    with pytest.raises(ControlEnvError, match=message) as err:
        check_spaces(_control(*overrides), space, gym.spaces.Discrete(2))
    assert "\n" not in str(err.value) and "control.env 'CartPole-v1'" in str(err.value)


def test_atari_preprocessing_of_a_non_ale_env_is_one_line() -> None:
    with pytest.raises(ControlEnvError, match=r"control.atari: true needs an ale-py environment"):
        make_vector_env(_control("control.atari=true"), seed=0)


def test_ppo_learns_the_image_task_through_hone_train(tmp_path: Path) -> None:
    """Bright: the side of a bright block says which action pays. Only a policy that reads the image with
    the CNN gets the deterministic eval return of 1 on the 20 fixed eval episodes (a blind one, ~0.5)."""
    args = _quick(
        tmp_path,
        **{
            "control.env": BRIGHT,
            "control.env_steps": 1536,
            "control.rollout_steps": 16,
            "control.eval_episodes": 20,
            "control.lr": 1e-3,
            "control.ppo.epochs": 4,
            "control.ppo.mini_batches": 2,
        },
    )
    assert main(["train", *args]) == 0
    rows = read_metrics(tmp_path / "c" / "metrics.jsonl")
    assert rows[-1]["eval/return"] == 1.0
    assert rows[-1]["episode/return"] >= 0.9  # the sampling policy too, over its last 100 episodes
    assert (tmp_path / "c" / "model" / "policy.safetensors").is_file()


def test_hone_eval_rebuilds_the_cnn_policy(tmp_path: Path) -> None:
    args = _quick(tmp_path, **{"control.env": BRIGHT, "control.env_steps": 256, "control.eval_episodes": 5})
    assert main(["train", *args]) == 0
    trained = read_metrics(tmp_path / "c" / "metrics.jsonl")[-1]["eval/return"]
    assert main(["eval", "--run", str(tmp_path / "c"), "--out", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["eval/return"] == pytest.approx(trained)


def _has(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


@pytest.mark.skipif(not _has("ale_py", "cv2"), reason="ale-py and opencv (the atari extra) are not installed")
def test_an_ale_id_gets_the_atari_preprocessing_in_the_vector_env() -> None:
    envs = make_vector_env(_control("control.env=ALE/Pong-v5", "control.num_envs=2"), seed=0)
    try:
        assert envs.single_observation_space.shape == (4, 84, 84)
        assert envs.single_observation_space.dtype == np.uint8 and envs.single_action_space.n == 6
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 4, 84, 84)
        rewards = [envs.step(np.array([0, 0]))[1] for _ in range(200)]
        assert set(np.unique(rewards)) <= {-1.0, 0.0, 1.0}  # clipped to the sign
    finally:
        envs.close()


@pytest.mark.skipif(not _has("ale_py", "cv2"), reason="ale-py and opencv (the atari extra) are not installed")
def test_a_lost_life_ends_a_training_episode_but_not_the_game() -> None:
    """Breakout with a paddle that stays put: each life is a terminated training episode; the game's
    statistics (`info["episode"]`) come once, at the end of the 5th life, with the unclipped score."""
    control = _control("control.env=ALE/Breakout-v5", "control.num_envs=1")
    envs = make_vector_env(control, seed=0)
    life_ends, games = 0, []
    try:
        envs.reset(seed=0)
        for _ in range(5000):
            _, _, terminated, _, info = envs.step(np.array([0]))
            life_ends += int(terminated[0])
            if "episode" in info and info["_episode"][0]:
                games.append(float(info["episode"]["r"][0]))
                break
    finally:
        envs.close()
    assert life_ends == 5 and len(games) == 1


def test_video_records_the_eval_episodes_as_mp4(tmp_path: Path) -> None:
    imageio = pytest.importorskip("imageio", reason="imageio (the video extra) is not installed")
    pytest.importorskip("imageio_ffmpeg", reason="imageio-ffmpeg (the video extra) is not installed")
    args = _quick(
        tmp_path,
        **{
            "run.eval_every": 2,
            "control.env_steps": 1024,
            "control.eval_episodes": 1,
            "logging.video": "true",
        },
    )
    assert main(["train", *args]) == 0
    videos = tmp_path / "c" / "videos"
    assert sorted(p.name for p in videos.iterdir()) == [f"step-{s}-episode-0.mp4" for s in (0, 2, 4)]
    rows = read_metrics(tmp_path / "c" / "metrics.jsonl")
    lengths = {row["step"]: row["eval/length"] for row in rows if "eval/length" in row}
    for step in (0, 2, 4):
        with imageio.get_reader(videos / f"step-{step}-episode-0.mp4") as reader:
            frames = list(reader.iter_data())
            fps = reader.get_meta_data()["fps"]
        assert len(frames) == lengths[step] + 1  # the reset frame and one per step of the eval episode
    assert frames[0].shape == (400, 600, 3) and fps == 50  # CartPole's render size and render_fps


def test_video_without_rendering_is_one_warning_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    args = _quick(
        tmp_path,
        **{
            "control.env": "tests.control_envs_for_tests:Walk",
            "control.env_steps": 512,
            "run.eval_every": 1,
            "logging.video": "true",
        },
    )
    with caplog.at_level(logging.WARNING):
        assert main(["train", *args]) == 0
    warnings = [r.getMessage() for r in caplog.records if "logging.video" in r.getMessage()]
    assert len(warnings) == 1 and "no video" in warnings[0]
    assert not (tmp_path / "c" / "videos").exists()
    assert (tmp_path / "c" / "model" / "policy.safetensors").is_file()


def test_the_new_keys_are_in_the_config_reference() -> None:
    reference = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md").read_text()
    for key in ("logging.video", "logging.video_episodes", "control.encoder", "control.atari"):
        assert f"| `{key}` |" in reference, key
