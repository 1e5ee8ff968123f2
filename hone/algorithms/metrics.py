"""Evaluation estimators."""

from __future__ import annotations

from math import comb

import torch


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, "Evaluating LLMs Trained on Code"):
    1 - C(n-c, k) / C(n, k), the probability that at least one of k samples drawn without replacement
    from the n is correct.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def canary_metrics(gap_sum: float, tokens: float, largest: float) -> dict[str, float]:
    """The log-prob canary's metrics from |log π_sampler - log π_learner| summed over `tokens` response
    tokens of rows sampled with the learner's own weights (`largest`: the biggest single gap). No
    tokens (every row stale, or none checked): the mean is 0 and `mismatch/canary_tokens` says so."""
    return {
        "mismatch/canary_abs": gap_sum / tokens if tokens else 0.0,
        "mismatch/canary_max": largest,
        "mismatch/canary_tokens": tokens,
    }


def importance_ess(weight_sum: float, weight_square_sum: float, tokens: float) -> float:
    """Kish's effective sample size of importance weights w = π_θ/π_behav, as a share of the `tokens`:
    (Σw)² / (n Σw²), 1 when every weight is equal (on-policy), towards 1/n as one weight dominates
    (Kong 1992; the off-policyness signal of `cluster.max_staleness: auto`). 1 when there are none."""
    if not tokens or not weight_square_sum:
        return 1.0
    return min(1.0, weight_sum**2 / (tokens * weight_square_sum))  # ≤ 1 (Cauchy-Schwarz) but for rounding


def offpolicy_ess(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """`offpolicy/ess` over the tokens and `offpolicy/ess_seq` over the sequences of a batch, from
    log π_θ - log π_behav [B, T] and its response mask: a sequence's weight is exp of its tokens' summed
    log ratios, so its ESS falls as the drift of every token compounds (the token ESS stays near 1)."""
    tokens = torch.exp(log_ratio) * mask
    sequences = torch.exp((log_ratio * mask).sum(-1))
    return {
        "offpolicy/ess": importance_ess(
            float(tokens.sum()), float((tokens * tokens).sum()), float(mask.sum())
        ),
        "offpolicy/ess_seq": importance_ess(
            float(sequences.sum()), float((sequences * sequences).sum()), float(len(sequences))
        ),
    }
