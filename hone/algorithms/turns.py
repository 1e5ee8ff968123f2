"""Multi-turn advantage estimators: credit per assistant turn of an episode.

Batch inputs (from `hone.training.collate.turn_tensors`): `turn_rewards`, `turn_mask` [B, K] (K =
most turns in the batch; turns are contiguous from 0), `token_turns` [B, T] (each response position's
turn, -1 on prompt, observation and padding positions) and `turn_anchors` [B, K] (an id per turn of the
state it was taken in: turns whose contexts, everything before their first token, are identical share
an id; -1 on padding turns). Without turns (a single-turn run) the whole response is turn 0, rewarded
with the sum of `token_rewards`, taken in the prompt's state.

Given turns, `turn_rewards` is the whole reward: a per-token term such as a KL penalty must already be
summed into its turn (`turn_sums`); `token_rewards` is then unused. Each estimator computes per-turn
advantages [B, K] and spreads each turn's over its tokens; observation tokens get 0.

    estimator        baseline of turn k of trajectory i                        paper
    turn_grpo        the group's trajectory returns (or, per turn index, the    Zeng et al. 2025
                     returns-to-go of the group's turns k)
    gigpo            episode: the group's returns; step: the returns-to-go of    Feng et al. 2025
                     the group's turns taken in the same state (anchor groups)
    turn_reinforce   the batch's mean turn return-to-go (whitened)              Williams 1992; Hu 2025
"""

from __future__ import annotations

from typing import Literal

import torch

from hone.algorithms.advantages import group_stats, register_advantage, require_groups
from hone.algorithms.utils import masked_whiten

TurnBaseline = Literal["trajectory", "turn_index"]


def turn_returns(turn_rewards: torch.Tensor, turn_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_{i,k} = sum_{j >= k} gamma^(j-k) r_{i,j}: each turn's discounted return-to-go over the turns of
    its episode, [B, K]; padding turns (turn_mask 0) get 0 and add nothing."""
    rewards = turn_rewards * turn_mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for k in reversed(range(rewards.shape[1])):  # turns are contiguous from 0: padding turns stay 0
        running = rewards[:, k] + gamma * running
        returns[:, k] = running
    return returns * turn_mask


def _as_turns(
    token_rewards: torch.Tensor | None,
    response_mask: torch.Tensor,
    turn_rewards: torch.Tensor | None,
    turn_mask: torch.Tensor | None,
    token_turns: torch.Tensor | None,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(turn_rewards, turn_mask, token_turns); a run without turns is one turn per response."""
    if turn_rewards is not None and turn_mask is not None and token_turns is not None:
        return turn_rewards, turn_mask, token_turns
    if token_rewards is None:
        raise ValueError(f"advantage estimator {name!r} needs turn_rewards or token_rewards")
    rewards = (token_rewards * response_mask).sum(-1, keepdim=True)
    return rewards, torch.ones_like(rewards), torch.where(response_mask.bool(), 0, -1)


def _relative(
    values: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, *, eps: float, norm_by_std: bool
) -> torch.Tensor:
    """(v - mean_key(v)) / (std_key(v) + eps) for each valid entry of `values`, within the entries of the
    same `keys`; 0 on invalid entries and in a key's group that is a singleton or all equal (GRPO's rule:
    no signal, and no 1/eps blow-up)."""
    out = torch.zeros_like(values)
    if not bool(valid.any()):
        return out
    picked = values[valid]
    stats = group_stats(picked, keys[valid])
    relative = picked - stats.mean
    if norm_by_std:
        relative = relative / (stats.std + eps)
    relative = torch.where((stats.size > 1) & (stats.std > 0), relative, torch.zeros_like(relative))
    out[valid] = relative
    return out


def _per_token(
    per_turn: torch.Tensor, token_turns: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Each response position gets its turn's value; positions of no turn get 0."""
    in_turn = (token_turns >= 0).to(per_turn.dtype)
    return per_turn.gather(1, token_turns.clamp(min=0)) * in_turn * response_mask


@register_advantage("turn_grpo")
def turn_grpo(
    *,
    response_mask: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    turn_rewards: torch.Tensor | None = None,
    turn_mask: torch.Tensor | None = None,
    token_turns: torch.Tensor | None = None,
    gamma: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    turn_baseline: TurnBaseline = "trajectory",
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GRPO: turn k of trajectory i, with G_{i,k} its discounted return-to-go (`turn_returns`),
    gets

        trajectory:  A_{i,k} = (G_{i,k} - mean_g(G_{.,0})) / (std_g(G_{.,0}) + eps)
        turn_index:  A_{i,k} = (G_{i,k} - mean_g(G_{.,k})) / (std_g(G_{.,k}) + eps)

    `trajectory` baselines and scales every turn by the group's *trajectory* returns, as GRPO does, so
    with gamma = 1 and only an outcome reward every turn gets exactly the GRPO advantage. `turn_index`
    compares turn k with the turns k of the same group's other trajectories (those that lasted that
    long): with per-turn rewards the trajectory baseline, a sum over all turns, sits above a late turn's
    return-to-go and biases every late turn negative; the turn-index baseline does not. It is TL-GRPO's
    turn-level group (Zeng et al. 2025, arXiv:2505.11821; RAGEN's StarPO, Wang et al. 2025, groups by
    trajectory); departure: a group of 1 at a turn index (one trajectory lasted that long) has no
    baseline and gets 0 there.

    A group (or turn-index group) that is a singleton or whose returns are all equal gets A = 0, as in
    `grpo`, even where other returns differ. returns == advantages (no critic).
    """
    turn_rewards, turn_mask, token_turns = _as_turns(
        token_rewards, response_mask, turn_rewards, turn_mask, token_turns, "turn_grpo"
    )
    group_ids = require_groups(group_ids, "turn_grpo")
    returns = turn_returns(turn_rewards, turn_mask, gamma)
    if turn_baseline == "turn_index":
        turn_index = torch.arange(returns.shape[1], device=returns.device).expand_as(returns)
        keys = group_ids.unsqueeze(-1) * returns.shape[1] + turn_index
        per_turn = _relative(returns, keys, turn_mask.bool(), eps=eps, norm_by_std=norm_by_std)
    elif turn_baseline == "trajectory":
        stats = group_stats(returns[:, 0], group_ids)
        per_turn = returns - stats.mean.unsqueeze(-1)
        if norm_by_std:
            per_turn = per_turn / (stats.std.unsqueeze(-1) + eps)
        signal = ((stats.size > 1) & (stats.std > 0)).unsqueeze(-1)
        per_turn = torch.where(signal, per_turn, torch.zeros_like(per_turn)) * turn_mask
    else:
        raise ValueError(f"turn_baseline must be 'trajectory' or 'turn_index', got {turn_baseline!r}")
    advantages = _per_token(per_turn, token_turns, response_mask)
    return advantages, advantages.clone()


@register_advantage("gigpo")
def gigpo(
    *,
    response_mask: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    turn_rewards: torch.Tensor | None = None,
    turn_mask: torch.Tensor | None = None,
    token_turns: torch.Tensor | None = None,
    turn_anchors: torch.Tensor | None = None,
    gamma: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    step_advantage_weight: float = 1.0,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO, Group-in-Group Policy Optimization (Feng et al. 2025, arXiv:2505.10978): an episode-level and
    a step-level relative advantage,

        A^E_i     = (R_i - mean_g(R)) / (std_g(R) + eps)                      R_i = G_{i,0}
        A^S_{i,k} = (G_{i,k} - mean_s(G)) / (std_s(G) + eps)                  over the anchor group s
        A_{i,k}   = A^E_i + omega * A^S_{i,k}                                 omega = step_advantage_weight

    where the anchor group of turn k of trajectory i holds every turn of the same prompt group taken in
    the same state (`turn_anchors`), and G its discounted return-to-go (`turn_returns`). Turns of
    different trajectories that met the same state are compared directly: the one whose continuation
    earned more gets the credit, wherever in its episode it came. With `norm_by_std` false both are
    mean-centred only (the paper's F_norm = 1).

    Departures: the paper's anchor is the environment's state (e.g. the same ALFWorld observation); here
    it is the whole context before the turn (prompt, earlier turns and observations) — what the policy
    conditions on, which every environment has; two paths to the same underlying state are therefore
    different anchors. The first turn's anchor group is the prompt group, so its step advantage repeats
    the episode advantage (with gamma = 1): the paper's does too. Groups that are singletons or all equal
    give 0, as in `grpo`.
    """
    turn_rewards, turn_mask, token_turns = _as_turns(
        token_rewards, response_mask, turn_rewards, turn_mask, token_turns, "gigpo"
    )
    group_ids = require_groups(group_ids, "gigpo")
    if turn_anchors is None:  # one turn per response, taken in the prompt's state
        turn_anchors = torch.where(turn_mask.bool(), 0, -1).long()
    valid = turn_mask.bool()
    returns = turn_returns(turn_rewards, turn_mask, gamma)
    outcome = turn_returns(turn_rewards, turn_mask, 1.0)[:, 0]
    rows = torch.ones_like(outcome, dtype=torch.bool)
    episode = _relative(outcome, group_ids, rows, eps=eps, norm_by_std=norm_by_std)
    # An anchor id is unique within a batch; pairing it with the group keeps groups apart even where two
    # prompts render to the same context (a repeated problem is two groups, as in `grpo`).
    anchors = group_ids.unsqueeze(-1) * (int(turn_anchors.max()) + 2) + turn_anchors.clamp(min=-1) + 1
    step = _relative(returns, anchors, valid & (turn_anchors >= 0), eps=eps, norm_by_std=norm_by_std)
    per_turn = (episode.unsqueeze(-1) + step_advantage_weight * step) * turn_mask
    advantages = _per_token(per_turn, token_turns, response_mask)
    return advantages, advantages.clone()


@register_advantage("turn_reinforce")
def turn_reinforce(
    *,
    response_mask: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    turn_rewards: torch.Tensor | None = None,
    turn_mask: torch.Tensor | None = None,
    token_turns: torch.Tensor | None = None,
    gamma: float = 1.0,
    eps: float = 1e-8,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE with discounted turn returns (Williams 1992): each turn's advantage is its discounted
    return-to-go over turns, G_{i,k} (`turn_returns`), whitened over every turn of the batch — REINFORCE++'s
    batch baseline (Hu 2025, arXiv:2501.03262) at the granularity of turns rather than tokens, so a turn's
    length does not weigh in its baseline. No groups: it works with `rollout.n` 1.

    With gamma < 1 an early turn of an episode that succeeds late gets less credit than the last turn,
    and the same success reached in fewer turns is worth more. returns = the raw G (per token).
    """
    turn_rewards, turn_mask, token_turns = _as_turns(
        token_rewards, response_mask, turn_rewards, turn_mask, token_turns, "turn_reinforce"
    )
    returns = turn_returns(turn_rewards, turn_mask, gamma)
    per_turn = masked_whiten(returns, turn_mask, eps)
    return _per_token(per_turn, token_turns, response_mask), _per_token(returns, token_turns, response_mask)
