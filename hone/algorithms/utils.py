"""Masked reductions shared by the estimators and losses."""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    # torch.where (not x * mask) so that inf/nan on padding can never leak into the result.
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    masked = torch.where(mask.bool(), x, zero)
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / (std + eps) over the valid entries, unbiased std; padding becomes 0."""
    n = mask.sum()
    mean = masked_mean(x, mask)
    var = masked_sum((x - mean) ** 2, mask) / (n - 1).clamp(min=1)
    return torch.where(mask.bool(), (x - mean) / (var.sqrt() + eps), torch.zeros_like(x))


def sequence_scores(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Outcome score of each sequence: the sum of its token rewards over valid tokens. [B,T] → [B]."""
    return masked_sum(token_rewards, response_mask, dim=-1)


def scores_to_token_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar score on its last valid token; zero elsewhere. [B] → [B,T].

    A sequence with no valid token gets no reward at all (nothing to credit it to).
    """
    if not scores.is_floating_point():
        scores = scores.float()
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).amax(dim=-1)  # -1 when the row is empty
    token_rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    token_rewards[rows, last[rows]] = scores[rows]
    return token_rewards


def turn_sums(token_values: torch.Tensor, token_turns: torch.Tensor, num_turns: int) -> torch.Tensor:
    """Sum of `token_values` over each turn's positions. [B,T] (turn index per position, -1 = no turn)
    → [B, num_turns]; positions with turn -1 (prompt, observations, padding) count nowhere."""
    in_turn = token_turns >= 0
    values = torch.where(in_turn, token_values, torch.zeros_like(token_values))
    sums = torch.zeros(
        (token_values.shape[0], num_turns), dtype=token_values.dtype, device=token_values.device
    )
    return sums.scatter_add_(1, token_turns.clamp(min=0), values)


def turn_means(token_values: torch.Tensor, token_turns: torch.Tensor, num_turns: int) -> torch.Tensor:
    """Mean of `token_values` over each turn's positions, [B, num_turns] (0 for a turn with no positions)."""
    tokens = turn_sums((token_turns >= 0).to(token_values.dtype), token_turns, num_turns)
    return turn_sums(token_values, token_turns, num_turns) / tokens.clamp(min=1)
