"""`hone collect`: play policies in a recipe's environment and record the episodes as a Minari dataset
(`hone.control.datasets.write_dataset`), the data of the offline algorithms.

A policy is `random` (the action space's uniform samples) or a control run (`runs/<name>`, its `model/`,
or a checkpoint's `checkpoints/step-N/model`), played as it was trained: its own recipe's network and
observation statistics, its stochastic actions (PPO's and SAC's samples, as D4RL recorded its "medium"
sets; TD3's deterministic action), plus optional Gaussian noise of std `noise` half action ranges and,
with probability `epsilon`, a uniformly random action. Several policies share the episodes in turn, in
the order given (a run's checkpoints, early to late, for a "medium-replay"-like mixture)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hone.config import ControlConfig
from hone.control.datasets import Episode
from hone.control.errors import ControlEnvError
from hone.control.evaluate import action_bounds, as_tensor
from hone.control.normalize import Normalizer
from hone.control.policy_io import build_policy, load_saved


@dataclass
class Behaviour:
    """One policy that records episodes: `act(obs)` in env units, its name for the dataset's card."""

    name: str
    policy: Any  # none: random
    normalizer: Normalizer | None

    def act(self, obs: np.ndarray, space: Any) -> np.ndarray:
        if self.policy is None:
            return np.asarray(space.sample())
        seen = obs if self.normalizer is None else self.normalizer.observations(obs[None], update=False)[0]
        with torch.no_grad():
            return self.policy.act(as_tensor(seen).unsqueeze(0), deterministic=False)[0].numpy()


def load_behaviour(source: str, env: Any) -> Behaviour:
    """`random`, or the control run / model folder `source` for `env`'s spaces; one line when it is not."""
    if source == "random":
        return Behaviour("random", None, None)
    from hone.config import load_config

    folder = Path(source).expanduser()
    model = folder / "model" if (folder / "model").is_dir() else folder
    config = next((p / "config.yaml" for p in (model, *model.parents) if (p / "config.yaml").is_file()), None)
    if not model.is_dir() or config is None:
        raise ControlEnvError(
            f"--policy {source}: not a control run (runs/<name>) or its model folder, nor 'random'"
        )
    run_control = load_config(config).control
    if run_control is None:
        raise ControlEnvError(f"--policy {source}: {config} is a language-model run, not a control run")
    policy = build_policy(run_control, env.observation_space, env.action_space)
    normalizer = load_saved(run_control, model, policy, int(env.observation_space.shape[0]), rows=1)
    return Behaviour(str(folder), policy, normalizer)


def record(
    env: Any,
    behaviours: list[Behaviour],
    episodes: int,
    *,
    seed: int,
    noise: float = 0.0,
    epsilon: float = 0.0,
) -> list[Episode]:
    """`episodes` episodes of `env` (reset with seed + i), shared by `behaviours` in turn: contiguous
    blocks, the first policy's first."""
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    low, high = action_bounds(env.action_space)
    recorded: list[Episode] = []
    for i in range(episodes):
        behaviour = behaviours[i * len(behaviours) // episodes]
        obs, _ = env.reset(seed=seed + i)
        observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
        done = False
        while not done:
            action = behaviour.act(obs, env.action_space)
            if low is not None:
                action = np.clip(action + rng.normal(0.0, noise, action.shape) * (high - low) / 2, low, high)
            if epsilon and rng.random() < epsilon:
                action = np.asarray(env.action_space.sample())
            action = action.astype(env.action_space.dtype) if low is not None else action
            obs, reward, terminated, truncated, _ = env.step(action if low is not None else int(action))
            observations.append(obs)
            actions.append(action)
            rewards.append(float(reward))
            terminations.append(bool(terminated))
            truncations.append(bool(truncated))
            done = bool(terminated or truncated)
        recorded.append(
            Episode(
                np.asarray(observations),
                np.asarray(actions),
                np.asarray(rewards),
                np.asarray(terminations),
                np.asarray(truncations),
                seed=seed + i,
            )
        )
    return recorded


def check_collect(control: ControlConfig | None, ref_min: float | None, ref_max: float | None) -> None:
    if control is None:
        raise ControlEnvError("hone collect: the recipe has no control: section (an environment to play)")
    if (ref_min is None) != (ref_max is None):  # Minari would estimate the missing one with 100 episodes
        raise ControlEnvError("hone collect: give --ref-min-score and --ref-max-score together")


def collect(control: ControlConfig | None, options: Any, seed: int) -> str:
    """`hone collect`: record `options.episodes` episodes and write the dataset; returns the summary."""
    from hone.control.datasets import check_new_dataset, write_dataset
    from hone.control.envs import make_eval_env

    check_collect(control, options.ref_min_score, options.ref_max_score)
    assert control is not None
    torch.set_num_threads(1)  # one small forward pass per step: threads only add overhead
    if options.episodes < 1:
        raise ControlEnvError(f"--episodes {options.episodes}: record at least one")
    if options.noise < 0 or not 0 <= options.epsilon <= 1:
        raise ControlEnvError(
            f"--noise {options.noise}, --epsilon {options.epsilon}: need noise >= 0 and epsilon in [0, 1]"
        )
    check_new_dataset(options.dataset_id, Path(options.out).expanduser())  # before minutes of recording
    env = make_eval_env(control)
    try:
        behaviours = [load_behaviour(source, env) for source in options.policy]
        episodes = record(
            env, behaviours, options.episodes, seed=seed, noise=options.noise, epsilon=options.epsilon
        )
        folder = write_dataset(
            options.dataset_id, episodes, root=Path(options.out).expanduser(), env=env,
            algorithm_name=" + ".join(b.name for b in behaviours),
            ref_min_score=options.ref_min_score, ref_max_score=options.ref_max_score,
            description=f"hone collect: {options.episodes} episodes of {control.env}, noise {options.noise}, "
            f"epsilon {options.epsilon}",
        )  # fmt: skip
    finally:
        env.close()
    returns = [float(e.rewards.sum()) for e in episodes]
    steps = sum(len(e.rewards) for e in episodes)
    return (
        f"{len(episodes)} episodes ({steps} steps) written to {folder}\n"
        f"behaviour return {np.mean(returns):.1f} ± {np.std(returns):.1f}\n"
        f"read it: data.source=minari:{options.dataset_id} control.offline.dataset_root={options.out}"
    )
