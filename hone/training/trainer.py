"""The RL update: `RLTrainer.update(batch, step) -> metrics`.

One call = `ppo_epochs` passes over the batch, each split into `mini_batches` optimizer steps, each
accumulated over micro-batches. Every micro-batch loss is normalised by the token/sequence counts of
its whole *mini-batch* (`num_tokens`, `num_seqs`), so accumulation gives exactly the full-batch
gradient whatever the micro-batch size. The algorithm comes in by registry name.

The learning rate is a function of the RL step (and, under a time limit, of the time spent), not of
the optimizer steps taken, so filtered-out steps and short batches cannot leave the schedule short
of its end. Dropout is off for RL (`trainer.disable_dropout`); a step with a non-finite gradient
norm is skipped, and `trainer.max_nonfinite_steps` of them in a row stop the run.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import torch

from hone.algorithms import KL_ESTIMATORS, POLICY_LOSSES, aggregate_loss
from hone.config import AlgorithmConfig, TrainerConfig
from hone.seeding import derive_seed
from hone.training.policy import Policy, disable_dropout, first_response_column
from hone.types import Batch


class NonFiniteGradientError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite gradient norm; the message is one line."""


def build_optimizer(policy: Policy, cfg: TrainerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        policy.trainable_parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
    )


def decay_factor(schedule: str, progress: float) -> float:
    """The LR multiplier `progress` (clamped to [0, 1]) of the way through a constant/cosine/linear decay."""
    progress = min(1.0, max(0.0, progress))
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    return 1.0


def build_scheduler(
    optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then constant, cosine or linear decay to 0 over `total_steps` optimizer steps (SFT)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return decay_factor(schedule, (step - warmup_steps) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class RLSchedule:
    """The LR multiplier of RL step `step` (0-based): linear warm-up over `warmup_steps` RL steps, then the
    decay, `progress` of the way through it.

    `progress` is `(step - warmup) / (total - warmup)`, as HF's schedules count (the LR reaches its end
    at step `total`, the first step not run). Under a time limit (`start_clock`) it is the larger of that
    and the fraction of the RL time budget spent, so a run the clock stops still ends decayed. Progress
    never goes back: it is checkpointed, and a resumed session's clock maps the rest of the decay onto
    that session's budget, so with a time limit a cosine/linear LR depends on the wall clock and a resumed
    run is not bit-identical to an uninterrupted one. Without a time limit, or with a constant schedule
    (which never reads the clock), the LR depends on the step alone and resume is exact.
    """

    def __init__(self, schedule: str, warmup_steps: int, total_steps: int) -> None:
        self.schedule = schedule
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.progress = 0.0  # of the last step trained
        self._clock: tuple[float, float, float] | None = None  # (start, budget_s, progress at start)

    def start_clock(self, budget_s: float) -> None:
        """Count `budget_s` seconds of RL from now (call after restoring `progress` from a checkpoint)."""
        if self.schedule == "constant":  # nothing to decay: keep the LR (and resume) independent of time
            return
        self._clock = (time.perf_counter(), max(budget_s, 1e-9), self.progress)

    def _time_progress(self) -> float:
        if self._clock is None:
            return 0.0
        start, budget_s, at_start = self._clock
        return at_start + (1.0 - at_start) * (time.perf_counter() - start) / budget_s

    def factor(self, step: int) -> float:
        """The multiplier for RL step `step`; records its progress."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        by_steps = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        self.progress = min(1.0, max(by_steps, self._time_progress(), self.progress))
        return decay_factor(self.schedule, self.progress)


def micro_batch_rows(cfg: TrainerConfig, width: int) -> int:
    """Rows per forward/backward: at most `micro_batch_size`, and at most `micro_batch_tokens` padded tokens
    (the logits are `rows x width x vocab`: a 150k vocabulary makes rows x width the memory that counts)."""
    return max(1, min(cfg.micro_batch_size, cfg.micro_batch_tokens // max(width, 1)))


class RLTrainer:
    def __init__(
        self,
        policy: Policy,
        algorithm: AlgorithmConfig,
        trainer: TrainerConfig,
        *,
        total_rl_steps: int,
        temperature: float,
        norm_len: int,
        seed: int = 0,
    ) -> None:
        self.policy = policy
        self.algo = algorithm
        self.cfg = trainer
        self.temperature = temperature
        self.norm_len = norm_len
        self.seed = seed
        self.updates = 0
        self.nonfinite_streak = 0  # optimizer steps in a row skipped for a non-finite gradient norm
        if trainer.disable_dropout:
            disable_dropout(policy.model)
        self.optimizer = build_optimizer(policy, trainer)
        self.schedule = RLSchedule(trainer.schedule, trainer.warmup_steps, total_rl_steps)

    @property
    def _agg_mode(self) -> str:
        """How KL and entropy terms aggregate: as the loss does when set, else per token."""
        return self.algo.loss_agg or "token-mean"

    def _loss_kwargs(self) -> dict[str, object]:
        kwargs: dict[str, object] = {"norm_len": self.norm_len}
        for key in ("clip_low", "clip_high", "dual_clip", "loss_agg"):
            value = getattr(self.algo, key)
            if value is not None:  # None: the loss's own default (range, aggregation)
                kwargs["agg" if key == "loss_agg" else key] = value
        return kwargs

    def _set_lr(self, step: int) -> float:
        lr = self.cfg.lr * self.schedule.factor(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _optimizer_step(self, params: list[torch.nn.Parameter], step: int) -> float | None:
        """Clip and step; a non-finite gradient norm skips the step (weights and Adam moments untouched)."""
        clip = self.cfg.grad_clip if self.cfg.grad_clip is not None else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        if math.isfinite(norm):
            self.optimizer.step()
            self.nonfinite_streak = 0
            return norm
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_streak += 1
        if self.nonfinite_streak >= self.cfg.max_nonfinite_steps:
            raise NonFiniteGradientError(
                f"stopped at RL step {step + 1}: the gradient norm was {norm} on {self.nonfinite_streak} "
                "optimizer steps in a row (trainer.max_nonfinite_steps), none applied; the last checkpoint "
                "is intact. Look for NaN/inf in rewards or advantages, or lower trainer.lr"
            )
        return None

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """One RL update of the batch of RL step `step` (0-based), which sets the learning rate."""
        if batch.advantages is None or batch.old_log_probs is None:
            raise ValueError("RLTrainer.update needs a batch with advantages and old_log_probs")
        kl_in_loss = self.algo.kl.coef > 0 and self.algo.kl.placement == "loss"
        if kl_in_loss and batch.ref_log_probs is None:
            raise ValueError("KL in the loss is on but the batch has no ref_log_probs")
        self.policy.model.train()
        lr = self._set_lr(step)
        params = self.policy.trainable_parameters()
        loss_fn = POLICY_LOSSES[self.algo.policy_loss]
        loss_kwargs = self._loss_kwargs()
        with_entropy = self.cfg.log_entropy or bool(self.algo.entropy_coef)
        rows_total = batch.input_ids.shape[0]
        micro_rows = micro_batch_rows(self.cfg, batch.input_ids.shape[1])
        # Seeded per update so a resumed run shuffles exactly like an uninterrupted one.
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "minibatch-shuffle", self.updates))
        # Loss metrics are summed per mini-batch and kept only when its optimizer step applied: a skipped
        # step's NaN loss says nothing about the update that happened.
        sums: dict[str, float] = defaultdict(float)
        tokens_seen = 0.0
        grad_norms: list[float] = []
        skipped = 0
        # Until the first optimizer step the policy is the one that sampled, so in sampler mode the
        # first mini-batch's forward gives the sampler/trainer log-prob mismatch without an extra pass.
        watch_mismatch = self.algo.old_log_probs == "sampler"
        mismatch_sum = mismatch_tokens = 0.0
        for _ in range(self.cfg.ppo_epochs):
            shuffle = self.cfg.ppo_epochs > 1 or self.cfg.mini_batches > 1
            order = torch.randperm(rows_total, generator=generator) if shuffle else torch.arange(rows_total)
            for mini in order.tensor_split(min(self.cfg.mini_batches, rows_total)):
                num_tokens = batch.response_mask[mini].sum()
                self.optimizer.zero_grad(set_to_none=True)
                mini_sums: dict[str, float] = defaultdict(float)
                mini_tokens = 0.0
                for micro in mini.split(micro_rows):
                    mask = batch.response_mask[micro]
                    log_probs, entropy = self.policy.token_log_probs(
                        batch.input_ids[micro],
                        batch.attention_mask[micro],
                        temperature=self.temperature,
                        with_entropy=with_entropy,
                        entropy_grad=bool(self.algo.entropy_coef),
                        from_column=first_response_column(mask),
                    )
                    agg = {**loss_kwargs, "num_tokens": num_tokens, "num_seqs": len(mini)}
                    loss, metrics = loss_fn(
                        log_probs=log_probs,
                        old_log_probs=batch.old_log_probs[micro],
                        advantages=batch.advantages[micro],
                        response_mask=mask,
                        **agg,
                    )
                    mini_sums["loss/policy"] += float(loss.detach())
                    agg_mode = {k: agg[k] for k in ("num_tokens", "num_seqs", "norm_len")}
                    if kl_in_loss:
                        kl = KL_ESTIMATORS[self.algo.kl.estimator](log_probs, batch.ref_log_probs[micro])
                        kl_loss = aggregate_loss(kl, mask, self._agg_mode, **agg_mode)
                        loss = loss + self.algo.kl.coef * kl_loss
                        mini_sums["kl"] += float((kl.detach() * mask).sum())
                    if self.algo.entropy_coef:
                        loss = loss - self.algo.entropy_coef * aggregate_loss(
                            entropy, mask, self._agg_mode, **agg_mode
                        )
                    loss.backward()
                    n = float(mask.sum())
                    mini_tokens += n
                    if watch_mismatch:
                        gap = torch.where(mask.bool(), log_probs.detach() - batch.old_log_probs[micro], 0.0)
                        mismatch_sum += float(gap.abs().sum())
                        mismatch_tokens += n
                    mini_sums["loss/total"] += float(loss.detach())
                    if entropy is not None:
                        mini_sums["entropy"] += float((entropy.detach() * mask).sum())
                    for key, value in metrics.items():
                        mini_sums[key] += float(value) * n
                watch_mismatch = False
                norm = self._optimizer_step(params, step)
                if norm is None:
                    skipped += 1
                    continue
                grad_norms.append(norm)
                tokens_seen += mini_tokens
                for key, value in mini_sums.items():
                    sums[key] += value
        self.updates += 1
        out: dict[str, float] = {"train/nonfinite_steps": float(skipped)}
        if mismatch_tokens:
            out["mismatch/logprob_abs"] = mismatch_sum / mismatch_tokens
        if not grad_norms:  # every step skipped: no loss was applied, and no LR
            return out
        applied = len(grad_norms)
        out.update({key: sums.pop(key) / applied for key in ("loss/policy", "loss/total")})
        out.update({key: value / max(tokens_seen, 1.0) for key, value in sums.items()})
        out["grad_norm"] = sum(grad_norms) / applied
        out["lr"] = lr  # the LR every applied optimizer step of this RL step used
        return out

    def state_dict(self) -> dict[str, object]:
        return {
            "updates": self.updates,
            "lr_progress": self.schedule.progress,
            "nonfinite_streak": self.nonfinite_streak,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.updates = int(state["updates"])  # type: ignore[arg-type]
        # Checkpoints from before these fields: a step-clocked schedule and no streak.
        self.schedule.progress = float(state.get("lr_progress", 0.0))  # type: ignore[arg-type]
        self.nonfinite_streak = int(state.get("nonfinite_streak", 0))  # type: ignore[arg-type]
