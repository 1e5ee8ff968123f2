"""What every control loop shares: the deterministic evaluation (one agent; a team's is
`hone.control.multiagent.evaluate_team`), the training-episode metrics and the run's result."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from hone.config import ControlConfig
from hone.control.envs import make_eval_env
from hone.control.normalize import Normalizer
from hone.control.video import Video

EVAL_SEED = 10_000  # eval episode i is reset with EVAL_SEED + i: the same episodes every eval


@dataclass
class ControlResult:
    """A control run's result in its own terms: RL steps, environment steps (offline: gradient updates on
    the dataset, `updates`), and the deterministic eval before and after."""

    run_dir: Path
    steps: int
    env_steps: int
    start_eval: dict[str, float]
    final_eval: dict[str, float]
    updates: int = 0
    stopped_by: str = ""  # "time limit", "stop_at_return" or "" (every step ran)

    def summary(self, algorithm: str) -> dict[str, Any]:
        """summary.json of the run."""
        return {
            "family": "control", "algorithm": algorithm, "steps": self.steps, "env_steps": self.env_steps,
            "updates": self.updates, "stopped_by": self.stopped_by or "end",
            "start_eval": self.start_eval, "final_eval": self.final_eval,
        }  # fmt: skip


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

    def act(obs: Any) -> Any:
        seen = obs if normalizer is None else normalizer.observations(obs[None], update=False)[0]
        with torch.no_grad():
            action = policy.act(as_tensor(seen).unsqueeze(0), deterministic=True)[0].numpy()
        return np.clip(action, low, high) if low is not None else int(action)

    return play_episodes(env, control.eval_episodes, act, video, step)


def play_episodes(
    env: Any, episodes: int, act: Callable[[Any], Any], video: Video | None, step: int
) -> dict[str, float]:
    """Episode i reset with seed EVAL_SEED + i and played with `act(observation) -> action` to its end
    (every row of a team's env done); `eval/return` (summed over a team's agents) and `eval/length`,
    means over the episodes. Closes `env`."""
    returns, lengths = [], []
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=EVAL_SEED + i)
            recording = video.episode(env, step, i) if video else None
            if recording:
                recording.frame()
            total, length, done = 0.0, 0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(act(obs))
                total, length = total + float(np.sum(reward)), length + 1
                done = bool(np.logical_or(terminated, truncated).all())
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


def unit_action(policy: Any, obs: torch.Tensor) -> torch.Tensor:
    """A Box policy's deterministic action in the networks' [-1, 1] units (its `act` is in the
    environment's): what offline metrics and FQE compare with a dataset's rescaled actions."""
    return (policy.act(obs, deterministic=True) - policy.bias) / policy.scale
