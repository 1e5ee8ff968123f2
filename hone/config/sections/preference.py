"""`pairs` (`hone pairs`), `dpo` and `rm` (`hone dpo`, `hone rm`): preference data and its optimisation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hone.config.base import Section


class PairsConfig(Section):
    """`hone pairs`: preference pairs sampled from the recipe's model and labelled by its reward."""

    prompts: int = Field(1000, ge=1, description="training prompts to sample (rollout.n responses each)")
    per_prompt: int = Field(1, ge=1, description="pairs per prompt, at most (best with worst, then next)")
    min_margin: float = Field(0.0, ge=0, description="a pair's rewards must differ by more than this")
    out: str | None = Field(None, description="jsonl to write; null = runs/<run.name>/pairs.jsonl")


class PreferenceDataConfig(Section):
    """What `hone dpo` and `hone rm` share: the preference file (TRL's formats) and the optimisation."""

    data: str | None = Field(
        None, description="preference pairs: jsonl/parquet file, save_to_disk dir or HF dataset name"
    )
    split: str = Field("train", description="the split of a hub dataset or a saved DatasetDict")
    subset: str | None = Field(None, description="HF dataset configuration name")
    prompt_field: str = Field("prompt", description="the column holding the prompt")
    chosen_field: str = Field("chosen", description="the column holding the preferred response")
    rejected_field: str = Field("rejected", description="the column holding the dispreferred response")
    lr: float = Field(1e-6, gt=0, description="learning rate (AdamW)")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "linear", description="learning-rate schedule over the steps after the warm-up"
    )
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up")
    weight_decay: float = Field(0.0, description="AdamW weight decay")
    batch_size: int = Field(8, ge=1, description="pairs per optimizer step")
    micro_batch_size: int | None = Field(None, ge=1, description="pairs per forward/backward; null = all")
    steps: int = Field(100, ge=1, description="optimizer steps")


class DPOConfig(PreferenceDataConfig):
    loss: str = Field("sigmoid", description="sigmoid (DPO) | cdpo | ipo | simpo")
    beta: float | None = Field(None, gt=0, description="null = the loss's own (0.1; simpo 2.0)")
    label_smoothing: float | None = Field(
        None, gt=0, lt=0.5, description="cdpo: ε, the assumed share of flipped labels; null = 0.1"
    )
    simpo_gamma: float | None = Field(None, ge=0, description="simpo: target margin γ; null = 0.5")
    cache_reference: bool = Field(
        True, description="score each pair under the reference once, before training, and keep the numbers"
    )
    eval: bool = Field(
        False, description="held-out task accuracy (data.task / data.eval_source) before and after DPO"
    )

    @model_validator(mode="after")
    def _keys_that_apply(self) -> DPOConfig:
        # A hyper-parameter the chosen loss ignores is refused rather than silently not applied.
        if self.label_smoothing is not None and self.loss != "cdpo":
            raise ValueError(f"label_smoothing applies to loss cdpo only, not {self.loss!r}")
        if self.simpo_gamma is not None and self.loss != "simpo":
            raise ValueError(f"simpo_gamma applies to loss simpo only, not {self.loss!r}")
        return self


class RMConfig(PreferenceDataConfig):
    lr: float = Field(1e-5, gt=0, description="learning rate (AdamW)")
    eval_data: str | None = Field(None, description="held-out pairs; null = hold out val_fraction of rm.data")
    val_fraction: float = Field(0.1, gt=0, lt=1, description="share of rm.data held out when no eval_data")
    eval_every: int = Field(
        25, ge=1, description="held-out pair accuracy every this many steps, and at the end"
    )
    center_rewards_coef: float = Field(
        0.0, ge=0, description="coef of the (r_chosen + r_rejected)² penalty (TRL center_rewards_coefficient)"
    )
    max_length: int | None = Field(
        None, ge=1, description="keep the last this many tokens of each text (as the reward_model reward)"
    )
