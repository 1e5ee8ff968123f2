"""The RL update: `RLTrainer.update(batch, step) -> metrics`.

One call = `ppo_epochs` passes over the batch, each split into `mini_batches` optimizer steps
(`_mini_batches`), each accumulated over micro-batches (`_micro_losses`) by the optimizer step shared
with SFT (`hone.training.optim`). Every micro-batch loss is normalised by the token/sequence counts
of its whole *mini-batch* (`num_tokens`, `num_seqs`), so accumulation gives exactly the full-batch
gradient whatever the micro-batch size. The loss is a sum of named terms — the policy loss (the
algorithm, by registry name; its per-token terms weighted by the off-policy correction
`algorithm.off_policy` when one applies, see `_off_policy`), the KL penalty, the entropy bonus — each
a small function of one micro-batch returning its loss and metrics (`LossTerm`), so a value loss is
one more term.

The learning rate is a function of the RL step (and, under a time limit, of the time spent), not of
the optimizer steps taken, so filtered-out steps and short batches cannot leave the schedule short
of its end. Dropout is off for RL (`trainer.disable_dropout`); a step with a non-finite gradient
norm is skipped, and `trainer.max_nonfinite_steps` of them in a row stop the run.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from hone.algorithms import KL_ESTIMATORS, OFF_POLICY_CORRECTIONS, POLICY_LOSSES, aggregate_loss
from hone.config import AlgorithmConfig, TrainerConfig
from hone.seeding import derive_seed
from hone.training.optim import NonFiniteGradientError as NonFiniteGradientError  # the CLI catches it here
from hone.training.optim import OptimizerStepper
from hone.training.policy import Policy, disable_dropout, first_response_column
from hone.types import Batch


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


@dataclass(frozen=True)
class MicroBatch:
    """What a loss term sees of one forward/backward: the rows of the batch, the policy's log-probs (and
    entropy) on them, and the counts of the whole mini-batch they belong to, by which every term divides
    so the micro-batch losses of an optimizer step sum to its mini-batch loss."""

    batch: Batch
    rows: torch.Tensor  # indices into the batch
    mask: torch.Tensor  # [b, T] response mask of these rows
    log_probs: torch.Tensor  # [b, T], with grad
    entropy: torch.Tensor | None  # [b, T]; with grad only when the entropy bonus is on
    counts: dict[str, Any]  # num_tokens and num_seqs of the mini-batch, norm_len (aggregate_loss keywords)
    # [b, T] the off-policy correction's weight x keep per token (detached), multiplying the policy loss's
    # per-token terms; None when no correction applies
    token_weights: torch.Tensor | None = None


# A loss term: (its contribution to the loss, metrics). Metrics named "loss/..." are summed per optimizer
# step and reported as the mean over applied steps; every other metric is a sum over this micro-batch's
# trained tokens, reported per trained token.
LossTerm = Callable[[MicroBatch], tuple[torch.Tensor, dict[str, float]]]


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
        loss_params = inspect.signature(POLICY_LOSSES[algorithm.policy_loss]).parameters
        if algorithm.off_policy.name != "none" and "token_weights" not in loss_params:
            raise ValueError(
                f"policy loss {algorithm.policy_loss!r} takes no token_weights, so algorithm.off_policy.name "
                f"{algorithm.off_policy.name!r} could not weight its tokens"
            )
        if trainer.disable_dropout:
            disable_dropout(policy.model)
        self.stepper = OptimizerStepper(
            build_optimizer(policy, trainer),
            policy.trainable_parameters(),
            grad_clip=trainer.grad_clip,
            max_nonfinite_steps=trainer.max_nonfinite_steps,
            limit_key="trainer.max_nonfinite_steps",
            advice="the last checkpoint is intact. Look for NaN/inf in rewards or advantages, or lower "
            "trainer.lr",
        )
        self.schedule = RLSchedule(trainer.schedule, trainer.warmup_steps, total_rl_steps)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.stepper.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.stepper.optimizer = optimizer

    @property
    def _agg_mode(self) -> str:
        """How KL and entropy terms aggregate: as the loss does when set, else per token."""
        return self.algo.loss_agg or "token-mean"

    def _loss_kwargs(self) -> dict[str, object]:
        kwargs: dict[str, object] = {}
        for key in ("clip_low", "clip_high", "dual_clip", "loss_agg"):
            value = getattr(self.algo, key)
            if value is not None:  # None: the loss's own default (range, aggregation)
                kwargs["agg" if key == "loss_agg" else key] = value
        return kwargs

    # Loss terms: each returns its contribution to the loss and its metrics (see `LossTerm`).

    def _policy_term(self, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The registered policy-gradient loss (its metrics are means over the micro-batch's tokens), each
        token's term weighted by the off-policy correction when one applies."""
        batch, rows = micro.batch, micro.rows
        weighting = {} if micro.token_weights is None else {"token_weights": micro.token_weights}
        assert batch.old_log_probs is not None and batch.advantages is not None  # checked by update
        loss, metrics = POLICY_LOSSES[self.algo.policy_loss](
            log_probs=micro.log_probs,
            old_log_probs=batch.old_log_probs[rows],
            advantages=batch.advantages[rows],
            response_mask=micro.mask,
            **self._loss_kwargs(),
            **micro.counts,
            **weighting,
        )
        n = float(micro.mask.sum())
        return loss, {"loss/policy": float(loss.detach()), **{k: float(v) * n for k, v in metrics.items()}}

    def _kl_term(self, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """kl.coef x the KL estimate to the reference, aggregated as the policy loss is."""
        assert micro.batch.ref_log_probs is not None  # checked by update
        kl = KL_ESTIMATORS[self.algo.kl.estimator](micro.log_probs, micro.batch.ref_log_probs[micro.rows])
        loss = self.algo.kl.coef * aggregate_loss(kl, micro.mask, self._agg_mode, **micro.counts)
        return loss, {"kl": float((kl.detach() * micro.mask).sum())}

    def _entropy_term(self, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The entropy bonus, -entropy_coef x entropy (logged as "entropy" whether or not it is a term)."""
        assert micro.entropy is not None  # computed with grad whenever this term is on
        entropy = aggregate_loss(micro.entropy, micro.mask, self._agg_mode, **micro.counts)
        return -(self.algo.entropy_coef * entropy), {}

    def _loss_terms(self) -> list[LossTerm]:
        """The terms of this configuration's loss, summed in this order."""
        terms: list[LossTerm] = [self._policy_term]
        if self._kl_in_loss:
            terms.append(self._kl_term)
        if self.algo.entropy_coef:
            terms.append(self._entropy_term)
        return terms

    @property
    def _kl_in_loss(self) -> bool:
        return self.algo.kl.coef > 0 and self.algo.kl.placement == "loss"

    def _off_policy(self, batch: Batch) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The off-policy correction (`algorithm.off_policy`) of the whole batch, once per update: the
        per-token weights of the policy loss (weight x keep: a dropped token's term is 0 and the loss's
        token/sequence counts are unchanged, the estimator rho * 1[kept] of hone/algorithms/offpolicy.py),
        or None for `none`, and its metrics. Anchor: `old_log_probs` (the trainer's recomputation);
        behaviour: `sampler_log_probs`. Without sampler log-probs there is nothing to measure."""
        cfg = self.algo.off_policy
        if batch.sampler_log_probs is None:
            if cfg.name != "none":  # never a correction silently not applied (AReaL's trap)
                raise ValueError(
                    f"algorithm.off_policy.name {cfg.name!r} needs the batch's sampler_log_probs "
                    "(kept when algorithm.old_log_probs is recompute), and this batch has none"
                )
            return None, {}
        correction = OFF_POLICY_CORRECTIONS[cfg.name](
            anchor_log_probs=batch.old_log_probs,
            behaviour_log_probs=batch.sampler_log_probs,
            response_mask=batch.response_mask,
            level=cfg.level,
            cap=cfg.cap,
            lo=cfg.lo,
            hi=cfg.hi,
            bound=cfg.bound,
        )
        # `none` only measures: its weights are all 1, and leaving them out keeps today's update exact.
        weights = None if cfg.name == "none" else correction.weights * correction.keep
        return weights, correction.metrics

    def _mini_batches(self, rows: int) -> Iterator[torch.Tensor]:
        """Row indices of each optimizer step: `ppo_epochs` passes over the batch, each split into
        `mini_batches`, shuffled when there is more than one step (seeded per update, so a resumed run
        shuffles exactly like an uninterrupted one)."""
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "minibatch-shuffle", self.updates))
        shuffle = self.cfg.ppo_epochs > 1 or self.cfg.mini_batches > 1
        for _ in range(self.cfg.ppo_epochs):
            order = torch.randperm(rows, generator=generator) if shuffle else torch.arange(rows)
            yield from order.tensor_split(min(self.cfg.mini_batches, rows))

    def _micro_losses(
        self,
        batch: Batch,
        mini: torch.Tensor,
        terms: list[LossTerm],
        sums: dict[str, float],
        mismatch: list[float] | None,
        token_weights: torch.Tensor | None,
    ) -> Iterator[torch.Tensor]:
        """The loss of each micro-batch of mini-batch `mini` (one forward each, lazily: the optimizer step
        backwards one before the next is built); adds their metrics to `sums` and, when given, the
        sampler/trainer log-prob gap to `mismatch` ([sum of |gap|, tokens]). `token_weights` [B, T]: the
        off-policy correction's, or None."""
        counts = {
            "num_tokens": batch.response_mask[mini].sum(),
            "num_seqs": len(mini),
            "norm_len": self.norm_len,
        }
        with_entropy = self.cfg.log_entropy or bool(self.algo.entropy_coef)
        for rows in mini.split(micro_batch_rows(self.cfg, batch.input_ids.shape[1])):
            mask = batch.response_mask[rows]
            with self.autocast():
                log_probs, entropy = self.policy.token_log_probs(
                    batch.input_ids[rows],
                    batch.attention_mask[rows],
                    temperature=self.temperature,
                    with_entropy=with_entropy,
                    entropy_grad=bool(self.algo.entropy_coef),
                    from_column=first_response_column(mask),
                    prompt_lens=batch.prompt_lens[rows] if self.cfg.shared_prompts else None,
                )
            weights = None if token_weights is None else token_weights[rows]
            micro = MicroBatch(batch, rows, mask, log_probs, entropy, counts, weights)
            loss: torch.Tensor | None = None
            for term in terms:
                term_loss, metrics = term(micro)
                loss = term_loss if loss is None else loss + term_loss
                for key, value in metrics.items():
                    sums[key] += value
            assert loss is not None  # the policy term is always on
            n = float(mask.sum())
            sums["tokens"] += n
            sums["loss/total"] += float(loss.detach())
            if entropy is not None:
                sums["entropy"] += float((entropy.detach() * mask).sum())
            if mismatch is not None:
                assert batch.old_log_probs is not None
                gap = torch.where(mask.bool(), log_probs.detach() - batch.old_log_probs[rows], 0.0)
                mismatch[0] += float(gap.abs().sum())
                mismatch[1] += n
            yield loss

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """`trainer.autocast: bfloat16`: the forward's matmuls in bf16 (on CPUs with AMX/AVX-512 BF16 and on
        GPUs several times faster than fp32); `token_log_probs` takes the logits back to fp32 before the
        log-softmax, and the backward (run outside, as torch recommends) follows the recorded casts."""
        if self.cfg.autocast == "none":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.policy.device.type, dtype=torch.bfloat16)

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """One RL update of the batch of RL step `step` (0-based), which sets the learning rate."""
        if batch.advantages is None or batch.old_log_probs is None:
            raise ValueError("RLTrainer.update needs a batch with advantages and old_log_probs")
        if self._kl_in_loss and batch.ref_log_probs is None:
            raise ValueError("KL in the loss is on but the batch has no ref_log_probs")
        self.policy.model.train()
        lr = self.cfg.lr * self.schedule.factor(step)
        self.stepper.set_lr(lr)
        terms = self._loss_terms()
        token_weights, correction_metrics = self._off_policy(batch)
        # Loss metrics are summed per mini-batch and kept only when its optimizer step applied: a skipped
        # step's NaN loss says nothing about the update that happened.
        sums: dict[str, float] = defaultdict(float)
        grad_norms: list[float] = []
        skipped = 0
        # Until the first optimizer step the policy is the one that sampled, so in sampler mode the
        # first mini-batch's forward gives the sampler/trainer log-prob mismatch without an extra pass.
        mismatch = [0.0, 0.0]
        watch_mismatch = self.algo.old_log_probs == "sampler"
        for mini in self._mini_batches(batch.input_ids.shape[0]):
            mini_sums: dict[str, float] = defaultdict(float)
            watched = mismatch if watch_mismatch else None
            losses = self._micro_losses(batch, mini, terms, mini_sums, watched, token_weights)
            norm = self.stepper.step(losses, where=f"RL step {step + 1}")
            watch_mismatch = False
            if not math.isfinite(norm):
                skipped += 1
                continue
            grad_norms.append(norm)
            for key, value in mini_sums.items():
                sums[key] += value
        self.updates += 1
        out: dict[str, float] = {"train/nonfinite_steps": float(skipped), **correction_metrics}
        if mismatch[1]:
            out["mismatch/logprob_abs"] = mismatch[0] / mismatch[1]
        if not grad_norms:  # every step skipped: no loss was applied, and no LR
            return out
        out.update(_step_means(sums, grad_norms))
        out["lr"] = lr  # the LR every applied optimizer step of this RL step used
        return out

    def state_dict(self) -> dict[str, object]:
        return {
            "updates": self.updates,
            "lr_progress": self.schedule.progress,
            "nonfinite_streak": self.stepper.nonfinite_streak,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.updates = int(state["updates"])  # type: ignore[arg-type]
        # Checkpoints from before these fields: a step-clocked schedule and no streak.
        self.schedule.progress = float(state.get("lr_progress", 0.0))  # type: ignore[arg-type]
        self.stepper.nonfinite_streak = int(state.get("nonfinite_streak", 0))  # type: ignore[arg-type]


def _step_means(sums: dict[str, float], grad_norms: list[float]) -> dict[str, float]:
    """Metrics of the applied optimizer steps (see `LossTerm`): "loss/..." per step, the rest per trained
    token, and the mean gradient norm."""
    applied = len(grad_norms)
    tokens = max(sums.pop("tokens", 0.0), 1.0)
    out = {key: value / (applied if key.startswith("loss/") else tokens) for key, value in sums.items()}
    out["grad_norm"] = sum(grad_norms) / applied
    return out
