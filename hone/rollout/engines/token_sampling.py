"""Drawing one token per row from logits: temperature, top-k / top-p truncation, and the log-prob the
trainer recomputes (over the full vocabulary, before truncation)."""

from __future__ import annotations

from dataclasses import replace

import torch

from hone.models.vision import ban_tokens
from hone.types import SamplingParams


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    banned_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [B, V]; return the tokens and their untruncated log-probs.
    `banned_ids` are never picked (a VLM's vision tokens), and out of the log-softmax as the trainer's."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # at least fp32; float64 stays
    if banned_ids is not None:  # after the temperature, as `token_scores` does; on a copy (banned in place)
        scaled = logits / params.temperature if params.temperature else logits.clone()
        logits, params = ban_tokens(scaled, banned_ids), _unit_temperature(params)
    if params.temperature == 0:
        tokens = logits.argmax(-1)
        logprobs = torch.log_softmax(logits, -1)
    else:
        logits = logits / params.temperature
        logprobs = torch.log_softmax(logits, -1)
        truncated = _truncate(logits, params.top_k, params.top_p)
        probs = logprobs.exp() if truncated is logits else torch.softmax(truncated, -1)
        tokens = draw(probs, generator)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of `probs` [B, V] (non-negative, any scale), drawn with probability proportional to
    its entry: inverse-CDF sampling, one uniform per row against the row's running sum in float64.

    `torch.multinomial` draws an exponential per vocabulary entry: 10 ms a decode step at 32 x 49k on 2
    CPU cores, a tenth of SmolLM2's decode step; a cumulative sum and a binary search cost ~1 ms. An entry of
    probability 0 (a banned token, one cut by top-k/top-p) is never drawn: the search returns the first
    column whose running sum exceeds the uniform, and a zero entry does not raise the sum. The one way
    it could be is a uniform rounding up to the row's total; that draw is moved to the last positive entry.
    """
    cdf = probs.to(torch.float64).cumsum(-1)
    uniform = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device)
    tokens = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).clamp_(max=probs.shape[-1] - 1)
    impossible = probs.gather(-1, tokens) <= 0
    if bool(impossible.any()):
        last = probs.shape[-1] - 1 - (probs > 0).flip(-1).to(torch.int8).argmax(-1, keepdim=True)
        tokens = torch.where(impossible, last, tokens)
    return tokens.squeeze(-1)


def _unit_temperature(params: SamplingParams) -> SamplingParams:
    """`params` with temperature 1 where it was positive (the logits are already divided by it)."""
    return params if params.temperature == 0 else replace(params, temperature=1.0)


def _truncate(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside the top-k and outside the smallest set holding `top_p` of the mass."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already hold top_p; the first is always kept.
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def check_params(params: SamplingParams) -> None:
    if params.n < 1:
        raise ValueError(f"n must be >= 1, got {params.n}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {params.top_k}")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
