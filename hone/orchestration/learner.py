"""The learner: scored groups → collate → old/ref log-probs → advantages → update → publish weights.

It reads only what the producer hands it (`ScoredGroups`) and the policy it trains; the one thing it sends
back is a weight publish, through the callable it was given (`RolloutSource.publish` in the loop).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from hone.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    explained_variance,
    masked_mean,
    scores_to_token_rewards,
    turn_sums,
)
from hone.config import HoneConfig
from hone.orchestration.collate import collate, turn_tensors
from hone.orchestration.producer import ScoredGroups
from hone.training.critic import CriticTrainer
from hone.training.policy import Policy, first_response_column
from hone.training.trainer import RLTrainer, micro_batch_rows
from hone.types import Batch, Rollout


@torch.no_grad()
def _log_probs(policy: Policy, batch: Batch, temperature: float, micro: int, shared: bool) -> torch.Tensor:
    policy.model.eval()
    log_probs, _ = policy.token_log_probs(
        batch.input_ids,
        batch.attention_mask,
        temperature=temperature,
        micro_batch_size=micro,
        from_column=first_response_column(batch.response_mask),
        prompt_lens=batch.prompt_lens if shared else None,
    )
    return log_probs


def compute_advantages(batch: Batch, rollouts: list[Rollout], cfg: HoneConfig) -> dict[str, float]:
    """Fill `batch.advantages`/`returns` from rewards (minus a per-token KL penalty when placed there)."""
    algo = cfg.algorithm
    scores = torch.tensor(
        [r.reward for r in rollouts], dtype=torch.float32, device=batch.response_mask.device
    )
    token_rewards = scores_to_token_rewards(scores, batch.response_mask)
    turns = {k: v.to(token_rewards.device) for k, v in turn_tensors(rollouts, token_rewards.shape[1]).items()}
    metrics: dict[str, float] = {}
    if algo.kl.coef > 0 and algo.kl.placement == "reward":
        assert batch.ref_log_probs is not None and batch.old_log_probs is not None
        kl = KL_ESTIMATORS[algo.kl.estimator](batch.old_log_probs, batch.ref_log_probs) * batch.response_mask
        token_rewards = token_rewards - algo.kl.coef * kl
        # Turn-level estimators read per-turn rewards: each turn pays the KL of its own tokens.
        penalty = turn_sums(kl, turns["token_turns"], turns["turn_rewards"].shape[1])
        turns["turn_rewards"] = turns["turn_rewards"] - algo.kl.coef * penalty
        metrics["kl"] = float(kl.sum() / batch.response_mask.sum().clamp(min=1))
    batch.advantages, batch.returns = ADVANTAGE_ESTIMATORS[algo.advantage](
        **turns,
        token_rewards=token_rewards,
        response_mask=batch.response_mask,
        group_ids=batch.group_ids,
        eps=algo.eps,
        norm_by_std=algo.norm_by_std,
        gamma=algo.gamma,
        lam=algo.lam,
        values=batch.values,
    )
    if batch.values is not None:  # the critic before its update, against the targets it is fitted to
        assert batch.returns is not None
        metrics["value/explained_variance"] = explained_variance(
            batch.values, batch.returns, batch.response_mask
        )
        metrics["value/mean"] = float(masked_mean(batch.values, batch.response_mask))
        metrics["returns/mean"] = float(masked_mean(batch.returns, batch.response_mask))
    return metrics


def mask_truncated(batch: Batch, rollouts: list[Rollout]) -> float:
    """DAPO's overlong filtering (Yu et al. 2025, §3.4; TRL's `mask_truncated_completions`): a response
    cut at `max_new_tokens` is not known to be wrong, only unfinished, so its tokens leave the loss
    (response mask 0). It is done after the advantages: the truncated rollout still counts in its
    group's baseline (its reward is what the policy earned), and in the reward and length metrics.
    Returns the share of rollouts masked."""
    truncated = torch.tensor(
        [r.finish_reason == "length" for r in rollouts], device=batch.response_mask.device
    )
    batch.response_mask[truncated] = 0.0
    return float(truncated.float().mean())


class Learner:
    """Trains the policy on `ScoredGroups` and publishes each new version of its weights.

    `version` counts publishes (one per step that updated the weights), not steps: a step whose groups
    were all filtered out publishes nothing, and staleness, the versions a rollout lags the learner,
    must count only the updates in between. A resumed run starts it from its checkpoint's `version`
    (AReaL #1388: a counter restarting at 0 let staleness grow without bound).

    With a `critic` (PPO, `algorithm.advantage: gae`) each step also computes the critic's values for
    GAE and regresses the critic on the returns after the policy's update. During the first
    `critic.warmup_steps` RL steps only the critic trains: the policy's weights stay as they are, so
    nothing is published and the sampler keeps its version (a publish of unchanged weights would cost
    a copy and count a version that changed nothing, inflating staleness)."""

    def __init__(
        self,
        *,
        policy: Policy,
        ref_policy: Policy | None,
        trainer: RLTrainer,
        cfg: HoneConfig,
        pad_id: int,
        publish: Callable[[int], None],
        version: int = 0,
        critic: CriticTrainer | None = None,
    ) -> None:
        self.policy = policy
        self.ref_policy = ref_policy
        self.trainer = trainer
        self.cfg = cfg
        self.pad_id = pad_id
        self.publish = publish
        self.version = version
        self.critic = critic

    def learn(self, groups: ScoredGroups, step: int) -> dict[str, float]:
        """Update on `groups` as RL step `step` (0-based; it sets the LR) and publish the next version.
        A step whose groups were all filtered out trains nothing and publishes nothing (the weights,
        and so the sampler's version, stay as they were); so does a critic warm-up step, which trains
        the critic only."""
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        if groups.rollouts:
            batch = self.batch(groups.rollouts)
            metrics |= compute_advantages(batch, groups.rollouts, self.cfg)
            if self.cfg.algorithm.mask_truncated:
                metrics["loss/truncated_masked_frac"] = mask_truncated(batch, groups.rollouts)
            policy_moves = self.critic is None or step >= self.critic.cfg.warmup_steps
            if policy_moves:
                metrics |= self.trainer.update(batch, step)
            if self.critic is not None:
                metrics |= self.critic.update(batch, step)
            if policy_moves:
                published = time.perf_counter()
                self.publish(self.version + 1)
                self.version += 1  # after the publish: one that timed out leaves the count as the sampler's
                metrics["time/publish_s"] = time.perf_counter() - published
        metrics["time/train_s"] = time.perf_counter() - t0
        return metrics

    def batch(self, rollouts: list[Rollout]) -> Batch:
        """Collated `rollouts` with the behaviour (old) and reference log-probs the config asks for (the
        trainer measures `mismatch/logprob_abs` from them: sampler vs recomputation), and the critic's
        values when there is one."""
        cfg = self.cfg
        batch = collate(rollouts, pad_id=self.pad_id).to(self.policy.device)
        micro = micro_batch_rows(cfg.trainer, batch.input_ids.shape[1])
        if cfg.algorithm.old_log_probs == "recompute":
            batch.sampler_log_probs = batch.old_log_probs  # π_behav, for the off-policy corrections
            assert batch.sampler_log_probs is not None  # collate fills it
            # In the update's precision (trainer.autocast): π_old and π_θ then agree exactly before the
            # first optimizer step, and the ratio measures the update, not the rounding.
            with self.trainer.autocast():
                batch.old_log_probs = _log_probs(
                    self.policy, batch, cfg.rollout.temperature, micro, cfg.trainer.shared_prompts
                )
        if self.ref_policy is not None:
            batch.ref_log_probs = _log_probs(
                self.ref_policy, batch, cfg.rollout.temperature, micro, cfg.trainer.shared_prompts
            )
        if self.critic is not None:
            batch.values = self.critic.values(batch)
        return batch
