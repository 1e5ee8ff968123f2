"""A step's advantages and the per-batch rules around them: the estimator call with its inputs and
hyperparameters (`compute_advantages`), the turn metrics, DAPO's overlong filtering (`truncation_mask`)
and the entropy guard. Pure functions of rollouts, tensors and the `algorithm` section's parts; the
learner (`hone.rl.learner`) calls them."""

from __future__ import annotations

from typing import Any

import torch

from hone.algorithms import (
    ADVANTAGE_ESTIMATORS,
    BATCH_INPUT_BUILDERS,
    KL_ESTIMATORS,
    explained_variance,
    masked_mean,
    scores_to_token_rewards,
    turn_means,
    turn_sums,
)
from hone.algorithms.advantages import built_inputs, hyperparameters
from hone.algorithms.distill import distill_advantages
from hone.config import AlgorithmConfig, DistillConfig, EntropyGuardConfig
from hone.training.collate import turn_tensors
from hone.types import Rollout, TrainBatch


def estimator_settings(algo: AlgorithmConfig) -> dict[str, Any]:
    """The keyword hyperparameters `algorithm.advantage` is called with: the `algorithm` fields its
    signature names (`gamma`, `eps`, ...) and `algorithm.advantage_args` (its own; the config refuses a
    key that is also a field, so the two never overlap)."""
    fields = type(algo).model_fields
    named = {name: getattr(algo, name) for name in hyperparameters(algo.advantage) if name in fields}
    return named | algo.advantage_args


def compute_advantages(
    rollouts: list[Rollout],
    algo: AlgorithmConfig,
    *,
    response_mask: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    teacher_logp: torch.Tensor | None = None,
    distill: DistillConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Advantages and returns `[B, T]` of `rollouts` from their rewards (minus a per-token KL penalty when
    `algorithm.kl.placement` is reward), by `algorithm.advantage`; and their metrics. With the teacher's
    log-probs (`distill.teacher`), plus on-policy distillation's per-token term
    (`hone.algorithms.distill`, the student's log-probs being `old_logp`); with `distill.reward` false
    that term alone (returns 0)."""
    if teacher_logp is not None and distill is not None and not distill.reward:
        advantages, distill_metrics = distill_advantages(
            distill.mode, old_logp, teacher_logp, response_mask, distill.coef
        )
        return advantages, torch.zeros_like(advantages), distill_metrics
    scores = torch.tensor([r.reward for r in rollouts], dtype=torch.float32, device=response_mask.device)
    token_rewards = scores_to_token_rewards(scores, response_mask)
    columns = token_rewards.shape[1]
    turns = {k: v.to(token_rewards.device) for k, v in turn_tensors(rollouts, columns).items()}
    metrics: dict[str, float] = {}
    if algo.kl.coef > 0 and algo.kl.placement == "reward":
        assert ref_logp is not None
        kl = KL_ESTIMATORS[algo.kl.estimator](old_logp, ref_logp) * response_mask
        token_rewards = token_rewards - algo.kl.coef * kl
        # Turn-level estimators read per-turn rewards: each turn pays the KL of its own tokens.
        penalty = turn_sums(kl, turns["token_turns"], turns["turn_rewards"].shape[1])
        turns["turn_rewards"] = turns["turn_rewards"] - algo.kl.coef * penalty
        metrics["kl"] = float(kl.sum() / response_mask.sum().clamp(min=1))
    # Registered inputs are built only for the estimator that reads them.
    built = {
        name: BATCH_INPUT_BUILDERS[name](rollouts, columns).to(token_rewards.device)
        for name in built_inputs(algo.advantage)
    }
    advantages, returns = ADVANTAGE_ESTIMATORS[algo.advantage](
        **turns,
        **built,
        token_rewards=token_rewards,
        response_mask=response_mask,
        group_ids=group_ids,
        values=values,
        **estimator_settings(algo),
    )
    if turns["turn_mask"].shape[1] > 1:
        metrics |= turn_advantage_metrics(advantages, turns["token_turns"], turns["turn_mask"])
        if group_ids is not None:
            metrics["turns/anchored_frac"] = anchored_fraction(turns["turn_anchors"], group_ids)
    if teacher_logp is not None and distill is not None:
        extra, distill_metrics = distill_advantages(
            distill.mode, old_logp, teacher_logp, response_mask, distill.coef
        )
        advantages = advantages + extra
        metrics |= distill_metrics
    if values is not None:  # the critic before its update, against the targets it is fitted to
        metrics["value/explained_variance"] = explained_variance(values, returns, response_mask)
        metrics["value/mean"] = float(masked_mean(values, response_mask))
        metrics["returns/mean"] = float(masked_mean(returns, response_mask))
    return advantages, returns, metrics


def turn_advantage_metrics(
    advantages: torch.Tensor, token_turns: torch.Tensor, turn_mask: torch.Tensor
) -> dict[str, float]:
    """`advantage/turn_<k>` (1-based): the mean advantage of the batch's k-th turns (each turn's mean over
    its tokens), and `advantage/turn_<k>_negative`, the share of them below 0: where credit goes by turn
    index (a baseline biased against late turns shows as their mean sitting below 0)."""
    num_turns = turn_mask.shape[1]
    per_turn = turn_means(advantages, token_turns, num_turns)
    present = (turn_mask > 0) & (
        turn_sums((token_turns >= 0).to(advantages.dtype), token_turns, num_turns) > 0
    )
    out: dict[str, float] = {}
    for k in range(num_turns):
        values = per_turn[present[:, k], k]
        if len(values):
            out[f"advantage/turn_{k + 1}"] = float(values.mean())
            out[f"advantage/turn_{k + 1}_negative"] = float((values < 0).float().mean())
    return out


def anchored_fraction(turn_anchors: torch.Tensor, group_ids: torch.Tensor) -> float:
    """The share of turns after the first taken in a state (`turn_anchors`) that another trajectory of the
    same group also met: how much of a batch GiGPO's step groups can compare (0: it is GRPO)."""
    later = turn_anchors[:, 1:]
    valid = later >= 0
    if not bool(valid.any()):
        return 0.0
    keys = torch.stack(
        [group_ids.to(later.device).unsqueeze(-1).expand_as(later)[valid], later[valid]], dim=-1
    )
    _, inverse, counts = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)
    return float((counts[inverse] > 1).float().mean())


def truncation_mask(rollouts: list[Rollout], response_mask: torch.Tensor) -> tuple[torch.Tensor, float]:
    """DAPO's overlong filtering (Yu et al. 2025, §3.4; TRL's `mask_truncated_completions`): a response
    cut at `max_new_tokens` is not known to be wrong, only unfinished, so its tokens leave the loss.
    Returns the loss mask (a new tensor: `response_mask` with the truncated rows 0) and the share of
    rollouts masked. Applied after the advantages: the truncated rollout still counts in its group's
    baseline (its reward is what the policy earned), and in the reward and length metrics."""
    truncated = torch.tensor([r.finish_reason == "length" for r in rollouts], device=response_mask.device)
    loss_mask = response_mask.clone()
    loss_mask[truncated] = 0.0
    return loss_mask, float(truncated.float().mean())


def sampled_entropy(batch: TrainBatch) -> float:
    """The mean -log p of the batch's sampled response tokens under the policy that sampled them: a
    one-sample estimate of its per-token entropy at the sampling temperature, free (no forward pass)."""
    mask = batch.loss_mask
    return float(-(batch.behaviour_logp * mask).sum() / mask.sum().clamp(min=1))


def entropy_guard(guard: EntropyGuardConfig, entropy_coef: float, batch: TrainBatch) -> float | None:
    """`algorithm.entropy_guard`: the entropy-bonus weight of this update, or None for the configured
    `entropy_coef`. While the batch's sampled entropy is below the guard's floor, the bonus is at least
    the guard's `coef`."""
    if guard.floor is None or sampled_entropy(batch) >= guard.floor:
        return None
    return max(entropy_coef, guard.coef)
