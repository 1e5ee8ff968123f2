"""What a generation engine declares to the run that builds it: `Engine`.

A run needs two things of an engine, both decided at set-up: a `Sampler` that holds the policy's
weights as they are (version 0), and the weights a publish sends it afterwards, in the form it loads
(the HF engine copies the trainable tensors into its own model object; vLLM loads the whole HF-named
state dict with LoRA merged). Each engine says both in its own module, so the run never branches on
the engine's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

if TYPE_CHECKING:
    from hone.config import RolloutConfig
    from hone.rollout.base import Sampler


class TrainedModel(Protocol):
    """What an engine reads of the trainable policy (`hone.training.Policy`, which `rollout` sits
    beside, not above): its model, its tokenizer, and its weights as plain HF names."""

    @property
    def model(self) -> nn.Module: ...

    @property
    def tokenizer(self) -> Any: ...

    def state_dict_for_sampler(self) -> dict[str, torch.Tensor]: ...


WeightSource = Callable[[], dict[str, torch.Tensor]]


class Engine(Protocol):
    """A generation engine, registered by name in `hone.rollout.engines.ENGINES` (`rollout.engine`)."""

    def build(
        self, rollout: RolloutConfig, policy: TrainedModel, model_path: str, *, model_dtype: str
    ) -> Sampler:
        """A sampler holding `policy`'s current weights as version 0. `model_path` is the resolved
        `model.path` (a directory an out-of-process engine loads), `model_dtype` is `model.dtype`."""
        ...

    def weight_source(self, policy: TrainedModel) -> WeightSource:
        """What each publish sends this engine's samplers (read at publish time)."""
        ...
