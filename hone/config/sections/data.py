"""`data` (the prompts: a built-in task or a dataset, and which ones each step draws) and `env` (a multi-turn
environment instead of single-turn prompts)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from hone.config.base import Section


class DifficultyFilterConfig(Section):
    """ROLL's difficulty mask (0.1-0.95) as a cool-down: see `hone.data.passrates.CoolDown`."""

    lo: float = Field(0.1, ge=0, le=1, description="prompts tracked below this pass rate are skipped")
    hi: float = Field(0.95, ge=0, le=1, description="prompts tracked above this pass rate are skipped")
    cooldown_steps: int = Field(10, ge=1, description="steps a prompt out of [lo, hi] is skipped for")

    @model_validator(mode="after")
    def _ordered(self) -> DifficultyFilterConfig:
        if self.lo > self.hi:
            raise ValueError(f"data.difficulty_filter: lo ({self.lo}) must be <= hi ({self.hi})")
        return self


class DataConfig(Section):
    task: str | None = Field(
        None,
        description="a built-in generated task (hone.data.tasks: arithmetic, word_problems...) instead of a "
        "data.source; null = none (the default recipe names arithmetic)",
    )
    task_args: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of the built-in task (e.g. arithmetic's min_digits, ops)",
    )
    source: str | None = Field(
        None,
        description="jsonl/parquet file, HF dataset name, or reasoning_gym:<name> (instead of task)",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="with source reasoning_gym:<name>: that dataset's config (its difficulty settings)",
    )
    eval_source: str | None = Field(
        None,
        description="held-out file/dataset for eval/accuracy; null = hold out data.eval_size rows of "
        "data.source (at most 10%, chosen by a hash of each row)",
    )
    subset: str | None = Field(None, description="HF dataset configuration name (e.g. gsm8k's 'main')")
    prompt_field: str = Field(
        "prompt", description="the column holding the prompt (text, or a list of chat messages)"
    )
    answer_field: str = Field(
        "answer", description="the column holding the reference answer the reward compares against"
    )
    messages_field: str | None = Field(
        None, description="a column of chat messages to use as the prompt instead of prompt_field"
    )
    image_field: str | None = Field(
        None,
        description="a column of the prompt's images for a vision-language model: a path (relative to the "
        "data file) or a list of paths, or an HF datasets Image column; in order, one per {type: image} "
        "part of the chat messages (a plain-text prompt's go before its text); null = none, or only images "
        "that message parts carry themselves",
    )
    chat_template: bool = Field(False, description="render prompts through the tokenizer's chat template")
    system_prompt: str | None = Field(
        None,
        description="with chat_template: a system message opening every single-turn prompt (e.g. the "
        "answer format a verifier expects) unless the sample's own messages start with one",
    )
    train_size: int = Field(100_000, ge=1, description="generated training problems (task, reasoning_gym)")
    eval_size: int = Field(1000, ge=1, description="held-out problems for eval/accuracy")
    prompts_per_step: int = Field(
        32,
        ge=1,
        description="prompts (groups) sampled per RL step; each is answered rollout.n times (TRL/verl: the "
        "batch of prompts)",
    )
    scheduler: str = Field(
        "uniform",
        description="which prompts each step draws: uniform (seeded epoch shuffle), difficulty (pass rate "
        "near a target), or a dotted path 'pkg.mod:Class' (hone.data.schedulers.PromptScheduler)",
    )
    scheduler_args: dict[str, Any] = Field(default_factory=dict, description="the scheduler's keyword args")
    pass_rate_ema: float = Field(
        0.5, gt=0, le=1, description="weight of a new group in a prompt's tracked pass rate (an EMA)"
    )
    difficulty_filter: DifficultyFilterConfig | None = Field(
        None, description="skip prompts whose tracked pass rate is outside [lo, hi] for cooldown_steps"
    )

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if self.task is not None and self.source is not None:
            raise ValueError("set only one of data.task (built-in) or data.source (dataset)")
        # A separate key from task_args, so a built-in task's options left over from a base recipe
        # never reach a reasoning-gym config (and args never silently miss a file source).
        if self.args and not (self.source or "").startswith("reasoning_gym:"):
            raise ValueError(
                "data.args is the config of data.source reasoning_gym:<name>; use data.task_args"
            )
        return self


class EnvConfig(Section):
    name: str | None = Field(
        None,
        description="multi-turn environment: a registered name or 'pkg.mod:Class' (a Hone environment, or a "
        "TRL environment_factory class); null = single-turn",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the environment")
    max_turns: int | None = Field(None, ge=1, description="assistant turns per episode; null = the env's own")
    max_tokens_per_turn: int = Field(32, ge=1, description="longest assistant turn in tokens")
    max_total_tokens: int = Field(1024, ge=2, description="prompt + every turn + observations")
    drop_void_turns: bool = Field(
        False, description="drop trajectories with an empty or cut-off turn from training (SimpleTIR)"
    )
