"""Per-token log-probs and entropies from logits: the arithmetic `Policy.token_log_probs` runs per chunk.

Kept apart from the model plumbing so the memory tricks (in-place temperature, gather + logsumexp instead
of log_softmax, chunked entropy) are stated once and testable on plain tensors.
"""

from __future__ import annotations

import torch

from hone.models.vision import ban_tokens

# Positions per softmax when entropy is a metric: a [1024, V] float temporary instead of a [B, T, V] one.
ENTROPY_CHUNK = 1024


@torch.no_grad()
def chunked_entropy(logits: torch.Tensor, lse: torch.Tensor, chunk: int = ENTROPY_CHUNK) -> torch.Tensor:
    """Entropy `lse - sum(softmax(z) * z)` of `[B, T, V]` logits `z` with `lse = logsumexp(z)`, no graph.

    About `chunk` positions at a time, through views of `logits` (a strided slice is never copied), so the
    peak extra memory is one `[chunk, V]` float tensor rather than a second `[B, T, V]` one.
    """
    rows, cols = logits.shape[:2]
    out = torch.empty_like(lse)
    step_rows, step_cols = max(1, chunk // max(cols, 1)), max(1, min(cols, chunk))
    for r in range(0, rows, step_rows):
        for c in range(0, cols, step_cols):
            z = logits[r : r + step_rows, c : c + step_cols].to(lse.dtype)
            part_lse = lse[r : r + step_rows, c : c + step_cols]
            # One [chunk, V] temporary: the probabilities, then (in place) their products with z.
            weighted = (z - part_lse.unsqueeze(-1)).exp_().mul_(z)
            out[r : r + step_rows, c : c + step_cols] = part_lse - weighted.sum(-1)
    return out


def token_scores(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    banned_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` [B, T] under fp32 `logits` [B, T, V] / temperature (and entropies), zero where
    `mask` is 0. `banned_ids`: tokens the sampler never draws (a VLM's vision tokens), out of the softmax
    here as there, so both normalise over the same vocabulary."""
    if temperature != 1.0:  # in place when no graph needs the original: one [B, T, V] tensor less
        logits = logits / temperature if logits.requires_grad else logits.div_(temperature)
    # The targets' logits before any ban: a banned target is an image token of the prompt, never a scored
    # response token, and its (masked-out) log-prob stays finite rather than the dtype's lowest value.
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if banned_ids is not None:
        logits = ban_tokens(logits, banned_ids)
    target_mask = mask.to(logits.dtype)
    # gather + logsumexp: avoids a second full-vocab tensor that log_softmax would allocate.
    lse = torch.logsumexp(logits, dim=-1)
    lp = (picked - lse) * target_mask
    ent = None
    if with_entropy and entropy_grad and torch.is_grad_enabled():
        # An entropy bonus needs the graph, which keeps the [B, T, V] softmax whatever we do.
        ent = (lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)) * target_mask
    elif with_entropy:
        ent = chunked_entropy(logits.detach(), lse.detach()) * target_mask
    return lp, ent
