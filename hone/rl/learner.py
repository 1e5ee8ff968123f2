"""The learner: scored groups → collate → old/ref/teacher log-probs → advantages → update → publish weights.
The algorithm of each stage lives below this package (advantages and loss masks: `hone.training.advantages`).

It reads only what the producer hands it (`ScoredGroups`) and the policy it trains; the one thing it sends
back is a weight publish, through the callable it was given (`RolloutSource.publish` in the loop).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hone.algorithms import turn_means
from hone.algorithms.metrics import canary_metrics, offpolicy_ess
from hone.config import AlgorithmConfig, DistillConfig, TrainerConfig
from hone.rl.canary import LogprobCanary
from hone.rl.producer import ScoredGroups
from hone.training.advantages import compute_advantages, entropy_guard, truncation_mask
from hone.training.collate import collate, turn_tensors
from hone.training.critic import CriticTrainer
from hone.training.distributed import ONE_RANK, Ranks
from hone.training.policy import Policy, first_response_column
from hone.training.ppo import micro_batch_rows
from hone.training.trainer import RLTrainer
from hone.types import Batch, Rollout, TrainBatch


@torch.no_grad()
def _log_probs(
    policy: Policy, seqs: Batch, temperature: float, micro: int, shared: bool, ranks: Ranks
) -> torch.Tensor:
    """The batch's per-token log-probs under `policy`; on N ranks each scores a share (`Ranks.by_rows`),
    forwarding rows whole: a shared-prompt forward is one or two model calls by the rows, and every rank
    must make the same calls."""
    policy.model.eval()
    first = first_response_column(seqs.response_mask)  # the whole batch's, on every rank
    shared = shared and ranks.world == 1

    def score(rows: torch.Tensor | None) -> torch.Tensor:
        pick = (lambda t: t) if rows is None else (lambda t: t[rows.to(t.device)])
        log_probs, _ = policy.token_log_probs(
            pick(seqs.input_ids),
            pick(seqs.attention_mask),
            temperature=temperature,
            micro_batch_size=micro,
            from_column=first,
            prompt_lens=pick(seqs.prompt_lens) if shared else None,
            vision=None if seqs.vision is None else seqs.vision.select(slice(None) if rows is None else rows),
        )
        return log_probs

    return ranks.by_rows(len(seqs.input_ids), score)


@dataclass(kw_only=True)
class Learner:
    """Trains the policy on `ScoredGroups` and publishes each new version of its weights.

    `version` counts publishes (one per step that updated the weights), not steps: a step whose groups
    were all filtered out publishes nothing, and staleness, the versions a rollout lags the learner,
    must count only the updates in between. A resumed run starts it from its checkpoint's `version`
    (AReaL #1388: a counter restarting at 0 let staleness grow without bound).

    With a `critic` (PPO, `algorithm.advantage: gae`) each step also computes the critic's values for
    GAE, and the critic is the update's second optimizee after the policy. During the first
    `critic.warmup_steps` RL steps only the critic trains: the policy's weights stay as they are, so
    nothing is published and the sampler keeps its version (a publish of unchanged weights would cost
    a copy and count a version that changed nothing, inflating staleness).

    `algorithm` says how old log-probs, advantages and the loss mask are made; `trainer_cfg` and
    `temperature` must be the trainer's (the no-grad log-prob passes match its forward: micro-batch
    rows, shared prompts, temperature)."""

    policy: Policy
    ref_policy: Policy | None
    teacher: Policy | None = None  # on-policy distillation's teacher (`distill`), scoring as the reference
    distill: DistillConfig = field(default_factory=DistillConfig)
    trainer: RLTrainer
    algorithm: AlgorithmConfig
    trainer_cfg: TrainerConfig
    temperature: float
    pad_id: int
    publish: Callable[[int], None]
    version: int = 0
    critic: CriticTrainer | None = None
    ranks: Ranks = ONE_RANK  # N learner ranks: the no-grad passes split over them too
    canary: LogprobCanary | None = None  # checks the sampler's log-probs against this learner's
    # Each rollout's advantage (the mean over its response tokens) of the latest batch, in its order; and
    # of a multi-turn batch, each rollout's per-turn advantages (each turn's mean over its tokens).
    advantages: list[float] = field(default_factory=list, init=False)
    turn_advantages: list[list[float]] = field(default_factory=list, init=False)

    def learn(self, groups: ScoredGroups, step: int) -> dict[str, float]:
        """Update on `groups` as RL step `step` (0-based; it sets the LR) and publish the next version.
        A step whose groups were all filtered out trains nothing and publishes nothing (the weights,
        and so the sampler's version, stay as they were); so does a critic warm-up step, which trains
        the critic only."""
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        self.advantages, self.turn_advantages = [], []
        if groups.rollouts:
            batch, metrics = self.batch(groups.rollouts)
            policy_moves = self.critic is None or step >= self.critic.cfg.warmup_steps
            entropy_coef = entropy_guard(self.algorithm.entropy_guard, self.algorithm.entropy_coef, batch)
            if self.algorithm.entropy_guard.floor is not None:
                metrics["guard/entropy_coef"] = (
                    self.algorithm.entropy_coef if entropy_coef is None else entropy_coef
                )
            if policy_moves:
                metrics |= self.trainer.update(batch, step, entropy_coef=entropy_coef)
            if self.canary is not None:  # before the publish: the version the checked rows were sampled at
                self.canary.check(metrics, step, self.version)
            if self.critic is not None:
                metrics |= self.critic.update(batch, step)
            if policy_moves:
                published = time.perf_counter()
                self.publish(self.version + 1)
                self.version += 1  # after the publish: one that timed out leaves the count as the sampler's
                metrics["time/publish_s"] = time.perf_counter() - published
        metrics["time/train_s"] = time.perf_counter() - t0
        return metrics

    def batch(self, rollouts: list[Rollout]) -> tuple[TrainBatch, dict[str, float]]:
        """The `TrainBatch` of `rollouts`, every field made once: the sampler's (behaviour) log-probs, the
        old ones (recomputed in the update's precision when `algorithm.old_log_probs` is recompute, so the
        trainer measures `mismatch/logprob_abs` between the two), the reference's, the teacher's, the critic's
        values, the advantages and the loss mask; and the metrics of making them."""
        seqs = collate(rollouts, pad_id=self.pad_id).to(self.policy.device)
        assert seqs.sampler_log_probs is not None  # collate fills it
        micro = micro_batch_rows(self.trainer_cfg, seqs.input_ids.shape[1])
        shared = self.trainer_cfg.shared_prompts
        old_logp = seqs.sampler_log_probs
        ranks = self.ranks
        # Rows sampled with the weights held now: what the log-prob canary can compare (`canary`).
        fresh = torch.tensor(
            [r.policy_version == r.newest_version == self.version for r in rollouts], device=old_logp.device
        )
        canary: dict[str, float] = {}
        if self.algorithm.old_log_probs == "recompute":
            # In the update's precision (trainer.autocast): π_old and π_θ then agree exactly before the
            # first optimizer step, and the ratio measures the update, not the rounding.
            with self.trainer.autocast():
                old_logp = _log_probs(self.policy, seqs, self.temperature, micro, shared, ranks)
            gap = (old_logp - seqs.sampler_log_probs).abs() * seqs.response_mask * fresh[:, None]
            tokens = float((seqs.response_mask * fresh[:, None]).sum())
            canary = canary_metrics(float(gap.sum()), tokens, float(gap.max()) if gap.numel() else 0.0)
            canary |= offpolicy_ess(old_logp - seqs.sampler_log_probs, seqs.response_mask)
        ref_logp = None
        if self.ref_policy is not None:
            ref_logp = _log_probs(self.ref_policy, seqs, self.temperature, micro, shared, ranks)
        teacher_logp = None
        if self.teacher is not None:
            teacher_logp = _log_probs(self.teacher, seqs, self.temperature, micro, shared, ranks)
        values = None
        if self.critic is not None:
            critic = self.critic

            def value(rows: torch.Tensor | None) -> torch.Tensor:
                pick = (lambda t: t) if rows is None else (lambda t: t[rows.to(t.device)])
                vision = (
                    None if seqs.vision is None else seqs.vision.select(slice(None) if rows is None else rows)
                )
                return critic.values(
                    pick(seqs.input_ids), pick(seqs.attention_mask), pick(seqs.response_mask), vision
                )

            values = ranks.by_rows(len(seqs.input_ids), value)
        advantages, returns, metrics = compute_advantages(
            rollouts,
            self.algorithm,
            response_mask=seqs.response_mask,
            old_logp=old_logp,
            ref_logp=ref_logp,
            values=values,
            group_ids=seqs.group_ids,
            teacher_logp=teacher_logp,
            distill=self.distill,
        )
        metrics |= canary
        per_token = advantages * seqs.response_mask
        self.advantages = (per_token.sum(1) / seqs.response_mask.sum(1).clamp(min=1)).tolist()
        if any(len(r.turns) > 1 for r in rollouts):
            token_turns = turn_tensors(rollouts, per_token.shape[1])["token_turns"].to(per_token.device)
            means = turn_means(per_token, token_turns, max(len(r.turns) for r in rollouts)).tolist()
            self.turn_advantages = [row[: len(r.turns)] for row, r in zip(means, rollouts, strict=True)]
        loss_mask = seqs.response_mask
        if self.algorithm.mask_truncated:
            loss_mask, metrics["loss/truncated_masked_frac"] = truncation_mask(rollouts, seqs.response_mask)
        batch = TrainBatch(
            input_ids=seqs.input_ids,
            attention_mask=seqs.attention_mask,
            loss_mask=loss_mask,
            behaviour_logp=seqs.sampler_log_probs,
            old_logp=old_logp,
            advantages=advantages,
            returns=returns,
            ref_logp=ref_logp,
            values=values,
            group_ids=seqs.group_ids,
            prompt_lens=seqs.prompt_lens,
            fresh=fresh.to(seqs.response_mask.dtype),
            vision=seqs.vision,
        )
        return batch, metrics
