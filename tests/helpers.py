"""Helpers shared by test modules (import them from here, never from another test module)."""

from __future__ import annotations

from typing import Any

import torch

from hone.types import Batch, TrainBatch


def train_batch(
    seqs: Batch, *, old_logp: torch.Tensor, advantages: torch.Tensor, **fields: Any
) -> TrainBatch:
    """A `TrainBatch` over collated `seqs` (`hone.orchestration.collate.collate`), as the learner makes one:
    the loss mask is the response mask, the behaviour log-probs are `old_logp` (the sampler was the
    policy) and the returns the advantages, unless `fields` says otherwise."""
    base: dict[str, Any] = {
        "input_ids": seqs.input_ids,
        "attention_mask": seqs.attention_mask,
        "loss_mask": seqs.response_mask,
        "behaviour_logp": old_logp,
        "old_logp": old_logp,
        "advantages": advantages,
        "returns": advantages,
        "group_ids": seqs.group_ids,
        "prompt_lens": seqs.prompt_lens,
    }
    return TrainBatch(**(base | fields))
