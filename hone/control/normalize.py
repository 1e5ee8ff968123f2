"""Observation and reward normalisation for control (SB3's `VecNormalize`, gymnasium's `NormalizeObservation`
and `NormalizeReward`), done in the loop rather than by wrappers: gymnasium's vector wrappers refuse the
SAME_STEP autoreset the loop needs, and here the statistics are plain arrays to save with the policy and to
freeze for eval.

Observations: running mean and variance (Chan et al.'s parallel update), o' = clip((o − μ)/√(σ² + ε), ±c).
Rewards: divided by the running std of the discounted return (not centred), r' = clip(r/√(σ²_R + ε), ±c),
the return reset at each episode end, as both peers do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hone.config import ControlConfig

EPS = 1e-8


class RunningMeanStd:
    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = EPS

    def state_dict(self) -> dict[str, Any]:
        # float64 -> JSON -> float64 is exact (Python writes the shortest repr that reads back the same)
        return {"mean": self.mean.tolist(), "var": self.var.tolist(), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = np.array(state["mean"], np.float64).reshape(self.mean.shape)
        self.var = np.array(state["var"], np.float64).reshape(self.var.shape)
        self.count = float(state["count"])

    def update(self, batch: np.ndarray) -> None:
        b_mean, b_var, b_count = batch.mean(0), batch.var(0), batch.shape[0]
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean = self.mean + delta * b_count / total
        self.var = (self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total) / total
        self.count = total


class Normalizer:
    """`observations(o)` and `rewards(r, dones)` for [num_envs, ...] batches; identity where switched off."""

    def __init__(
        self,
        obs_dim: int,
        num_envs: int,
        *,
        observations: bool,
        rewards: bool,
        gamma: float,
        clip_obs: float,
        clip_reward: float,
    ) -> None:
        self.obs_rms = RunningMeanStd((obs_dim,)) if observations else None
        self.return_rms = RunningMeanStd() if rewards else None
        self.returns = np.zeros(num_envs, np.float64)
        self.gamma, self.clip_obs, self.clip_reward = gamma, clip_obs, clip_reward

    @classmethod
    def of(cls, control: ControlConfig, width: int, rows: int, *, rewards: bool = False) -> Normalizer:
        """The normaliser `control` asks for over `rows` rows of `width` features: observations as
        `control.normalize_obs`, rewards (training only) with `rewards` and `control.normalize_reward`."""
        return cls(
            width, rows, observations=control.normalize_obs, rewards=rewards and control.normalize_reward,
            gamma=control.gamma, clip_obs=control.clip_obs, clip_reward=control.clip_reward,
        )  # fmt: skip

    def observations(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        if self.obs_rms is None:
            return obs
        if update:
            self.obs_rms.update(obs)
        scaled = (obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + EPS)
        return np.clip(scaled, -self.clip_obs, self.clip_obs).astype(np.float32)

    def rewards(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        if self.return_rms is None:
            return rewards
        self.returns = self.returns * self.gamma + rewards
        self.return_rms.update(self.returns)
        self.returns[dones] = 0.0
        scaled = rewards / np.sqrt(self.return_rms.var + EPS)
        return np.clip(scaled, -self.clip_reward, self.clip_reward).astype(np.float32)

    def state(self) -> dict[str, object] | None:
        """What eval and a saved policy need: the observation statistics (None when not normalised)."""
        if self.obs_rms is None:
            return None
        return {"mean": self.obs_rms.mean.tolist(), "var": self.obs_rms.var.tolist(), "clip": self.clip_obs}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs (a checkpoint's state.json): both running statistics and each
        environment's discounted return in flight."""
        return {
            "obs": None if self.obs_rms is None else self.obs_rms.state_dict(),
            "return": None if self.return_rms is None else self.return_rms.state_dict(),
            "returns": self.returns.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for rms, key in ((self.obs_rms, "obs"), (self.return_rms, "return")):
            if (rms is None) != (state[key] is None):
                raise ValueError(f"normalizer: the checkpoint's {key} statistics do not match this run's")
            if rms is not None:
                rms.load_state_dict(state[key])
        self.returns = np.array(state["returns"], np.float64)
