"""A LoRA policy's weights as plain HF tensors: each adapted layer's base weight plus its delta, merged
out of place (the trainable model is never merged and unmerged, which would drift the frozen base weights
by rounding at every sync)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel


@runtime_checkable
class _LoraDelta(Protocol):
    """What peft's concrete LoRA layers (`lora.Linear`, `lora.Embedding`...) add to the `LoraLayer` mixin."""

    def get_delta_weight(self, adapter: str) -> torch.Tensor: ...


def merged_lora_weights(
    base: PreTrainedModel, tensors: dict[str, torch.Tensor], *, gathered: bool
) -> dict[str, torch.Tensor]:
    """`tensors` (the base model's state: `base_layer` and `lora_` names) merged into plain HF names, the
    adapter tensors dropped. The deltas come from peft's layers (`get_delta_weight`), or with `gathered`
    (a state gathered from N learner ranks, whose live tensors are shards) from `tensors` themselves:
    a Linear's B @ A, transposed for `fan_in_fan_out`, times its scaling, as peft computes it."""
    from peft.tuners.lora import LoraLayer

    merged: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        if not isinstance(module, _LoraDelta) or (gathered and type(module).__name__ != "Linear"):
            raise TypeError(f"cannot merge LoRA layer {name} ({type(module).__name__})")
        weight = tensors[f"{name}.base_layer.weight"].detach()
        for adapter in module.active_adapters:
            if gathered:
                a, b = (tensors[f"{name}.lora_{ab}.{adapter}.weight"] for ab in "AB")
                delta = b @ a
                delta = (delta.T if getattr(module, "fan_in_fan_out", False) else delta) * module.scaling[
                    adapter
                ]
            else:
                delta = module.get_delta_weight(adapter).detach()
            weight = weight + delta.to(weight.dtype)
        merged[f"{name}.weight"] = weight
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        out[key] = merged.get(key, value.detach())
    return out
