"""Rollouts → `Batch`: the one place sequences are padded and response tensors aligned."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hone.types import Batch, Rollout


def collate(rollouts: Sequence[Rollout], pad_id: int) -> Batch:
    """Right-pad `token_ids` to the longest rollout; response tensors are `[B, L-1]`.

    Column `t` of the response tensors scores token `t + 1`, so the response token at sequence index
    `prompt_len + j` lives in column `prompt_len + j - 1`. `old_log_probs` starts as the sampler's
    log-probs (the orchestrator may overwrite them with a trainer recomputation).
    """
    if not rollouts:
        raise ValueError("cannot collate an empty list of rollouts")
    length = max(len(r.token_ids) for r in rollouts)
    rows = len(rollouts)
    input_ids = torch.full((rows, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, length), dtype=torch.long)
    response_mask = torch.zeros((rows, length - 1))
    old_log_probs = torch.zeros((rows, length - 1))
    for i, r in enumerate(rollouts):
        n = len(r.token_ids)
        if len(r.loss_mask) != r.response_len or len(r.sampler_logprobs) != r.response_len:
            raise ValueError(f"rollout {i} ({r.sample_id}): loss_mask/sampler_logprobs length != response")
        if r.prompt_len < 1:
            raise ValueError(f"rollout {i} ({r.sample_id}): empty prompt; nothing to condition on")
        input_ids[i, :n] = torch.tensor(r.token_ids)
        attention_mask[i, :n] = 1
        cols = slice(r.prompt_len - 1, n - 1)
        response_mask[i, cols] = torch.tensor(r.loss_mask, dtype=torch.float32)
        old_log_probs[i, cols] = torch.tensor(r.sampler_logprobs, dtype=torch.float32)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        old_log_probs=old_log_probs,
        group_ids=torch.tensor([r.group_id for r in rollouts]),
    )
