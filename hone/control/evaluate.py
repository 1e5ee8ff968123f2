"""What every control loop shares: the deterministic evaluation and the run's result (PPO's
`hone.orchestration.control_loop` and SAC/TD3's `hone.orchestration.control_offpolicy`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from hone.config import ControlConfig
from hone.control.envs import make_eval_env
from hone.control.normalize import Normalizer

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
    policy: Acting, control: ControlConfig, normalizer: Normalizer | None = None
) -> dict[str, float]:
    """`control.eval_episodes` episodes of the deterministic policy (argmax, or the Gaussian's mean) on
    fixed seeds, observations normalised with the training statistics as they are now (frozen here).
    `policy.act` returns actions in the environment's units (Box actions are clipped to the bounds here)."""
    env = make_eval_env(control)
    low, high = action_bounds(env.action_space)
    returns, lengths = [], []
    try:
        for i in range(control.eval_episodes):
            obs, _ = env.reset(seed=EVAL_SEED + i)
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
            returns.append(total)
            lengths.append(length)
    finally:
        env.close()
    return {"eval/return": float(np.mean(returns)), "eval/length": float(np.mean(lengths))}


def action_bounds(space: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
    return (None, None) if hasattr(space, "n") else (space.low, space.high)


def as_tensor(x: Any) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.float32)
