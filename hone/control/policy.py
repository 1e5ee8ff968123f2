"""Actor-critic MLPs for control (the SB3 `MlpPolicy` / CleanRL layout): a separate actor and critic,
orthogonal initialisation (gain √2 on hidden layers, 0.01 on the policy head, 1 on the value head).

A Discrete action space gets a categorical policy; a Box one a diagonal Gaussian with a
state-independent log-std (a learned vector, initialised at 0), as in PPO (Schulman et al. 2017) and
both peers. Actions sampled from the Gaussian are unbounded; the loop clips them to the space's bounds
before stepping the environment, and the log-prob stays the unclipped sample's (CleanRL, SB3).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp(inputs: int, outputs: int, hidden: list[int], activation: str, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    sizes = [inputs, *hidden]
    for a, b in itertools.pairwise(sizes):
        layers += [_init(nn.Linear(a, b), math.sqrt(2)), _ACTIVATIONS[activation]()]
    layers.append(_init(nn.Linear(sizes[-1], outputs), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """`dist(obs)` the action distribution, `value(obs)` V(s), `act(obs, deterministic)` an action."""

    def __init__(self, obs_dim: int, action_space: Any, hidden: list[int], activation: str = "tanh") -> None:
        super().__init__()
        self.discrete = hasattr(action_space, "n")
        action_dim = int(action_space.n) if self.discrete else int(math.prod(action_space.shape))
        self.actor = mlp(obs_dim, action_dim, hidden, activation, out_gain=0.01)
        self.critic = mlp(obs_dim, 1, hidden, activation, out_gain=1.0)
        self.log_std = None if self.discrete else nn.Parameter(torch.zeros(action_dim))

    def dist(self, obs: torch.Tensor) -> Distribution:
        out = self.actor(obs)
        if self.log_std is None:
            return Categorical(logits=out)
        return Independent(Normal(out, self.log_std.exp().expand_as(out)), 1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            out = self.actor(obs)
            return out.argmax(-1) if self.discrete else out
        return self.dist(obs).sample()
