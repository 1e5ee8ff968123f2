"""A gymnasium environment for the backend tests (`control.env: tests.control_envs_backends:Grid`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class Grid(gym.Env):
    """A 2x2 array observation (what `control.flatten_obs` is for) and a `hit` flag in every step's info:
    an episode lasts `length` steps and ends with hit = (its last action was 1)."""

    def __init__(self, length: int = 2) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.length, self.steps = length, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros((2, 2), np.float32), {"hit": False}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps += 1
        obs = np.full((2, 2), self.steps / 10, np.float32)
        return obs, 0.0, self.steps >= self.length, False, {"hit": bool(action == 1)}
