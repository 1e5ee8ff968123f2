"""The replay buffer of the off-policy control loop (SAC, TD3): a numpy ring buffer of transitions
(obs, action, reward, next_obs, terminated), sampled uniformly (Lin 1992; Mnih et al. 2015; SB3's
`ReplayBuffer`, CleanRL's use of it).

- `next_obs` is the observation the action led to: at an episode end under SAME_STEP autoreset that is the
  ended episode's *final* observation (`info["final_obs"]`), not the next episode's first one, which the
  vector env returns in its place. The caller passes the real one.
- `terminated` is a true terminal only: a time-limit truncation is stored as not terminated, so the critic
  target bootstraps from its final observation (Pardo et al. 2018; SB3's `handle_timeout_termination`).
- Actions are stored as the actor emits them (SAC/TD3 here: rescaled to [-1, 1], as SB3 stores them).
- Sampling draws indices with a seeded `np.random.Generator`; `state_dict()` / `load_state_dict()` hold
  the contents, the write position and the generator's state, so a resumed run samples what it would have.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")


class ReplayBuffer:
    """`add` a [num_envs, ...] batch of transitions, `sample(n)` n of them as float32 tensors."""

    def __init__(self, capacity: int, obs_dim: int, action_dim: int, *, seed: int) -> None:
        self.capacity = capacity
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.actions = np.zeros((capacity, action_dim), np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.terminated = np.zeros(capacity, np.float32)  # 1.0 = a true terminal (no bootstrap)
        self.pos = 0  # the next row written
        self.size = 0  # rows holding a transition (capacity once full)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
    ) -> None:
        """One vector step: row i of each argument is environment i's transition. `next_obs` must already
        hold the final observation of an environment whose episode ended this step."""
        n = len(rewards)
        rows = (self.pos + np.arange(n)) % self.capacity
        self.obs[rows] = obs
        self.actions[rows] = actions
        self.rewards[rows] = rewards
        self.next_obs[rows] = next_obs
        self.terminated[rows] = terminated
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """`batch_size` transitions drawn uniformly with replacement (as SB3): `rewards`, `terminated` [B],
        `obs`, `next_obs` [B, obs_dim], `actions` [B, |A|]."""
        if self.size == 0:
            raise ValueError("ReplayBuffer.sample: the buffer is empty")
        idx = self.rng.integers(0, self.size, size=batch_size)
        return {name: torch.from_numpy(getattr(self, name)[idx]) for name in FIELDS}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to go on exactly: the filled rows, position, generator state."""
        return {
            **{name: getattr(self, name)[: self.size].copy() for name in FIELDS},
            "capacity": self.capacity,
            "pos": self.pos,
            "size": self.size,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(
                f"ReplayBuffer: a saved buffer of capacity {state['capacity']} into one of {self.capacity}"
            )
        size = int(state["size"])
        for name in FIELDS:
            getattr(self, name)[:size] = state[name]
        self.pos, self.size = int(state["pos"]), size
        self.rng.bit_generator.state = state["rng"]

    def save(self, path: Path) -> None:
        """The filled rows as one .npz (plain arrays, loadable without pickle) and the rest as JSON in it."""
        state = self.state_dict()
        meta = {k: state[k] for k in ("capacity", "pos", "size", "rng")}
        np.savez(path, meta=np.array(json.dumps(meta)), **{name: state[name] for name in FIELDS})

    def load(self, path: Path) -> None:
        with np.load(path, allow_pickle=False) as saved:
            state: dict[str, Any] = json.loads(str(saved["meta"]))
            state |= {name: saved[name] for name in FIELDS}
        self.load_state_dict(state)
