"""A control run's saved policy: the `model/` folder (its final one, and each checkpoint's) that `hone eval`,
`hone collect` and `hone eval --ope` play. It holds `policy.safetensors` (the algorithm's acting network:
PPO's actor-critic, SAC's / TD3's actor with its action scale and bias, …) and `normalization.json` (the
observation statistics it was trained with, `null` when observations are not normalised). The network is
rebuilt from the recipe by the algorithm's registered `acting_network`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from hone.config import ControlConfig
from hone.control.algos.registry import control_algorithm
from hone.control.envs import ControlEnvError, make_eval_env
from hone.control.evaluate import evaluate
from hone.control.normalize import Normalizer
from hone.control.video import Video

POLICY_FILE, NORMALIZATION_FILE = "policy.safetensors", "normalization.json"


def build_policy(control: ControlConfig, observation_space: Any, action_space: Any) -> Any:
    """The network that acts for `control.algorithm` (all with `act(obs, deterministic)`)."""
    return control_algorithm(control.algorithm).acting_network(control, observation_space, action_space)


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


def load_policy(control: ControlConfig, folder: Path) -> tuple[Any, Normalizer, tuple[Any, Any]]:
    """The saved policy in `folder` (a run's `model/`), its observation statistics (frozen), and the
    environment's (observation, action) spaces it was built for."""
    env = make_eval_env(control)
    spaces = (env.observation_space, env.action_space)
    env.close()
    policy = build_policy(control, *spaces)
    normalizer = load_saved(control, folder, policy, int(spaces[0].shape[0]), rows=1)
    return policy, normalizer, spaces


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
    normalizer = Normalizer.of(control, obs_dim, rows)
    stats_file = folder / NORMALIZATION_FILE
    stats = json.loads(stats_file.read_text()) if stats_file.is_file() else None
    if normalizer.obs_rms is not None:
        if stats is None:
            raise ControlEnvError(f"model.path {folder}: no observation statistics in {NORMALIZATION_FILE}")
        normalizer.obs_rms.mean, normalizer.obs_rms.var = np.array(stats["mean"]), np.array(stats["var"])
    return normalizer
