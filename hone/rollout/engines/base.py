"""What a generation engine declares to the run that builds it: `Engine`.

A run needs two things of an engine, both decided at set-up: a `Sampler` that holds the policy's
weights as they are (version 0), and the weights a publish sends it afterwards, in the form it loads
(the HF engine copies the trainable tensors into its own model object; vLLM loads the whole HF-named
state dict with LoRA merged). Each engine says both in its own module, and declares what else it can do
(`EngineCapabilities`), so the run never branches on the engine's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

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


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do beyond `build` and `weight_source`, declared twice: on its registry line
    (`register_engine`), which validating a recipe reads without importing the engine, and on its class
    (`Engine.capabilities`), which `get_engine` checks against the line. Off unless declared."""

    # Its samplers take a publish between two tokens (`rollout.interruptible`): they have a
    # `between_tokens` hook the weight channel installs its pending version from.
    interruptible: bool = False
    # It casts its weights to `rollout.dtype` (bfloat16); without it the engine samples in `model.dtype`.
    dtype_override: bool = False
    # Its samplers report the fingerprint of the weights they hold (`hone.rollout.fingerprint.Fingerprinted`),
    # so `trainer.verify_weights` checks the weights themselves; without it only the version number.
    fingerprint: bool = False


@dataclass(frozen=True)
class ModelFiles:
    """The policy's model as an engine may load it: `path` is the resolved `model.path` (a directory an
    out-of-process engine loads), `dtype` is `model.dtype`. `reuse_model`: nothing else uses or trains
    `policy.model` (a Ray sampler actor's), so an engine that samples over a model object may take that one
    instead of its own copy; others ignore it."""

    path: str
    dtype: str
    reuse_model: bool = False


class Engine(Protocol):
    """A generation engine, registered by name in `hone.rollout.engines.ENGINES` (`rollout.engine`)."""

    capabilities: ClassVar[EngineCapabilities]

    def build(self, rollout: RolloutConfig, policy: TrainedModel, files: ModelFiles) -> Sampler:
        """A sampler holding `policy`'s current weights as version 0 (`files`: where they came from)."""
        ...

    def weight_source(self, policy: TrainedModel) -> WeightSource:
        """What each publish sends this engine's samplers (read at publish time)."""
        ...
