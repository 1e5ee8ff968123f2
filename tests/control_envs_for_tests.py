"""A gymnasium environment for the control tests (`control.env: tests.control_envs_for_tests:Walk`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class Walk(gym.Env):
    """Observation = [position / 10]; action 1 moves right (+1 reward), 0 stays (0). Terminates at
    position `goal`; truncated after `limit` steps. Deterministic, so a test can say what V sees."""

    def __init__(self, goal: int = 5, limit: int = 3) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.goal, self.limit = goal, limit
        self.position = self.steps = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position = self.steps = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps += 1
        self.position += int(action)
        terminated = self.position >= self.goal
        truncated = not terminated and self.steps >= self.limit
        return self._obs(), float(action), terminated, truncated, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.position / 10], dtype=np.float32)


class Slide(Walk):
    """Walk's continuous twin: a Box action in [-1, 1] moves by that much (reward = the action). Terminates
    at position `goal`, truncated after `limit` steps; observation [position / 10]."""

    def __init__(self, goal: int = 5, limit: int = 3) -> None:
        super().__init__(goal, limit)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.position_f = 0.0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        self.position_f = 0.0
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        move = float(np.asarray(action).reshape(-1)[0])
        self.steps += 1
        self.position_f += move
        terminated = self.position_f >= self.goal - 1e-6
        truncated = not terminated and self.steps >= self.limit
        return self._obs(), move, terminated, truncated, {}

    def _obs(self) -> np.ndarray:
        return np.array([getattr(self, "position_f", 0.0) / 10], dtype=np.float32)
