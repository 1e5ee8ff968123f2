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
    """`dist(obs)` the action distribution, `value(obs)` V(s), `act(obs, deterministic)` an action.
    `critic_dim`: the critic's input width when it differs from the actor's
    (`multiagent.SharedActorCritic`)."""

    def __init__(
        self,
        obs_dim: int,
        action_space: Any,
        hidden: list[int],
        activation: str = "tanh",
        critic_dim: int | None = None,
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        # A shared torso both heads read (the CNN for images, `hone.control.encoders`); `obs_dim` is then
        # its output size. None: the heads read the observations (the MLP case, state dict unchanged).
        self.encoder = encoder
        self.discrete = hasattr(action_space, "n")
        action_dim = int(action_space.n) if self.discrete else int(math.prod(action_space.shape))
        self.actor = mlp(obs_dim, action_dim, hidden, activation, out_gain=0.01)
        self.critic = mlp(critic_dim or obs_dim, 1, hidden, activation, out_gain=1.0)
        self.log_std = None if self.discrete else nn.Parameter(torch.zeros(action_dim))

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        return obs if self.encoder is None else self.encoder(obs)

    def _dist(self, out: torch.Tensor) -> Distribution:
        # No argument validation: it re-checks every call's parameters and samples (~2% of a CartPole run's
        # CPU) for what cannot happen here: the optimizer stepper never applies a non-finite step, and a
        # sample is in its own distribution's support.
        if self.log_std is None:
            return Categorical(logits=out, validate_args=False)
        scale = self.log_std.exp().expand_as(out)
        return Independent(Normal(out, scale, validate_args=False), 1, validate_args=False)

    def dist(self, obs: torch.Tensor) -> Distribution:
        return self._dist(self.actor(self._features(obs)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self._features(obs)).squeeze(-1)

    def dist_value(self, obs: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        """Both heads from one pass of the shared torso (what `dist` then `value` would compute twice)."""
        features = self._features(obs)
        return self._dist(self.actor(features)), self.critic(features).squeeze(-1)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            out = self.actor(self._features(obs))
            return out.argmax(-1) if self.discrete else out
        return self.dist(obs).sample()
