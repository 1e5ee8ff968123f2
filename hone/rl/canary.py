"""The log-prob canary: the sampler's log-probs against the learner's, on the tokens that can be compared.

A weight fingerprint (`rollout.fingerprint`) proves the engine holds the published tensors; it cannot see
an engine that holds them and computes something else (a wrong RoPE scaling, a kernel bug, an FP8
rollout drifting from the trainer: NeMo-RL #3696, verl PR #7519). The canary compares what the two
compute: for rows sampled with the very weights the learner holds (`TrainBatch.fresh`: in a synchronous
run every row; in an asynchronous one the rows at the learner's version), the mean over their response
tokens of |log π_sampler - log π_learner|. The learner's side is a pass the step makes anyway (the
recomputed π_old, or the update's first forward before its first optimizer step), so the canary is free.

The budget (`trainer.max_logprob_mismatch`) is per token, by dtype when not given: measured on the tiny
Qwen2 and SmolLM2-135M, an fp32 sampler and an fp32 update agree to ~1e-6 (batching and padding change
the summation order, nothing else), so 1e-3 leaves three orders of margin and still sees one missed
update (~1e-2 at the shipped learning rates); a bf16 side rounds every matmul (measured ~5e-3 mean),
so 5e-2. `trainer.mismatch_patience` checks in a row over budget stop the run (one noisy batch does
not); the metrics are logged at every step whether checked or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hone.config import HoneConfig
from hone.rollout.fingerprint import WeightMismatchError

FP32_BUDGET = 1e-3
BF16_BUDGET = 5e-2


def default_budget(*, sampler_bf16: bool, update_bf16: bool) -> float:
    """The per-token budget when `trainer.max_logprob_mismatch` is null (see the module docstring)."""
    return BF16_BUDGET if sampler_bf16 or update_bf16 else FP32_BUDGET


def build_canary(cfg: HoneConfig, engine: str) -> LogprobCanary | None:
    """The run's canary (`trainer.verify_every`, `max_logprob_mismatch`, `mismatch_patience`); None when
    off. `engine` names the sampler in its error."""
    trainer = cfg.trainer
    if not trainer.verify_every:
        return None
    budget = trainer.max_logprob_mismatch
    if budget is None:
        bf16_weights = cfg.model.dtype != "float32"  # auto: the checkpoint's own, often bf16
        budget = default_budget(
            sampler_bf16=bf16_weights or cfg.rollout.dtype == "bfloat16",
            update_bf16=bf16_weights or trainer.autocast == "bfloat16",
        )
    return LogprobCanary(budget, trainer.mismatch_patience, trainer.verify_every, engine)


@dataclass
class LogprobCanary:
    """Counts the checks in a row whose `mismatch/canary_abs` exceeded `budget`; `patience` of them raise
    `WeightMismatchError` naming the engine, the version and the gap."""

    budget: float
    patience: int
    every: int = 1
    engine: str = "sampler"
    over: int = field(default=0, init=False)

    def check(self, metrics: dict[str, float], step: int, version: int) -> None:
        """Check RL step `step` (0-based; every `every`-th), whose rows at the learner's `version` gave
        `metrics`; a step with no such rows checks nothing."""
        if not self.every or step % self.every or not metrics.get("mismatch/canary_tokens"):
            return
        gap = metrics["mismatch/canary_abs"]
        self.over = self.over + 1 if gap > self.budget else 0
        metrics["mismatch/canary_over"] = float(self.over)
        if self.over >= self.patience:
            raise WeightMismatchError(
                f"stopped at RL step {step + 1}: the {self.engine}'s log-probs differ from the learner's at "
                f"weight version {version} by {gap:.3g} per token "
                f"(largest {metrics['mismatch/canary_max']:.3g}) "
                f"for {self.over} checks in a row, over the budget of {self.budget:g} "
                "(trainer.max_logprob_mismatch): the engine does not compute what the learner trains"
            )
