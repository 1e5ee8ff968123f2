"""Policy-gradient losses: `(log_probs, old_log_probs, advantages, response_mask, ...) -> (loss, metrics)`.

All tensors are [B,T]; `old_log_probs` are the behaviour policy's (the sampler's, or the trainer's
recomputation at sampling time). Losses are called with keyword arguments and ignore unknown ones, so
the trainer calls every registered name the same way; a clip range left as None takes the loss's own
default (GSPO's ranges are three orders of magnitude smaller than PPO's). `num_tokens`, `num_seqs`
and `norm_len` pass through to `aggregate_loss` for gradient accumulation. `token_weights` [B,T]
(detached), when given, multiplies each token's loss term before aggregation, the counts unchanged: the
off-policy correction's weights (hone/algorithms/offpolicy.py; 0 drops a token). Metrics are detached
scalars averaged over this call's valid tokens and do not see the weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hone.algorithms.aggregation import aggregate_loss
from hone.algorithms.utils import masked_mean
from hone.registry import Registry

LossOutput = tuple[torch.Tensor, dict[str, torch.Tensor]]
PolicyLossFn = Callable[..., LossOutput]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register


def _log_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Zero on padding *before* exp: a huge log-ratio on a masked token would give inf, and inf * 0
    # gradients are nan even though the forward value is masked out.
    return torch.where(mask.bool(), log_probs - old_log_probs, torch.zeros_like(log_probs))


Bound = float | torch.Tensor


def _clip(ratio: torch.Tensor, low: Bound, high: Bound) -> torch.Tensor:
    """`ratio` clamped to [low, high]: `clamp` takes two numbers or two tensors, not one of each."""
    if isinstance(low, torch.Tensor) or isinstance(high, torch.Tensor):
        lo = torch.as_tensor(low, dtype=ratio.dtype, device=ratio.device)
        return ratio.clamp(lo, torch.as_tensor(high, dtype=ratio.dtype, device=ratio.device))
    return ratio.clamp(low, high)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, low: Bound, high: Bound
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token max(-A r, -A clip(r, low, high)) (PPO's clipped surrogate, negated) and where the clipped
    branch won. The bounds are on the ratio itself (PPO's 1-εl, 1+εh); both floats, or both tensors
    broadcasting against `ratio` (per-token bounds, as the Tinker server takes them)."""
    unclipped = -advantages * ratio
    clipped = -advantages * _clip(ratio, low, high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def cispo_per_token(
    log_probs: torch.Tensor, ratio: torch.Tensor, advantages: torch.Tensor, low: Bound, high: Bound
) -> torch.Tensor:
    """Per-token CISPO loss -sg(clip(r, low, high)) · A · log π (bounds on the ratio, as above)."""
    return -_clip(ratio, low, high).detach() * advantages * log_probs


def sequence_token_log_ratio(log_probs: torch.Tensor, seq_log_ratio: torch.Tensor) -> torch.Tensor:
    """GSPO-token's per-token log-ratio: the sequence's log-ratio as its value, each token's own log-prob's
    gradient (sg[s] · π(y_t) / sg[π(y_t)] in log space). `seq_log_ratio` has one entry per sequence
    (`log_probs` without its last axis)."""
    return seq_log_ratio.detach().unsqueeze(-1) + log_probs - log_probs.detach()


def _approx_kl(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(π_old ‖ π) on tokens sampled from π_old: (r - 1) - log r."""
    return masked_mean(torch.expm1(log_ratio) - log_ratio, mask).detach()


def _weighted(per_token: torch.Tensor, token_weights: torch.Tensor | None) -> torch.Tensor:
    """Each token's loss term times its off-policy weight (none given: unchanged, bit for bit)."""
    return per_token if token_weights is None else per_token * token_weights


@register_policy_loss("ppo")
def ppo_loss(
    *,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float | None = None,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_len: float | None = None,
    token_weights: torch.Tensor | None = None,
    **_: object,
) -> LossOutput:
    """PPO clipped surrogate (Schulman et al. 2017), per token: max(-A r, -A clip(r, 1-εl, 1+εh)).

    `clip_high > clip_low` is DAPO's clip-higher (Yu et al. 2025). `dual_clip=c` (Ye et al. 2020,
    c > 1) also bounds the loss of negative-advantage tokens at -A c, so a token whose ratio exploded
    cannot dominate the update. Defaults: εl = εh = 0.2, no dual clip.
    """
    clip_low = 0.2 if clip_low is None else clip_low
    clip_high = 0.2 if clip_high is None else clip_high
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    ratio = torch.exp(log_ratio)
    per_token, clipped = clipped_surrogate(ratio, advantages, 1.0 - clip_low, 1.0 + clip_high)
    metrics: dict[str, torch.Tensor] = {}
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -advantages * dual_clip
        dual_active = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual_active, bound, per_token)
        metrics["dual_clip_frac"] = masked_mean(dual_active.float(), response_mask).detach()
    loss = aggregate_loss(
        _weighted(per_token, token_weights),
        response_mask,
        agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_len=norm_len,
    )
    metrics["clip_frac"] = masked_mean(clipped.float(), response_mask).detach()
    metrics["approx_kl"] = _approx_kl(log_ratio, response_mask)
    return loss, metrics


@register_policy_loss("gspo")
def gspo_loss(
    *,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float | None = None,
    clip_high: float | None = None,
    agg: str = "seq-mean-token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_len: float | None = None,
    token_weights: torch.Tensor | None = None,
    **_: object,
) -> LossOutput:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"), GSPO-token form.

    The importance ratio is the sequence's length-normalised likelihood ratio
    s_i = exp(mean_t log(π/π_old)); GSPO-token uses s_{i,t} = sg[s_i] · π(y_t) / sg[π(y_t)], whose
    value equals s_i but lets per-token advantages through, and clips it PPO-style. Paper defaults:
    εl = 3e-4, εh = 4e-4, sequence-mean aggregation.
    """
    clip_low = 3e-4 if clip_low is None else clip_low
    clip_high = 4e-4 if clip_high is None else clip_high
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    seq_log_ratio = masked_mean(log_ratio, response_mask, dim=-1)
    token_log_ratio = sequence_token_log_ratio(log_probs, seq_log_ratio)
    token_log_ratio = torch.where(response_mask.bool(), token_log_ratio, torch.zeros_like(token_log_ratio))
    per_token, clipped = clipped_surrogate(
        torch.exp(token_log_ratio), advantages, 1.0 - clip_low, 1.0 + clip_high
    )
    loss = aggregate_loss(
        _weighted(per_token, token_weights),
        response_mask,
        agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_len=norm_len,
    )
    return loss, {
        "clip_frac": masked_mean(clipped.float(), response_mask).detach(),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }


@register_policy_loss("cispo")
def cispo_loss(
    *,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float | None = None,
    clip_high: float | None = None,
    agg: str = "token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_len: float | None = None,
    token_weights: torch.Tensor | None = None,
    **_: object,
) -> LossOutput:
    """CISPO (MiniMax 2025, "MiniMax-M1"): -sg(clip(r, 1-εl, 1+εh)) · A · log π.

    Clipping the importance weight (not the update) keeps a gradient on every token, including the
    rare high-ratio "fork" tokens PPO would drop. As in the paper there is no lower bound by default
    (εl = 1, i.e. weights clipped at 0); εh defaults to 0.28.
    """
    clip_low = 1.0 if clip_low is None else clip_low
    clip_high = 0.28 if clip_high is None else clip_high
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    ratio = torch.exp(log_ratio)
    per_token = cispo_per_token(log_probs, ratio, advantages, 1.0 - clip_low, 1.0 + clip_high)
    loss = aggregate_loss(
        _weighted(per_token, token_weights),
        response_mask,
        agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_len=norm_len,
    )
    clipped = (ratio > 1.0 + clip_high) | (ratio < 1.0 - clip_low)
    return loss, {
        "clip_frac": masked_mean(clipped.float(), response_mask).detach(),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }
