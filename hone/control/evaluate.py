"""What every control loop shares: the deterministic evaluation, the run's result, and the saved policy
that `hone eval` plays (PPO's `hone.control.loops.onpolicy`, SAC/TD3's
`hone.control.loops.offpolicy`).

A control run's `model/` folder (its final one, and each checkpoint's) holds `policy.safetensors` (PPO's
actor-critic, or SAC's / TD3's actor with its action scale and bias) and `normalization.json` (the
observation statistics it was trained with, `null` when observations are not normalised)."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from hone.config import ControlConfig
from hone.control.encoders import make_policy
from hone.control.envs import ControlEnvError, make_eval_env
from hone.control.normalize import Normalizer
from hone.control.offpolicy import DeterministicActor, GaussianActor, SquashedGaussianActor
from hone.control.policy import ActorCritic
from hone.control.video import Video

AnyPolicy = ActorCritic | SquashedGaussianActor | DeterministicActor | GaussianActor
POLICY_FILE, NORMALIZATION_FILE = "policy.safetensors", "normalization.json"
EVAL_SEED = 10_000  # eval episode i is reset with EVAL_SEED + i: the same episodes every eval


@dataclass
class ControlResult:
    run_dir: Path
    steps: int
    env_steps: int
    start_eval: dict[str, float]
    final_eval: dict[str, float]


class Acting(Protocol):
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor: ...


def evaluate(
    policy: Acting,
    control: ControlConfig,
    normalizer: Normalizer | None = None,
    video: Video | None = None,
    step: int = 0,
) -> dict[str, float]:
    """`control.eval_episodes` episodes of the deterministic policy (argmax, or the Gaussian's mean) on
    fixed seeds, observations normalised with the training statistics as they are now (frozen here);
    with `video` (`logging.video`) the first episodes recorded as videos/step-<step>-episode-<i>.mp4.
    `policy.act` returns actions in the environment's units (Box actions are clipped to the bounds here)."""
    env = video.open_env(lambda render: make_eval_env(control, render)) if video else make_eval_env(control)
    low, high = action_bounds(env.action_space)
    returns, lengths = [], []
    try:
        for i in range(control.eval_episodes):
            obs, _ = env.reset(seed=EVAL_SEED + i)
            recording = video.episode(env, step, i) if video else None
            if recording:
                recording.frame()
            total, length, done = 0.0, 0, False
            while not done:
                seen = obs if normalizer is None else normalizer.observations(obs[None], update=False)[0]
                with torch.no_grad():
                    action = policy.act(as_tensor(seen).unsqueeze(0), deterministic=True)[0].numpy()
                if low is not None:
                    action = np.clip(action, low, high)
                obs, reward, terminated, truncated, _ = env.step(action if low is not None else int(action))
                total, length = total + float(reward), length + 1
                done = bool(terminated or truncated)
                if recording:
                    recording.frame()
            if recording:
                recording.close()
            returns.append(total)
            lengths.append(length)
    finally:
        env.close()
    return {"eval/return": float(np.mean(returns)), "eval/length": float(np.mean(lengths))}


def episode_metrics(episodes: Iterable[tuple[float, int]]) -> dict[str, float]:
    """`episode/return` and `episode/length`: the means over the last training episodes (none: empty)."""
    done = list(episodes)
    if not done:
        return {}
    return {
        "episode/return": float(np.mean([r for r, _ in done])),
        "episode/length": float(np.mean([length for _, length in done])),
    }


def solved(control: ControlConfig, episodes: deque[tuple[float, int]]) -> bool:
    """`control.stop_at_return` reached: a full window of training episodes averages at least that."""
    return (
        control.stop_at_return is not None
        and len(episodes) == episodes.maxlen
        and float(np.mean([r for r, _ in episodes])) >= control.stop_at_return
    )


def action_bounds(space: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
    return (None, None) if hasattr(space, "n") else (space.low, space.high)


def as_tensor(x: Any) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.float32)


def build_policy(control: ControlConfig, observation_space: Any, action_space: Any) -> AnyPolicy:
    """The network that acts for `control.algorithm`: PPO's actor-critic (an MLP, or on images the CNN),
    SAC's and CQL's squashed Gaussian actor, TD3's, TD3+BC's and BC's deterministic one, or IQL's and AWR's
    Gaussian (all with `act(obs, deterministic)`)."""
    hidden, activation = control.hidden_sizes, control.activation
    obs_dim = int(observation_space.shape[0])
    if control.algorithm in ("sac", "cql"):
        return SquashedGaussianActor(obs_dim, action_space, hidden, activation)
    if control.algorithm in ("td3", "td3_bc", "bc"):
        return DeterministicActor(obs_dim, action_space, hidden, activation)
    if control.algorithm in ("iql", "awr"):
        return GaussianActor(obs_dim, action_space, hidden, activation)
    return make_policy(control, observation_space, action_space)


def save_policy(policy: torch.nn.Module, normalizer: Normalizer | None, folder: Path) -> None:
    """`folder/policy.safetensors` and `folder/normalization.json` (what `evaluate_saved` reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in policy.state_dict().items()}, str(folder / POLICY_FILE))
    stats = None if normalizer is None else normalizer.state()
    (folder / NORMALIZATION_FILE).write_text(json.dumps(stats))


def evaluate_saved(control: ControlConfig, folder: Path, video: Video | None = None) -> dict[str, float]:
    """`hone eval` of a control run's policy in `folder` (its `model/`, which `--run` finds):
    `control.eval_episodes` deterministic episodes with the observation statistics it was trained with."""
    policy, normalizer, _ = load_policy(control, folder)
    return evaluate(policy, control, normalizer, video)


def load_policy(control: ControlConfig, folder: Path) -> tuple[AnyPolicy, Normalizer, tuple[Any, Any]]:
    """The saved policy in `folder` (a run's `model/`), its observation statistics (frozen), and the
    environment's (observation, action) spaces it was built for."""
    env = make_eval_env(control)
    spaces = (env.observation_space, env.action_space)
    env.close()
    policy = build_policy(control, *spaces)
    normalizer = load_saved(control, folder, policy, int(spaces[0].shape[0]), rows=1)
    return policy, normalizer, spaces


def unit_action(policy: Any, obs: torch.Tensor) -> torch.Tensor:
    """A Box policy's deterministic action in the networks' [-1, 1] units (its `act` is in the
    environment's): what offline metrics and FQE compare with a dataset's rescaled actions."""
    return (policy.act(obs, deterministic=True) - policy.bias) / policy.scale


def load_saved(
    control: ControlConfig, folder: Path, policy: torch.nn.Module, obs_dim: int, rows: int
) -> Normalizer:
    """The saved weights in `folder` into `policy`, and a normaliser (of `rows` rows) holding the saved
    observation statistics, frozen: a missing, damaged or mismatched file is one line."""
    if not (folder / POLICY_FILE).is_file():
        raise ControlEnvError(
            f"model.path {folder}: no {POLICY_FILE} (evaluate a control run: --run runs/<name>)"
        )
    try:
        policy.load_state_dict(load_file(str(folder / POLICY_FILE)))
    except (OSError, RuntimeError, ValueError) as e:  # a damaged file, or another algorithm's network
        detail = " ".join(str(e).split())[:200]
        raise ControlEnvError(
            f"model.path {folder}: {POLICY_FILE} is not a control.algorithm {control.algorithm} policy of "
            f"this run's shape: {detail}"
        ) from None
    normalizer = Normalizer(
        obs_dim,
        rows,
        observations=control.normalize_obs,
        rewards=False,
        gamma=1.0,  # rewards are not normalised in eval: unread
        clip_obs=control.clip_obs,
        clip_reward=control.clip_reward,
    )
    stats_file = folder / NORMALIZATION_FILE
    stats = json.loads(stats_file.read_text()) if stats_file.is_file() else None
    if normalizer.obs_rms is not None:
        if stats is None:
            raise ControlEnvError(f"model.path {folder}: no observation statistics in {NORMALIZATION_FILE}")
        normalizer.obs_rms.mean, normalizer.obs_rms.var = np.array(stats["mean"]), np.array(stats["var"])
    return normalizer
