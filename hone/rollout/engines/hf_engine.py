"""`rollout.engine: hf`: how a run builds the transformers sampler (`hf.HFSampler`) and what a publish sends
it. The sampler samples over its own copy of the policy's model (`sampler_model`), so a learner update never
changes weights under a generation; a publish copies the trainable tensors into that copy (`sampler_tensors`).
"""

from __future__ import annotations

import copy
from functools import partial
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from hone.rollout.engines.base import EngineCapabilities, ModelFiles
from hone.rollout.engines.hf import HFSampler

if TYPE_CHECKING:
    from hone.config import RolloutConfig
    from hone.rollout.engines.base import TrainedModel, WeightSource


class HFEngine:
    """`rollout.engine: hf`: an `HFSampler` over the sampler's own copy of the policy's model
    (`sampler_model`); a publish copies the trainable tensors into that copy (`sampler_tensors`)."""

    # As its registry line declares (`hone.rollout.engines`): weights cast to `rollout.dtype`, a publish
    # taken between two tokens (`HFSampler.between_tokens`), a fingerprint of what it holds.
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities(
        interruptible=True, dtype_override=True, fingerprint=True
    )

    def build(self, rollout: RolloutConfig, policy: TrainedModel, files: ModelFiles) -> HFSampler:
        # A Ray sampler actor's model is its own (nothing trains it there): sampled over as loaded, the
        # same module, LoRA wrapper and `requires_grad` flags as a local run's copy, so one actor samples
        # bit for bit what a local run does.
        model = sampler_model(policy, rollout.dtype) if not files.reuse_model else policy.model
        if files.reuse_model and rollout.dtype == "bfloat16":
            model = model.to(torch.bfloat16)
        return HFSampler(
            model,
            policy.tokenizer,
            max_batch_size=rollout.max_batch_size,
            prefix_cache=rollout.prefix_cache,
        )

    def weight_source(self, policy: TrainedModel) -> WeightSource:
        return partial(sampler_tensors, policy)


def sampler_model(policy: TrainedModel, dtype: str = "model") -> nn.Module:
    """The sampler's own copy of the policy's model (LoRA wrapper included, so it computes exactly what
    the policy does). It costs one more copy of the weights (two in all: 2 x 4 bytes/parameter in fp32)
    and keeps a learner update from ever changing weights under a generation. Its parameters keep the
    policy's `requires_grad` flags although nothing backpropagates through them: with them off, CPU
    inference ran other kernels (log-probs differed in the last bit, measured on the tiny Qwen2), and a
    synchronous run must sample exactly what it did when the sampler shared the policy's model.
    `rollout.dtype: bfloat16` casts the copy (each publish then casts as it copies: `copy_`)."""
    model = copy.deepcopy(policy.model)
    return model.to(torch.bfloat16) if dtype == "bfloat16" else model


def sampler_tensors(policy: TrainedModel) -> dict[str, torch.Tensor]:
    """What a publish copies into `sampler_model`'s copy: the policy's trainable parameters (a LoRA run:
    the adapter), by the names both models share. Frozen tensors were copied at set-up and never change."""
    return {name: p.detach() for name, p in policy.model.named_parameters() if p.requires_grad}
