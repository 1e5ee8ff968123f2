"""Evaluation estimators."""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


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


def check_pass_at_ks(ks: Sequence[int], n: int) -> None:
    """Refuse a pass@k that `n` samples per problem cannot estimate (k outside 1..n): checked before
    anything is sampled, so no pass@k is ever dropped silently. One check for the config (`eval.k`,
    `eval.n`, before any model loads) and for `evaluate` (the library guard)."""
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(
            f"k={bad}: pass@k needs 1 <= k <= eval.n (samples per problem); got k={list(ks)}, n={n}"
        )


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
    (Kong 1992; the off-policyness signal of `trainer.max_staleness: auto`). 1 when there are none."""
    if not tokens or not weight_square_sum:
        return 1.0
    return weight_sum**2 / (tokens * weight_square_sum)
