"""Networks of the off-policy control loop: SAC's squashed Gaussian actor, TD3's deterministic actor and
the twin Q critics both use (the SB3 `SACPolicy` / `TD3Policy` layout, CleanRL's `sac_continuous_action.py`
and `td3_continuous_action.py`).

Actions live in [-1, 1] inside the networks and the replay buffer (a tanh squashes the actor's output);
`to_env` rescales them to the Box bounds, a = bias + scale · ã with scale = (high - low) / 2 and bias =
(high + low) / 2 (SB3 rescales outside the policy in the same way; CleanRL keeps the same buffers in its
actor). So the noise scales of TD3 and SAC's target entropy are in these units for any bounds.

Initialisation: PyTorch's default (Kaiming-uniform), as SB3's and CleanRL's SAC and TD3: not the
orthogonal init of the PPO policy.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
from torch import nn

from hone.algorithms.qlearning import tanh_gaussian_log_prob
from hone.control.policy import _ACTIVATIONS

# SB3's clamp of the actor's log-std (CleanRL squashes it into [-5, 2] with a tanh instead).
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def plain_mlp(inputs: int, hidden: list[int], activation: str, outputs: int | None = None) -> nn.Sequential:
    """Linear + activation per hidden layer, then a linear head of `outputs` (none: the trunk alone)."""
    layers: list[nn.Module] = []
    sizes = [inputs, *hidden]
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), _ACTIVATIONS[activation]()]
    if outputs is not None:
        layers.append(nn.Linear(sizes[-1], outputs))
    return nn.Sequential(*layers)


class _BoundedActor(nn.Module):
    """Holds the Box's rescaling as buffers (saved with the weights, so a loaded actor acts in env units)."""

    scale: torch.Tensor
    bias: torch.Tensor

    def __init__(self, action_space: Any) -> None:
        super().__init__()
        low = np.asarray(action_space.low, np.float32).reshape(-1)
        high = np.asarray(action_space.high, np.float32).reshape(-1)
        self.action_dim = int(low.size)
        self.register_buffer("scale", torch.as_tensor((high - low) / 2.0))
        self.register_buffer("bias", torch.as_tensor((high + low) / 2.0))

    def to_env(self, unit_action: torch.Tensor) -> torch.Tensor:
        """[-1, 1] → the Box's bounds."""
        return unit_action * self.scale + self.bias


class SquashedGaussianActor(_BoundedActor):
    """SAC's policy (Haarnoja et al. 2018a, arXiv:1801.01290 §4.2 and Appendix C): a = tanh(u),
    u ~ N(μ(s), σ(s)²), with μ and log σ two heads on one trunk; log σ clamped to [-20, 2] (SB3).

    `sample(obs)` a reparameterised action in [-1, 1] and its log-prob (`tanh_gaussian_log_prob`, the
    change of variables of Appendix C). The log-prob is the squashed [-1, 1] action's, without the Σ log
    scale of the rescaling: SB3's convention (CleanRL subtracts it), so α and the −|A| entropy target
    behave the same for every Box. `act(obs, deterministic=True)` is tanh(μ(s)) in env units (SB3)."""

    def __init__(self, obs_dim: int, action_space: Any, hidden: list[int], activation: str = "relu") -> None:
        super().__init__(action_space)
        self.trunk = plain_mlp(obs_dim, hidden, activation)
        width = hidden[-1] if hidden else obs_dim
        self.mu = nn.Linear(width, self.action_dim)
        self.log_std = nn.Linear(width, self.action_dim)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs)
        return self.mu(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self(obs)
        u = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(u), tanh_gaussian_log_prob(mean, log_std, u)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        unit = torch.tanh(self(obs)[0]) if deterministic else self.sample(obs)[0]
        return self.to_env(unit)


class DeterministicActor(_BoundedActor):
    """TD3's policy μ(s) = tanh(MLP(s)) in [-1, 1] (Fujimoto et al. 2018, arXiv:1802.09477; the tanh output
    layer of their code). `act` is μ(s) in env units either way: exploration noise is the loop's."""

    def __init__(self, obs_dim: int, action_space: Any, hidden: list[int], activation: str = "relu") -> None:
        super().__init__(action_space)
        self.net = plain_mlp(obs_dim, hidden, activation, self.action_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self.to_env(self(obs))


class GaussianActor(_BoundedActor):
    """IQL's and AWR's policy: N(μ(s), σ²) with μ(s) = tanh(MLP(s)) in [-1, 1] and a state-independent
    log σ (the IQL authors' MuJoCo policy; CORL's `GaussianPolicy`). Not squashed: `log_prob` of a dataset
    action is a plain Gaussian density, finite for actions on the bounds, where a tanh-squashed density
    needs atanh(±1). `act(deterministic=True)` is μ(s) in env units; sampled actions are clipped to
    [-1, 1]."""

    def __init__(self, obs_dim: int, action_space: Any, hidden: list[int], activation: str = "relu") -> None:
        super().__init__(action_space)
        self.net = plain_mlp(obs_dim, hidden, activation, self.action_dim)
        self.log_std = nn.Parameter(torch.zeros(self.action_dim))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log π(a|s) summed over action dimensions, [B]; `action` in [-1, 1] units."""
        std = self.log_std.clamp(-5.0, 2.0).exp()  # CORL's bounds
        return torch.distributions.Normal(self(obs), std).log_prob(action).sum(-1)

    def sample(self, obs: torch.Tensor) -> torch.Tensor:
        std = self.log_std.clamp(-5.0, 2.0).exp()
        return (self(obs) + std * torch.randn(obs.shape[0], self.action_dim)).clamp(-1.0, 1.0)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self.to_env(self(obs) if deterministic else self.sample(obs))


class TwinQ(nn.Module):
    """Two independent critics Q1, Q2(s, a) on the concatenated [s, a] (clipped double-Q: Fujimoto et al.
    2018 §4.2; SAC: arXiv:1812.05905 §6). `forward` returns both as [B] tensors."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int], activation: str = "relu") -> None:
        super().__init__()
        self.q1 = plain_mlp(obs_dim + action_dim, hidden, activation, 1)
        self.q2 = plain_mlp(obs_dim + action_dim, hidden, activation, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, action], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def first(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q1 alone (TD3's actor loss)."""
        return self.q1(torch.cat([obs, action], -1)).squeeze(-1)
