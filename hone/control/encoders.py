"""Which network reads the observations: an MLP for flat vectors, the Nature-DQN CNN for images.

The CNN is Mnih et al. 2015's ("Human-level control through deep reinforcement learning") encoder as
CleanRL's `ppo_atari.py` uses it: pixels scaled by 1/255, conv 32×8×8 stride 4, conv 64×4×4 stride 2,
conv 64×3×3 stride 1, a 512-unit linear layer, ReLU after each, orthogonal init with gain √2 and zero bias.
Actor and critic share it (one torso, two linear heads: gain 0.01 and 1), as in CleanRL and SB3's
`CnnPolicy`, so an RL step costs one CNN pass where two separate networks would cost two.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import nn

from hone.config import ControlConfig
from hone.control.policy import ActorCritic

CNN_FEATURES = 512
# The smallest image the three convolutions reduce to at least 1×1: (((x - 8)/4 + 1 - 4)/2 + 1 - 3) + 1 >= 1.
CNN_MIN_SIZE = 36


def is_image(space: Any) -> bool:
    """A uint8 Box of rank 3, channels first (stacked frames, C×H×W): what the CNN takes."""
    shape, dtype = getattr(space, "shape", None), getattr(space, "dtype", None)
    return shape is not None and len(shape) == 3 and str(dtype) == "uint8"


def encoder_kind(control: ControlConfig, observation_space: Any) -> Literal["mlp", "cnn"]:
    """`control.encoder`, or with `auto` the CNN for images and the MLP for everything else."""
    if control.encoder != "auto":
        return control.encoder
    return "cnn" if is_image(observation_space) else "mlp"


def _init(layer: nn.Conv2d | nn.Linear) -> nn.Module:
    nn.init.orthogonal_(layer.weight, math.sqrt(2))
    nn.init.zeros_(layer.bias)  # type: ignore[arg-type]  # every layer here has a bias
    return layer


class NatureCNN(nn.Module):
    """uint8 images [batch, C, H, W] (as floats 0..255) -> [batch, 512] features."""

    def __init__(self, channels: int, height: int, width: int, features: int = CNN_FEATURES) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            _init(nn.Conv2d(channels, 32, 8, stride=4)),
            nn.ReLU(),
            _init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            _init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():  # 64×7×7 for 84×84 frames; computed so other sizes work too
            flat = self.convs(torch.zeros(1, channels, height, width)).shape[1]
        self.linear = nn.Sequential(_init(nn.Linear(flat, features)), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(self.convs(obs / 255.0))


def make_policy(control: ControlConfig, observation_space: Any, action_space: Any) -> ActorCritic:
    """The actor-critic for these spaces (`check_spaces` has accepted them): separate MLPs on vectors
    (`control.hidden_sizes`); on images the shared CNN with one linear layer per head (CleanRL)."""
    if encoder_kind(control, observation_space) == "cnn":
        channels, height, width = observation_space.shape
        cnn = NatureCNN(channels, height, width)
        return ActorCritic(CNN_FEATURES, action_space, [], control.activation, encoder=cnn)
    return ActorCritic(
        int(observation_space.shape[0]), action_space, control.hidden_sizes, control.activation
    )
