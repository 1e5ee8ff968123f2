"""`trainer` (the learner: optimiser, batching, numerics, weight verification, N learner ranks) and `sft`
(the supervised warm start)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hone.config.base import Section


class TrainerConfig(Section):
    lr: float = Field(1e-4, gt=0, description="policy learning rate (AdamW) (TRL: learning_rate)")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="learning-rate schedule over run.steps after the warm-up"
    )
    warmup_steps: int = Field(0, ge=0, description="RL steps of linear warm-up")
    weight_decay: float = Field(0.0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    fused_adamw: bool = Field(
        True,
        description="torch's fused AdamW kernel (one pass per parameter; N sharded ranks use the "
        "multi-tensor one); the same update up to float rounding",
    )
    ppo_epochs: int = Field(
        1, ge=1, description="passes over each RL batch (TRL: num_iterations; verl: ppo_epochs)"
    )
    mini_batches: int = Field(1, ge=1, description="optimizer steps per epoch over one RL batch")
    micro_batch_size: int = Field(256, ge=1, description="sequences per forward/backward, at most")
    micro_batch_tokens: int = Field(
        8192, ge=1, description="padded tokens per forward/backward, at most (logits are tokens x vocab)"
    )
    grad_clip: float | None = Field(
        1.0,
        gt=0,
        description="clip the gradient's global norm to this; null = no clipping (TRL: max_grad_norm)",
    )
    disable_dropout: bool = Field(
        True, description="zero every dropout for RL, so the on-policy ratio is exactly 1 (as TRL)"
    )
    max_nonfinite_steps: int = Field(
        3, ge=1, description="optimizer steps in a row with a NaN/inf gradient norm (each skipped) to stop"
    )
    log_entropy: bool = Field(True, description="log the policy's entropy (computed in chunks, no graph)")
    shared_prompts: bool = Field(
        True,
        description="rows with the same prompt (a group) forward it once in training and log-prob passes; "
        "exact up to float rounding",
    )
    autocast: Literal["none", "bfloat16"] = Field(
        "none",
        description="bfloat16: the training forward/backward's matmuls in bf16 (torch.autocast), weights, "
        "gradients, optimizer and log-softmax in fp32 (model.dtype float32)",
    )
    verify_weights: bool = Field(
        True,
        description="after every weight load the engine reports an exact fingerprint of the weights it holds "
        "and the version; a difference from what the learner published stops the run (rollout.fingerprint)",
    )
    verify_every: int = Field(
        1,
        ge=0,
        description="the log-prob canary's cadence in steps: the sampler's log-probs of the step's rollouts "
        "sampled at the learner's version against the learner's (free: a pass the update makes); 0 = off",
    )
    max_logprob_mismatch: float | None = Field(
        None,
        gt=0,
        description="the canary's budget, mean |log π_sampler - log π_learner| per token; null = by dtype: "
        "1e-3 when sampler and update both run fp32, 5e-2 when either is bf16",
    )
    mismatch_patience: int = Field(
        3, ge=1, description="canary checks in a row over max_logprob_mismatch that stop the run"
    )

    world_size: int = Field(
        1,
        ge=1,
        description="learner ranks, one process each (gloo on CPU, NCCL with one GPU each); under torchrun "
        "its WORLD_SIZE",
    )
    strategy: Literal["fsdp2", "ddp"] = Field(
        "fsdp2",
        description="N ranks: fsdp2 shards parameters, gradients and optimizer state; ddp replicates them",
    )
    collective_timeout_s: float = Field(
        600.0, gt=0, description="N ranks: the most one collective (all-gather, reduce, barrier) may wait"
    )


class SFTConfig(Section):
    enabled: bool = Field(False, description="supervised warm-start before RL (teaches the answer format)")
    data: str | None = Field(None, description="jsonl of prompt/response pairs; null = task demonstrations")
    examples: int = Field(
        20_000, ge=1, description="demonstrations generated from the task when sft.data is null"
    )
    lr: float = Field(1e-3, gt=0, description="SFT learning rate")
    batch_size: int = Field(128, ge=1, description="demonstrations per SFT optimizer step")
    micro_batch_size: int | None = Field(
        None, ge=1, description="sequences per forward/backward; null = trainer.micro_batch_size"
    )
    max_steps: int = Field(1000, ge=1, description="most SFT optimizer steps")
    stop_at_accuracy: float | None = Field(None, ge=0, le=1, description="stop when val accuracy ≥ this")
    eval_every: int = Field(25, ge=1, description="SFT validation cadence in steps (for stop_at_accuracy)")
    val_size: int = Field(
        500, ge=1, description="held-out problems SFT validates on (disjoint from the eval set)"
    )
