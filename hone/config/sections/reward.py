"""`reward`: one reward function, or several components summed with weights."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from hone.config.base import Section

Contract = Literal["auto", "hone", "trl"]
CONTRACT_HELP = (
    "how a 'pkg.mod:fn' reward is called: 'hone' fn(rollout, sample) per response, 'trl' TRL's "
    "fn(prompts=, completions=, completion_ids=, **columns) once per batch, 'auto' by its signature"
)


class RewardComponentConfig(Section):
    fn: str = Field(description="a built-in reward name, 'task', or a dotted path 'pkg.mod:fn'")
    weight: float = Field(1.0, description="this component's weight in the total reward")
    args: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the reward's factory"
    )
    timeout_s: float | None = Field(None, gt=0, description="per-call timeout; default reward.timeout_s")
    correctness: bool = Field(
        False, description="this component grades correctness: eval/accuracy counts it, not the total"
    )
    contract: Contract = Field("auto", description=CONTRACT_HELP)


class RewardConfig(Section):
    fn: str | None = Field(
        None, description="one reward: a built-in name (math, code, format, ...), 'task', or 'pkg.mod:fn'"
    )
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for reward.fn")
    contract: Contract = Field("auto", description=CONTRACT_HELP + " (for reward.fn)")
    components: dict[str, RewardComponentConfig] = Field(
        default_factory=dict, description="several rewards, summed with weights, each logged by name"
    )
    timeout_s: float = Field(
        30.0, gt=0, description="per-call timeout; a timed-out call is left out of training (reward/timeouts)"
    )
    max_concurrency: int = Field(16, ge=1, description="reward calls running at once")
    max_failed_steps: int = Field(
        5, ge=1, description="stop the run after this many RL steps in a row on which every reward failed"
    )
    sandbox_concurrency: int | None = Field(
        None,
        ge=1,
        description="sandboxed programs running at once (code reward); default: reward.max_concurrency",
    )

    @model_validator(mode="after")
    def _one_form(self) -> RewardConfig:
        if self.fn is not None and self.components:
            raise ValueError("set either reward.fn or reward.components, not both")
        if self.args and self.fn is None:
            raise ValueError("reward.args needs reward.fn (components take their own args)")
        if self.contract != "auto" and self.fn is None:
            raise ValueError("reward.contract needs reward.fn (components take their own contract)")
        marked = [name for name, c in self.components.items() if c.correctness]
        if len(marked) > 1:
            raise ValueError(f"only one reward component can set correctness: true, got {marked}")
        return self

    def resolved(self) -> dict[str, RewardComponentConfig]:
        """The components to build: `components`, or the single `fn` (default 'task') named after it."""
        if self.components:
            return dict(self.components)
        fn = self.fn or "task"
        return {fn.rpartition(":")[2]: RewardComponentConfig(fn=fn, args=self.args, contract=self.contract)}
