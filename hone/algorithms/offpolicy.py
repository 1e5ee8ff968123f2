"""Off-policy corrections (`algorithm.off_policy`): a per-token weight and keep-mask for the policy loss.

Three policies meet in an asynchronous or mismatched run: π_behav sampled the tokens (the sampler's
log-probs, `behaviour_log_probs`), π_anchor is the trainer's recomputation with the weights before this
update (AReaL's π_prox, `anchor_log_probs`), π_θ is being trained. The PPO ratio π_θ/π_anchor and its
clip stay the loss's job; a correction turns ρ = π_anchor/π_behav into `weights` (detached, multiplied
into each token's policy-loss term) and `keep` (tokens that stay in the loss), computed once per batch.

`level` picks which ρ every option uses (verl's rollout-correction aggregation levels):
`token` ρ_t; `sequence` Π_t ρ_t (exp of the sum of log-ratios over the response), broadcast to its
tokens; `geometric` (Π_t ρ_t)^(1/|T|) (exp of the mean), broadcast — verl uses it for rejection only.
Functions are called with keyword arguments and ignore the ones they do not use, so the trainer calls
every registered name the same way; a bound left as None takes the defaults below. Padding gets
weight 1 and keep 0, and nothing is nan/inf whatever the log-probs there or the size of a log-ratio.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hone.algorithms.utils import masked_mean
from hone.config.sections.algorithm import (  # mis / decoupled bounds, which the config checks
    DEFAULT_HI,
    DEFAULT_LO,
)
from hone.registry import Registry

DEFAULT_CAP = 2.0  # tis: verl's rollout_is_threshold default
# exp(±20) ≈ 4.9e8 / 2.1e-9: a log-ratio is clamped here before any unbounded exp (verl's SAFETY_BOUND),
# so a sequence ratio over hundreds of tokens, or a -1e4 log-prob, never overflows.
SAFE_LOG_RATIO = 20.0
LEVELS = ("token", "sequence", "geometric")


@dataclass
class Correction:
    """What a correction hands the trainer; all [B, T] tensors are detached."""

    weights: torch.Tensor  # per-token weight multiplying each token's policy-loss term; 1 on padding
    keep: torch.Tensor  # 1 on response tokens that stay in the loss, 0 on dropped tokens and padding
    metrics: dict[str, float]


CorrectionFn = Callable[..., Correction]
OFF_POLICY_CORRECTIONS: Registry[CorrectionFn] = Registry("off-policy correction")
register_off_policy = OFF_POLICY_CORRECTIONS.register


def log_ratio(
    anchor_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, response_mask: torch.Tensor, level: str
) -> torch.Tensor:
    """log ρ at `level`, broadcast to [B, T]; 0 on padding (so padding's ρ is 1)."""
    if level not in LEVELS:
        raise ValueError(f"unknown off-policy level {level!r}; choose one of {', '.join(LEVELS)}")
    valid = response_mask.bool()
    zero = torch.zeros((), dtype=anchor_log_probs.dtype, device=anchor_log_probs.device)
    # torch.where, not a product: -inf/nan log-probs on padding must not reach the sums below.
    token = torch.where(valid, anchor_log_probs.detach() - behaviour_log_probs.detach(), zero)
    if level == "token":
        return token
    per_seq = token.sum(-1) if level == "sequence" else masked_mean(token, response_mask, dim=-1)
    return torch.where(valid, per_seq.unsqueeze(-1).expand_as(token), zero)


def _log_bounds(lo: float | None, hi: float | None) -> tuple[float, float]:
    lo = DEFAULT_LO if lo is None else lo
    hi = DEFAULT_HI if hi is None else hi
    if not 0 <= lo < hi:
        raise ValueError(f"off-policy bounds need 0 <= lo < hi, got lo={lo}, hi={hi}")
    return (math.log(lo) if lo > 0 else -math.inf), math.log(hi)


def _within(log_rho: torch.Tensor, lo: float | None, hi: float | None) -> torch.Tensor:
    """Where lo <= ρ <= hi, compared in log space (no exp, so no overflow)."""
    log_lo, log_hi = _log_bounds(lo, hi)
    return (log_rho >= log_lo) & (log_rho <= log_hi)


def _result(
    *,
    log_rho: torch.Tensor,
    weights: torch.Tensor,
    keep: torch.Tensor,
    bounded: torch.Tensor,
    anchor_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
) -> Correction:
    """Set padding to weight 1 / keep 0 and compute the metrics every correction reports.

    Metrics, means over response tokens: `off_policy/is_ratio_mean` ρ at the level (before any
    truncation or mask; exp(±20)-clamped), `off_policy/weight_mean` the multiplier a token's loss term
    gets (weight, 0 where dropped), `off_policy/masked_frac` dropped tokens, `off_policy/truncated_frac`
    tokens whose weight a cap or clamp changed, `mismatch/logprob_abs` |log π_anchor - log π_behav|.
    """
    valid = response_mask.bool()
    one = torch.ones((), dtype=weights.dtype, device=weights.device)
    kept = keep & valid
    weights = torch.where(kept, weights, one)
    gap = log_ratio(anchor_log_probs, behaviour_log_probs, response_mask, "token").abs()
    metrics = {
        "off_policy/is_ratio_mean": masked_mean(log_rho.clamp(-SAFE_LOG_RATIO, SAFE_LOG_RATIO).exp(), valid),
        "off_policy/weight_mean": masked_mean(weights * kept, valid),
        "off_policy/masked_frac": masked_mean((valid & ~kept).to(weights.dtype), valid),
        "off_policy/truncated_frac": masked_mean((bounded & kept).to(weights.dtype), valid),
        "mismatch/logprob_abs": masked_mean(gap, valid),
    }
    return Correction(
        weights=weights,
        keep=kept.to(response_mask.dtype),
        metrics={name: float(value) for name, value in metrics.items()},
    )


@register_off_policy("none")
def no_correction(
    *,
    anchor_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    **_: object,
) -> Correction:
    """No correction: w = 1, every response token kept.

    verl's "bypass" mode: the trainer uses the sampler's log-probs as the PPO anchor, so π_anchor =
    π_behav and PPO's own ratio does the off-policy work. Metrics still measure ρ at `level` (when the
    trainer passes a recomputed anchor, they show the mismatch this option leaves uncorrected).
    """
    log_rho = log_ratio(anchor_log_probs, behaviour_log_probs, response_mask, level)
    valid = response_mask.bool()
    return _result(
        log_rho=log_rho,
        weights=torch.ones_like(log_rho),
        keep=valid,
        bounded=torch.zeros_like(valid),
        anchor_log_probs=anchor_log_probs,
        behaviour_log_probs=behaviour_log_probs,
        response_mask=response_mask,
    )


@register_off_policy("tis")
def truncated_is(
    *,
    anchor_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    cap: float | None = None,
    **_: object,
) -> Correction:
    """Truncated importance sampling: w = min(ρ, C), C = `cap` (default 2.0), every token kept.

    Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"; verl's
    rollout correction (`rollout_is: token|sequence`, `rollout_is_threshold` 2.0). Computed as
    exp(min(log ρ, log C)), exact and overflow-free. Departures: `geometric` level is allowed here
    (verl restricts it to rejection); no batch normalisation of the weights (verl's optional
    `rollout_is_batch_normalize`).
    """
    cap = DEFAULT_CAP if cap is None else cap
    if cap <= 0:
        raise ValueError(f"tis cap must be > 0, got {cap}")
    log_rho = log_ratio(anchor_log_probs, behaviour_log_probs, response_mask, level)
    valid = response_mask.bool()
    return _result(
        log_rho=log_rho,
        weights=log_rho.clamp(max=math.log(cap)).exp(),
        keep=valid,
        bounded=log_rho > math.log(cap),
        anchor_log_probs=anchor_log_probs,
        behaviour_log_probs=behaviour_log_probs,
        response_mask=response_mask,
    )


@register_off_policy("mis")
def masked_is(
    *,
    anchor_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    lo: float | None = None,
    hi: float | None = None,
    **_: object,
) -> Correction:
    """Masked importance sampling: tokens (or whole sequences) with ρ outside [lo, hi] drop out of the
    loss; kept ones get w = ρ. Defaults lo = 0.5, hi = 2.0.

    MIS as in Liu, Li et al. 2025 ("When speed kills stability", token/seq-MIS), IcePop (Ring team
    2025) and TRL's `*_mask` modes: the estimator is ρ·1[lo ≤ ρ ≤ hi], so kept tokens carry the ratio
    (the choice here). verl's rejection sampling alone (`rollout_rs` without `rollout_is`) keeps weight
    1 instead; with the ratio, mis = `decoupled` with `bound: mask`, named for the literature it comes
    from. `masked_frac` counts the dropped tokens.
    """
    log_rho = log_ratio(anchor_log_probs, behaviour_log_probs, response_mask, level)
    inside = _within(log_rho, lo, hi)
    return _result(
        log_rho=log_rho,
        weights=torch.where(inside, log_rho, 0 * log_rho).exp(),  # exp only where bounded by hi
        keep=inside,
        bounded=torch.zeros_like(inside),
        anchor_log_probs=anchor_log_probs,
        behaviour_log_probs=behaviour_log_probs,
        response_mask=response_mask,
    )


@register_off_policy("decoupled")
def decoupled(
    *,
    anchor_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    bound: str | None = None,
    lo: float | None = None,
    hi: float | None = None,
    **_: object,
) -> Correction:
    """AReaL's decoupled PPO weight: w = π_prox/π_behav (detached), always applied.

    Fu et al. 2025, "AReaL" (arXiv:2505.24298), decoupled objective after Hilton et al. 2021:
    E[w · min(u A, clip(u, 1±ε) A)], u = π_θ/π_prox clipped by the loss, π_prox = `anchor_log_probs`.
    `bound` (optional): `mask` drops tokens/sequences with w outside [lo, hi] (AReaL's
    `behav_imp_weight_cap` is the upper side of this), `clamp` clamps w into [lo, hi]; defaults 0.5 /
    2.0. Without a bound w is applied unbounded (only the exp(±20) overflow guard, counted in
    `truncated_frac`): AReaL's trap was a w silently not applied when no cap was set. `level` sequence
    gives verl's decoupled_seq_is (w = Π ρ_t per sequence).
    """
    log_rho = log_ratio(anchor_log_probs, behaviour_log_probs, response_mask, level)
    valid = response_mask.bool()
    if bound is None:
        if lo is not None or hi is not None:
            raise ValueError("decoupled: lo/hi bound w only with bound: mask or clamp")
        weights = log_rho.clamp(-SAFE_LOG_RATIO, SAFE_LOG_RATIO).exp()
        bounded = log_rho.abs() > SAFE_LOG_RATIO
        keep = valid
    elif bound == "clamp":
        log_lo, log_hi = _log_bounds(lo, hi)
        weights = log_rho.clamp(log_lo, log_hi).exp()
        bounded = ~_within(log_rho, lo, hi)
        keep = valid
    elif bound == "mask":
        keep = _within(log_rho, lo, hi)
        weights = torch.where(keep, log_rho, 0 * log_rho).exp()
        bounded = torch.zeros_like(keep)
    else:
        raise ValueError(f"unknown decoupled bound {bound!r}; choose mask or clamp")
    return _result(
        log_rho=log_rho,
        weights=weights,
        keep=keep,
        bounded=bounded,
        anchor_log_probs=anchor_log_probs,
        behaviour_log_probs=behaviour_log_probs,
        response_mask=response_mask,
    )
