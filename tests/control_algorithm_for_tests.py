"""A new online control algorithm in one file (docs/architecture.md, "Files a change touches"): TD3 whose
exploration noise decays by `noise_decay` at every update, registered as `td3_decay` with its own
hyperparameters (`control.args`). A built-in algorithm would put `DecayArgs` in hone/config/control.py as its
subsection instead (its second file). Loaded with `run.plugins: [tests.control_algorithm_for_tests]`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from hone.config import ControlConfig
from hone.control.algos import ControlAlgorithm, algorithm_args, register_control_algorithm
from hone.control.algos.sac_td3 import OffPolicyLearner, deterministic, gaussian_noise


class DecayArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    noise_decay: float = Field(0.999, gt=0, le=1)


class DecayingTD3(OffPolicyLearner):
    def __init__(self, control: ControlConfig, obs_dim: int, action_space: Any) -> None:
        super().__init__(control, obs_dim, action_space, sac=False)
        args = algorithm_args(control)
        assert isinstance(args, DecayArgs)
        self.decay, self.noise = args.noise_decay, control.offpolicy.exploration_noise

    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return gaussian_noise(self.actor, obs, rng, self.noise)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        self.noise *= self.decay
        return super().update(batch) | {"noise/std": self.noise}


register_control_algorithm(
    "td3_decay",
    ControlAlgorithm(
        loop="offpolicy", reads=("offpolicy",), acting_network=deterministic, plot=("eval/return",),
        learner=DecayingTD3, box_actions=True, args=DecayArgs,
    ),
)  # fmt: skip
