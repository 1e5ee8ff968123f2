"""Loss aggregation: per-token losses [B,T] → one scalar, correct under gradient accumulation.

Under gradient accumulation each micro-batch's loss must be divided by the count of the *whole
optimizer step* (pass `num_tokens` / `num_seqs`), then the micro-batch losses are summed. Dividing
by each micro-batch's own count (a known bug class) over-weights tokens of short micro-batches.
Without the keyword counts, the counts of the tensors given are used.
"""

from __future__ import annotations

import torch

from hone.algorithms.utils import masked_sum

AGGREGATION_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_len: float | None = None,
) -> torch.Tensor:
    """Aggregate `per_token_loss` over the valid entries of `mask`.

    - "token-mean": sum over all valid tokens / num_tokens (DAPO's token-level loss).
    - "seq-mean-token-mean": each sequence's token mean, summed / num_seqs (the original GRPO).
    - "seq-mean-token-sum": each sequence's token sum, summed / num_seqs.
    - "seq-mean-token-sum-norm": masked sum / (num_seqs * norm_len), Dr.GRPO's constant normaliser;
      `norm_len` should be the generation budget (defaults to T, the tensor's width).
    `num_seqs` counts every row, empty rows included (they contribute 0).
    """
    if mode == "token-mean":
        denom = mask.sum() if num_tokens is None else num_tokens
        return masked_sum(per_token_loss, mask) / torch.as_tensor(denom).clamp(min=1)
    seqs = mask.shape[0] if num_seqs is None else num_seqs
    if mode == "seq-mean-token-mean":
        per_seq = masked_sum(per_token_loss, mask, dim=-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / seqs
    if mode == "seq-mean-token-sum":
        return masked_sum(per_token_loss, mask) / seqs
    if mode == "seq-mean-token-sum-norm":
        length = mask.shape[-1] if norm_len is None else norm_len
        return masked_sum(per_token_loss, mask) / (seqs * length)
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATION_MODES)}")
