"""A gymnasium environment for the control tests (`control.env: tests.control_envs_for_tests:Walk`)."""

from __future__ import annotations

import os
import signal
from typing import Any, ClassVar

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


class Bright(gym.Env):
    """Image observations for the CNN: uint8 (2, 36, 36), black but for a bright 4×4 block in channel 1.
    The block in the left half rewards action 0, in the right half action 1 (reward 1, else 0); one step
    per episode. Renders rgb_array frames (the block in white) for the video tests."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 10}
    SIZE = 36

    def __init__(self, render_mode: str | None = None) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (2, self.SIZE, self.SIZE), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.render_mode = render_mode
        self.row = self.col = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.row, self.col = (int(x) for x in self.np_random.integers(0, self.SIZE - 4, size=2))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        right = self.col + 2 >= self.SIZE // 2
        return self._obs(), float(int(action) == int(right)), True, False, {}

    def _obs(self) -> np.ndarray:
        obs = np.zeros((2, self.SIZE, self.SIZE), np.uint8)
        obs[1, self.row : self.row + 4, self.col : self.col + 4] = 255
        return obs

    def render(self) -> np.ndarray:
        return np.repeat(self._obs()[1][:, :, None], 3, axis=2)


# A PettingZoo env for tests/test_control_marl.py (`control.env: pettingzoo:tests.control_envs_for_tests`).
try:
    from pettingzoo import ParallelEnv
except ImportError:  # pettingzoo is in the dev extra; without it only the marl tests skip
    ParallelEnv = object


class Pair(ParallelEnv):  # type: ignore[misc, valid-type]
    """Two agents, `left` and `right`, each observing [base + its position, its index]; action 1 moves the
    agent one step (reward 1 for left, 2 for right: the rows' rewards differ), 0 stays (reward 0). `base`
    is the reset seed, so copies reset with different seeds are told apart. All agents terminate once both
    positions reach `goal`, and are truncated after `limit` steps. Deterministic: a test can say every
    value."""

    metadata: ClassVar[dict[str, Any]] = {"name": "pair_v0"}

    def __init__(
        self, limit: int = 3, goal: int | None = None, sigterm_at: int | None = None, token: str = ""
    ) -> None:
        self.sigterm_at, self.token = sigterm_at, token  # SIGTERM at the token's step `sigterm_at`
        self.possible_agents = ["left", "right"]
        self.agents: list[str] = []
        self.limit, self.goal = limit, goal
        self.base, self.steps = 0, 0
        self.position = dict.fromkeys(self.possible_agents, 0)

    def observation_space(self, agent: str) -> gym.spaces.Box:
        return gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent: str) -> gym.spaces.Discrete:
        return gym.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        if seed is not None:
            self.base = seed
        self.agents = list(self.possible_agents)
        self.steps = 0
        self.position = dict.fromkeys(self.possible_agents, 0)
        return self._obs(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        _count_down(self)
        self.steps += 1
        rewards = {}
        for i, agent in enumerate(self.agents):
            self.position[agent] += int(actions[agent])
            rewards[agent] = float(actions[agent]) * (i + 1)
        terminated = self.goal is not None and all(p >= self.goal for p in self.position.values())
        truncated = not terminated and self.steps >= self.limit
        obs = self._obs()
        terms = dict.fromkeys(self.agents, terminated)
        truncs = dict.fromkeys(self.agents, truncated)
        infos: dict[str, dict] = {agent: {} for agent in self.agents}
        if terminated or truncated:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def _obs(self) -> dict[str, np.ndarray]:
        return {
            agent: np.array([self.base + self.position[agent], i], dtype=np.float32)
            for i, agent in enumerate(self.possible_agents)
        }


def parallel_env(**kwargs: Any) -> Pair:
    return Pair(**kwargs)


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


class SignalAfter(gym.Wrapper):  # type: ignore[type-arg]
    """The registered env `env` that sends this process SIGTERM at the `steps`-th step taken by the envs of
    `token` (every copy and eval env counts): a deterministic stop for the run-contract tests, as a
    scheduler's `kill` would come, at a known point of the run."""

    def __init__(self, env: str, steps: int, token: str, **kwargs: Any) -> None:
        super().__init__(gym.make(env, **kwargs))
        self.sigterm_at: int | None = steps
        self.token = token

    def step(self, action: Any) -> Any:
        _count_down(self)
        return super().step(action)


# Steps taken by every env of a token (training and eval envs alike), and the tokens signalled: once, so a
# resumed run in the same process is not stopped again.
_STEPS: dict[str, int] = {}
_SIGNALLED: set[str] = set()


def _count_down(env: Any) -> None:
    if env.sigterm_at is None or env.token in _SIGNALLED:
        return
    _STEPS[env.token] = _STEPS.get(env.token, 0) + 1
    if _STEPS[env.token] == env.sigterm_at:
        _SIGNALLED.add(env.token)
        os.kill(os.getpid(), signal.SIGTERM)
