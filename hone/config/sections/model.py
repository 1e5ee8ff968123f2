"""`model` (the policy's weights, dtype, LoRA) and `critic` (PPO's value model, its own weights and
optimiser)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hone.config.base import Section


class LoraConfig(Section):
    r: int = Field(16, ge=1, description="LoRA rank (peft)")
    alpha: int = Field(32, description="LoRA scaling numerator: updates are scaled by alpha / r")
    dropout: float = Field(0.0, description="dropout on the LoRA branch")
    target_modules: list[str] | str = Field(
        "all-linear", description="modules that get adapters: 'all-linear' or a list of module names"
    )


class ModelConfig(Section):
    path: str = Field(
        "tiny",
        description="local dir, hub name, or alias (tiny, tiny:<name>, tiny-vl, smollm2-135m-instruct)",
    )
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32",
        description="weights' dtype for training: float32, bfloat16, or auto (the checkpoint's own)",
    )
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto | cpu | cuda[:N]")
    lora: LoraConfig | None = None
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass: less memory, ~30% more time"
    )
    freeze_vision: bool = Field(
        False,
        description="a vision-language model: train the language model only, the vision tower frozen "
        "(LoRA always adapts the language model only)",
    )


class CriticConfig(Section):
    """PPO's value model (`algorithm.advantage: gae`); see README "PPO with a critic"."""

    path: str | None = Field(
        None,
        description="a model dir or hub name for the critic's trunk (a saved critic keeps its value head); "
        "null = the policy's start (the SFT result after a warm start), with a new value head",
    )
    lr: float = Field(1e-4, gt=0, description="critic learning rate (AdamW)")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="critic learning-rate schedule"
    )
    weight_decay: float = Field(0.0, description="critic AdamW weight decay")
    warmup_steps: int = Field(
        0,
        ge=0,
        description="first RL steps that train only the critic: the policy neither moves nor publishes",
    )
    value_clip: float | None = Field(
        None, gt=0, description="ε_v: PPO2's value clipping around the values the batch was sampled with"
    )
    value_coef: float = Field(
        1.0,
        gt=0,
        description="scales the value loss; the critic is its own model, so it acts as an LR factor",
    )
    micro_batch_size: int | None = Field(
        None, ge=1, description="sequences per critic forward/backward; null = trainer.micro_batch_size"
    )
    grad_clip: float | None = Field(
        1.0, gt=0, description="clip the critic gradient's global norm; null = no clipping"
    )
