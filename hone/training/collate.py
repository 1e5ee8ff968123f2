"""Rollouts → `Batch`: the one place sequences are padded and response tensors aligned."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hone.types import Batch, Rollout, VisionBatch


def collate(rollouts: Sequence[Rollout], pad_id: int) -> Batch:
    """Right-pad `token_ids` to the longest rollout; response tensors are `[B, L-1]`.

    Column `t` of the response tensors scores token `t + 1`, so the response token at sequence index
    `prompt_len + j` lives in column `prompt_len + j - 1`. The sampler's log-probs go to
    `sampler_log_probs` (the learner makes the `TrainBatch` with every other field).
    """
    if not rollouts:
        raise ValueError("cannot collate an empty list of rollouts")
    length = max(len(r.token_ids) for r in rollouts)
    rows = len(rollouts)
    input_ids = torch.full((rows, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, length), dtype=torch.long)
    response_mask = torch.zeros((rows, length - 1))
    sampler_log_probs = torch.zeros((rows, length - 1))
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
        sampler_log_probs[i, cols] = torch.tensor(r.sampler_logprobs, dtype=torch.float32)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        sampler_log_probs=sampler_log_probs,
        group_ids=torch.tensor([r.group_id for r in rollouts]),
        prompt_lens=torch.tensor([r.prompt_len for r in rollouts]),
        vision=VisionBatch.of([r.vision for r in rollouts]),
    )


def turn_tensors(rollouts: Sequence[Rollout], columns: int) -> dict[str, torch.Tensor]:
    """Per-turn inputs of turn-level advantages, aligned with `collate`'s response columns:
    `turn_rewards`/`turn_mask` [B, K], `token_turns` [B, columns] (-1 off assistant tokens) and
    `turn_anchors` [B, K] (GiGPO's anchor states: one id per distinct context before a turn, -1 on padding).

    A trajectory's rewards always sum to its `reward` (what the reward layer scored): the environment's
    per-turn rewards say *when* parts of it arrived, and the rest arrives with the last turn.

    A turn's context is its token ids before its first token; with images, the rollout's image keys
    join it (all of them: two episodes whose texts match but whose later images differ are never
    anchored together, at the cost of missing a shared state before those images).
    """
    most = max((len(r.turns) for r in rollouts), default=0) or 1
    turn_rewards = torch.zeros((len(rollouts), most))
    turn_mask = torch.zeros((len(rollouts), most))
    token_turns = torch.full((len(rollouts), columns), -1, dtype=torch.long)
    turn_anchors = torch.full((len(rollouts), most), -1, dtype=torch.long)
    anchor_ids: dict[tuple[int, tuple[str, ...], tuple[int, ...]], int] = {}
    for i, r in enumerate(rollouts):
        if not r.turns:  # single-turn: the whole response is turn 0
            turns = [(0, r.response_len)]
            per_turn = [0.0]
        else:
            turns = r.turns
            per_turn = (list(r.turn_rewards) + [0.0] * len(turns))[: len(turns)]
        per_turn[-1] += r.reward - sum(per_turn)
        turn_rewards[i, : len(turns)] = torch.tensor(per_turn)
        turn_mask[i, : len(turns)] = 1.0
        # A trie over the contexts: each turn's id is keyed by the previous turn's id and the tokens in
        # between, so equal ids mean equal whole contexts, at one pass over the tokens.
        parent, seen = -1, 0
        images = tuple(r.vision.image_keys) if r.vision is not None else ()
        for k, (start, end) in enumerate(turns):
            token_turns[i, r.prompt_len - 1 + start : r.prompt_len - 1 + end] = k
            context = (parent, images if k == 0 else (), tuple(r.token_ids[seen : r.prompt_len + start]))
            parent = turn_anchors[i, k] = anchor_ids.setdefault(context, len(anchor_ids))
            seen = r.prompt_len + start
    return {
        "turn_rewards": turn_rewards,
        "turn_mask": turn_mask,
        "token_turns": token_turns,
        "turn_anchors": turn_anchors,
    }
