"""Per-token log-probs and entropies from logits: the arithmetic `Policy.token_log_probs` runs per chunk.

Kept apart from the model plumbing so the memory and speed tricks are stated once and testable on plain
tensors. The log-prob of a target is `z[target] - logsumexp(z)` with `z = logits / temperature`; its
gradient with respect to `z` is `onehot(target) - softmax(z)`. `TargetLogProb` computes both a chunk of
positions at a time, straight from the model's logits (any float dtype, upcast to fp32 per chunk): autograd
over the same formula keeps a full-vocabulary copy for the temperature, another for the fp32 cast under
autocast, and runs five to seven full-vocabulary passes in the backward (the subtraction, the exponential,
the product, the gather's scatter, their sum, the division). On SmolLM2 (49k vocabulary, 32 x 48 response
tokens) those passes were ~2.5 s of a 13 s update on a 2-core CPU; this is one pass forward and one back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from hone.models.vision import ban_tokens

# Elements per chunk: a 2 MB fp32 temporary (10 positions of a 49k vocabulary), so a chunk's passes run in
# the core's cache, not memory. Measured on [32, 48, 49152] fp32 logits, forward + backward: 0.30 s at 8-10
# positions, 0.73 s at 256, 1.1 s for autograd over the whole tensor.
SCORE_CHUNK_ELEMENTS = 1 << 19


def _chunks(rows: int, cols: int, vocab: int) -> Iterator[tuple[slice, slice]]:
    """(row, column) slices of a [rows, cols, vocab] tensor, about `SCORE_CHUNK_ELEMENTS` elements each."""
    chunk = max(1, SCORE_CHUNK_ELEMENTS // max(vocab, 1))
    step_rows, step_cols = max(1, chunk // max(cols, 1)), max(1, min(cols, chunk))
    for r in range(0, rows, step_rows):
        for c in range(0, cols, step_cols):
            yield slice(r, r + step_rows), slice(c, c + step_cols)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`logits / temperature` of one chunk in fp32 or wider: a new tensor, or `logits` itself (fp32 at
    T = 1), so the caller writes into it only through `_banned`."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return z / temperature if temperature != 1.0 else z


def _banned(z: torch.Tensor, chunk: torch.Tensor, banned_ids: torch.Tensor | None) -> torch.Tensor:
    """`z = _scaled(chunk)` with the banned columns at the lowest value; copied first when `z` is `chunk`
    itself (a view of the caller's logits, which must not change)."""
    if banned_ids is None:
        return z
    return ban_tokens(z.clone() if z is chunk else z, banned_ids)


class TargetLogProb(torch.autograd.Function):
    """`log softmax(logits / T)[..., target]` of [B, T, V] logits, and optionally the entropy of the same
    distribution as a detached metric, a chunk of positions at a time (see the module docstring).

    A target's logit is read before any ban (a banned target is a prompt's image token, never scored: its
    masked log-prob stays finite), as `token_scores` does.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        banned_ids: torch.Tensor | None,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows, cols = logits.shape[:2]
        dtype = torch.promote_types(logits.dtype, torch.float32)
        lse = torch.empty((rows, cols), dtype=dtype, device=logits.device)
        picked = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if with_entropy else lse.new_empty(0)
        for r, c in _chunks(rows, cols, logits.shape[-1]):
            chunk = logits[r, c]
            z = _scaled(chunk, temperature)
            picked[r, c] = z.gather(-1, targets[r, c].unsqueeze(-1)).squeeze(-1)
            z = _banned(z, chunk, banned_ids)
            part = torch.logsumexp(z, dim=-1)
            lse[r, c] = part
            if with_entropy:
                entropy[r, c] = part - (z - part.unsqueeze(-1)).exp_().mul_(z).sum(-1)
        ctx.save_for_backward(logits, targets, lse, banned_ids)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return picked - lse, entropy

    @staticmethod
    def backward(ctx: Any, grad_lp: torch.Tensor, _grad_entropy: torch.Tensor) -> tuple[Any, ...]:
        logits, targets, lse, banned_ids = ctx.saved_tensors
        grad = torch.empty_like(logits)
        scale = grad_lp.to(lse.dtype) / ctx.temperature  # d lp / d logits = (onehot - softmax) / T
        for r, c in _chunks(*logits.shape):
            chunk = logits[r, c]
            z = _banned(_scaled(chunk, ctx.temperature), chunk, banned_ids)
            g = scale[r, c].unsqueeze(-1)
            part = torch.sub(z, lse[r, c].unsqueeze(-1)).exp_().mul_(-g)  # one new [chunk, V] tensor
            grad[r, c] = part.scatter_add_(-1, targets[r, c].unsqueeze(-1), g)
        return grad, None, None, None, None


def token_scores(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    banned_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` [B, T] under `logits` [B, T, V] / temperature (and entropies), fp32 whatever the
    logits' dtype (computed in fp32, or float64 for float64 logits), zero where `mask` is 0.
    `banned_ids`: tokens the sampler never draws (a VLM's vision tokens), out of the softmax here as there,
    so both normalise over the same vocabulary."""
    target_mask = mask.to(torch.promote_types(logits.dtype, torch.float32))
    if not (with_entropy and entropy_grad and torch.is_grad_enabled()):
        lp, ent = TargetLogProb.apply(logits, targets, temperature, banned_ids, with_entropy)
        return (lp * target_mask).float(), ((ent * target_mask).float() if with_entropy else None)
    # An entropy bonus needs the graph, which keeps the [B, T, V] softmax whatever we do: plain autograd.
    logits = logits.to(target_mask.dtype) / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if banned_ids is not None:
        logits = ban_tokens(logits, banned_ids)
    lse = torch.logsumexp(logits, dim=-1)
    ent = (lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)) * target_mask
    return ((picked - lse) * target_mask).float(), ent.float()
