"""The critic's loss and its diagnostics, pure tensor functions over `[B, T]` response positions.

`value_loss` is PPO's value-function term (Schulman et al. 2017, "Proximal Policy Optimization
Algorithms", eq. 9's L^VF) with the clipping of OpenAI baselines' PPO2 (`ppo2/model.py`), also used for
RLHF by Ouyang et al. 2022 (InstructGPT): the new value may move at most `clip` from the value the batch
was sampled with, and the loss is the larger (pessimistic) of the clipped and unclipped squared errors.
"""

from __future__ import annotations

import torch

from hone.algorithms.utils import masked_mean, masked_sum


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip: float | None = None,
    num_tokens: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """0.5 * (V - R)^2 per token, or with `clip` = ε_v PPO2's
    0.5 * max((V - R)^2, (V_old + clamp(V - V_old, -ε_v, ε_v) - R)^2),
    summed over valid tokens and divided by `num_tokens` (default: this batch's valid tokens; the
    trainer passes its mini-batch's count so micro-batch losses add up to the mini-batch mean).

    Metrics (sums over this batch's valid tokens, for the caller to divide): `clip_frac`, the tokens
    whose clipped error is the larger one (the gradient is the clipped one's: zero there).
    """
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token = unclipped
        clipped_more = torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        moved = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (moved - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clipped_more = clipped > unclipped
    denominator = response_mask.sum() if num_tokens is None else num_tokens
    loss = 0.5 * masked_sum(per_token, response_mask) / torch.as_tensor(denominator).clamp(min=1)
    return loss, {"clip_frac": masked_sum(clipped_more.to(values.dtype), response_mask).detach()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over valid tokens (the diagnostic of OpenAI baselines' PPO2): 1 is a
    perfect critic, 0 one no better than a constant, negative one worse. NaN when the returns are all
    equal (Var(R) = 0: nothing to explain)."""
    var_returns = _masked_var(returns, response_mask)
    if var_returns == 0:
        return float("nan")
    return float(1.0 - _masked_var(returns - values, response_mask) / var_returns)


def _masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The population variance (both variances divide by the same count, so the choice cancels)."""
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask)
