"""Collapse diagnostics of multi-turn runs, logged every step (README "Agents" → collapse guards).

RAGEN (Wang et al. 2025, "Understanding Self-Evolution in LLM Agents via Multi-Turn RL", §4) names the
signs that precede an agent's "echo trap": the reward variance within groups falls (every trajectory of
a prompt does the same thing), the entropy falls, and the answers converge. Each is measured here on
what was sampled, before any filter:

- `groups/reward_std`: the mean over groups of the std of their rewards (0: no group has signal left);
- `entropy/turn_<k>`: the mean -log p of the sampled tokens of each episode's k-th assistant turn (1-based)
  under the policy that sampled them, a one-sample estimate of its per-token entropy at the sampling
  temperature, free; a turn that stops reading its observations shows its entropy falling first;
- `answers/top_share` (`hone.verifiers.math.top_answer_share`, logged for every run): the share of
  final answers that are the most common one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from hone.types import Rollout


def group_reward_std(rollouts: list[Rollout]) -> float:
    """The mean over groups (of 2 or more) of the population std of their rewards; 0 without groups."""
    by_group: dict[int, list[float]] = defaultdict(list)
    for r in rollouts:
        by_group[r.group_id].append(r.reward)
    stds = [statistics.pstdev(rewards) for rewards in by_group.values() if len(rewards) > 1]
    return sum(stds) / len(stds) if stds else 0.0


def turn_entropies(rollouts: list[Rollout]) -> dict[str, float]:
    """`entropy/turn_<k>`: each turn index's mean -log p over the sampled tokens of that turn, across the
    batch's episodes that reached it (tokens weigh equally)."""
    sums: dict[int, float] = defaultdict(float)
    counts: dict[int, int] = defaultdict(int)
    for r in rollouts:
        for k, (start, end) in enumerate(r.turns):
            for t in range(start, end):
                if r.loss_mask[t]:
                    sums[k] -= r.sampler_logprobs[t]
                    counts[k] += 1
    return {f"entropy/turn_{k + 1}": sums[k] / counts[k] for k in sorted(counts) if counts[k]}


def collapse_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """The diagnostics above for a batch of multi-turn episodes; {} for single-turn batches."""
    if not any(len(r.turns) > 1 or r.messages is not None for r in rollouts):
        return {}
    return {"groups/reward_std": group_reward_std(rollouts), **turn_entropies(rollouts)}
