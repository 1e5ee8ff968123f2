"""Advantage estimators: `(token_rewards, response_mask, ...) -> (advantages[B,T], returns[B,T])`.

Every estimator is called with keyword arguments only and ignores the ones it does not use, so the
trainer can call any registered name the same way. Outcome rewards arrive as `token_rewards`, with a
sequence's score on its last valid token (`scores_to_token_rewards`); per-token terms such as a KL
penalty in the reward may sit on any valid token. Both outputs are zero wherever `response_mask` is 0.

Recurrences over time (returns-to-go, GAE) run over *valid tokens only*: a masked position (padding,
or a tool/environment token inside a multi-turn response) is skipped as if absent, so it neither
discounts nor resets the return. Rewards placed on masked positions are ignored.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import torch

from hone.algorithms.utils import masked_whiten, sequence_scores
from hone.registry import Registry
from hone.types import Rollout

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")
register_advantage = ADVANTAGE_ESTIMATORS.register

# What the learner computes for a batch (and what a classic-control rollout adds for `gae`: episode
# boundaries); an estimator's other keyword parameters are hyperparameters.
BATCH_INPUTS = frozenset(
    {
        "token_rewards",
        "response_mask",
        "group_ids",
        "values",
        "turn_rewards",
        "turn_mask",
        "token_turns",
        "turn_anchors",
        "next_values",
        "dones",
        "terminated",
    }
)

# Batch inputs beyond the built-in ones: `(rollouts, columns) -> tensor`, rows in the batch's order and
# (for a per-token input) `columns` response columns aligned as `hone.training.collate` aligns them
# (column t scores token t + 1). An estimator that names one as a keyword parameter receives it, built
# from the step's rollouts; so an estimator with a new input is one file too (its builder beside it).
BatchInputFn = Callable[[Sequence[Rollout], int], torch.Tensor]
BATCH_INPUT_BUILDERS: Registry[BatchInputFn] = Registry("batch input")


def register_batch_input(name: str) -> Callable[[BatchInputFn], BatchInputFn]:
    """Register a builder of batch input `name` (see `BATCH_INPUT_BUILDERS`)."""
    if name in BATCH_INPUTS:  # the learner fills those itself: a second source would be ambiguous
        raise ValueError(f"batch input {name!r} is built in; register another name")
    return BATCH_INPUT_BUILDERS.register(name)


def _keywords(name: str) -> frozenset[str]:
    parameters = inspect.signature(ADVANTAGE_ESTIMATORS[name]).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def hyperparameters(name: str) -> frozenset[str]:
    """The hyperparameters estimator `name` declares: its keyword parameters that are not batch inputs
    (built in or registered). The learner fills each one from the `algorithm` config field of that name,
    or else from `algorithm.advantage_args` (one set in neither keeps the estimator's default), so a new
    estimator with a new hyperparameter is its function and nothing else."""
    return _keywords(name) - BATCH_INPUTS - frozenset(BATCH_INPUT_BUILDERS)


def hyperparameter_choices(name: str) -> dict[str, tuple[object, ...]]:
    """The values each `Literal`-typed hyperparameter of estimator `name` accepts, so that a recipe's
    misspelt choice (`std_over: btach`) fails when it loads, not at the first step after the model is up.
    An estimator whose annotations do not resolve here (a plugin's `TYPE_CHECKING` import) declares none."""
    try:
        hints = typing.get_type_hints(ADVANTAGE_ESTIMATORS[name])
    except (NameError, TypeError):
        return {}
    return {
        key: typing.get_args(hint)
        for key, hint in hints.items()
        if key in hyperparameters(name) and typing.get_origin(hint) is Literal
    }


def built_inputs(name: str) -> frozenset[str]:
    """The registered batch inputs (`BATCH_INPUT_BUILDERS`) estimator `name` reads."""
    return _keywords(name) & frozenset(BATCH_INPUT_BUILDERS)


def reads_values(name: str) -> bool:
    """Whether estimator `name` takes the critic's `values` (then the run needs a `critic` section)."""
    return "values" in inspect.signature(ADVANTAGE_ESTIMATORS[name]).parameters


class GroupStats(NamedTuple):
    """Per-row statistics of each row's group, all [B]."""

    sum: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor  # unbiased
    size: torch.Tensor  # long


def group_stats(scores: torch.Tensor, group_ids: torch.Tensor) -> GroupStats:
    """Per-row (group sum, group mean, unbiased group std, group size) of `scores` [B].

    The std of a singleton group, and of a group whose scores are all equal, is exactly 0 (a float mean
    of equal values can be off by an ulp, which would otherwise leave a spurious tiny std).
    """
    if not scores.is_floating_point():
        scores = scores.float()
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    counts_f = counts.to(scores.dtype)
    sums = torch.zeros_like(counts_f).index_add_(0, inverse, scores)
    means = sums / counts_f
    sq_dev = torch.zeros_like(counts_f).index_add_(0, inverse, (scores - means[inverse]) ** 2)
    stds = (sq_dev / (counts_f - 1).clamp(min=1)).sqrt()
    highest = torch.zeros_like(counts_f).scatter_reduce(0, inverse, scores, "amax", include_self=False)
    lowest = torch.zeros_like(counts_f).scatter_reduce(0, inverse, scores, "amin", include_self=False)
    stds = torch.where(highest == lowest, torch.zeros_like(stds), stds)
    return GroupStats(sums[inverse], means[inverse], stds[inverse], counts[inverse])


def _broadcast(per_seq: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_seq.unsqueeze(-1) * response_mask.to(per_seq.dtype)


def require_groups(group_ids: torch.Tensor | None, name: str) -> torch.Tensor:
    if group_ids is None:
        raise ValueError(f"advantage estimator {name!r} needs group_ids (the n rollouts of one prompt)")
    return group_ids


@register_advantage("grpo")
def grpo(
    *,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    std_over: Literal["group", "batch"] = "group",
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean(r_group)) / (std(r_group) + eps).

    std is the unbiased (n-1) std, as in the paper's reference code; a singleton group gets A = 0.
    With `norm_by_std=False` this is Dr.GRPO's advantage. returns == advantages (no critic).

    `std_over="batch"` keeps the group mean but divides by one unbiased std of the whole batch's scores
    (every row the estimator is given: in Hone, unscorable and failed rewards are already dropped):
    TRL's `scale_rewards="batch"`, which TRL's `GRPOConfig` attributes to the "PPO Lite" paper (Liu et
    al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning", arXiv:2508.08221:
    group-level mean, batch-level std). A group whose rewards are all equal still gets A = 0.
    """
    if std_over not in ("group", "batch"):
        raise ValueError(f"grpo: std_over must be 'group' or 'batch', not {std_over!r}")
    group_ids = require_groups(group_ids, "grpo")
    scores = sequence_scores(token_rewards, response_mask)
    stats = group_stats(scores, group_ids)
    adv = scores - stats.mean
    if norm_by_std:
        std = stats.std
        if std_over == "batch":  # a one-row batch has no std (torch warns); it is a singleton, zeroed below
            std = (scores.std() if len(scores) > 1 else scores.new_zeros(())).expand_as(scores)
        adv = adv / (std + eps)
    # Singleton groups, and equal-reward groups even with eps=0 (0/0), carry no signal.
    adv = torch.where((stats.size > 1) & (stats.std > 0), adv, torch.zeros_like(adv))
    advantages = _broadcast(adv, response_mask)
    return advantages, advantages.clone()


@register_advantage("dr_grpo")
def dr_grpo(
    *,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean(r_group).

    Dropping the std division removes GRPO's question-difficulty bias; pair it with the
    `seq-mean-token-sum-norm` aggregation to also remove the response-length bias.
    """
    return grpo(
        token_rewards=token_rewards, response_mask=response_mask, group_ids=group_ids, norm_by_std=False
    )


@register_advantage("rloo")
def rloo(
    *,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, "Back to Basics"): A_i = r_i - mean_{j != i} r_j.

    Equivalently n/(n-1) * (r_i - mean(r_group)). A singleton group has no baseline: A = 0.
    """
    group_ids = require_groups(group_ids, "rloo")
    scores = sequence_scores(token_rewards, response_mask)
    stats = group_stats(scores, group_ids)
    others = (stats.size - 1).to(scores.dtype)
    baseline = (stats.sum - scores) / others.clamp(min=1)
    adv = torch.where(stats.size > 1, scores - baseline, torch.zeros_like(scores))
    advantages = _broadcast(adv, response_mask)
    return advantages, advantages.clone()


def discounted_returns(rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1}, over valid tokens only (masked tokens are skipped)."""
    mask = response_mask.bool()
    running = torch.zeros_like(rewards[:, 0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(mask[:, t], running, torch.zeros_like(running))
    return returns


@register_advantage("reinforce_pp")
def reinforce_pp(
    *,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    eps: float = 1e-8,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go, whitened over the batch's valid tokens.

    returns = the raw return-to-go; advantages = its global (batch) normalisation, which replaces
    the critic's baseline. std is unbiased.
    """
    returns = discounted_returns(token_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask, eps), returns


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(
    *,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    eps: float = 1e-8,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu 2025): subtract the group-mean score, then whiten over the batch.

    The group mean removes per-prompt difficulty; the batch whitening (not per-group std, unlike GRPO)
    keeps the scale stable. A singleton group's centred score is 0.
    """
    group_ids = require_groups(group_ids, "reinforce_pp_baseline")
    scores = sequence_scores(token_rewards, response_mask)
    centred = _broadcast(scores - group_stats(scores, group_ids).mean, response_mask)
    return masked_whiten(centred, response_mask, eps), centred


@register_advantage("gae")
def gae(
    *,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor | None = None,
    next_values: torch.Tensor | None = None,
    dones: torch.Tensor | None = None,
    terminated: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = False,
    eps: float = 1e-8,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016), for PPO with a critic.

    delta_t = r_t + gamma * V_{t+1} - V_t (V after the last valid token is 0),
    A_t = delta_t + gamma * lam * A_{t+1};  returns = A + V (the critic's regression target).
    `whiten=True` whitens the advantages over the batch afterwards (returns keep the raw A).

    Episode boundaries (classic control: rows are environments, columns a rollout segment's steps, i.e.
    CleanRL's [T, N] transposed). Given any of `next_values`, `dones`, `terminated` (all [B, T]), GAE
    follows TorchRL's `generalized_advantage_estimate(..., done, terminated)`:

        delta_t = r_t + gamma * V(s_{t+1}) * (1 - terminated_t) - V_t
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}

    `next_values` (required then) is V(s_{t+1}) of each step: at a truncation or the segment's last
    step it is the value of that final / next observation, so a truncated episode bootstraps and only
    a true terminal (`terminated`) does not. `dones` (the episode ended at t: terminated or truncated)
    cuts the recursion; a terminated step counts as done even if `dones` misses it, and `terminated`
    defaults to `dones` when left out (TorchRL's default), `dones` to `terminated`. With neither, no
    episode ends inside the segment. Masked positions are skipped as in the token path.
    """
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values=[B,T] from a critic")
    if next_values is not None or dones is not None or terminated is not None:
        advantages, returns = _gae_with_boundaries(
            token_rewards, response_mask, values, next_values, dones, terminated, gamma, lam
        )
        if whiten:
            advantages = masked_whiten(advantages, response_mask, eps)
        return advantages, returns
    mask = response_mask.bool()
    zeros = torch.zeros_like(token_rewards[:, 0])
    next_value, running = zeros, zeros
    advantages = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(mask[:, t], delta + gamma * lam * running, running)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        advantages[:, t] = torch.where(mask[:, t], running, zeros)
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    if whiten:
        advantages = masked_whiten(advantages, response_mask, eps)
    return advantages, returns


def _gae_with_boundaries(
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor | None,
    dones: torch.Tensor | None,
    terminated: torch.Tensor | None,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`gae` over a rollout segment with episode boundaries (see `gae`); a separate function so that
    the token path's computation stays exactly what it was."""
    if next_values is None:
        raise ValueError(
            "gae with dones/terminated needs next_values=[B,T] (V of each step's next observation)"
        )
    if terminated is None:
        terminated = dones if dones is not None else torch.zeros_like(values, dtype=torch.bool)
    ended = terminated.bool() if dones is None else dones.bool() | terminated.bool()
    bootstrap = (~terminated.bool()).to(values.dtype)
    carry = gamma * lam * (~ended).to(values.dtype)
    deltas = rewards + gamma * next_values * bootstrap - values
    mask = response_mask.bool()
    zeros = torch.zeros_like(values[:, 0])
    running = zeros
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        running = torch.where(mask[:, t], deltas[:, t] + carry[:, t] * running, running)
        advantages[:, t] = torch.where(mask[:, t], running, zeros)
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages, returns
