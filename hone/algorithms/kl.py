"""Per-token KL estimators of KL(π ‖ π_ref) from samples of π (Schulman 2020, "Approximating KL").

With log-ratio d = log π_ref(y) - log π(y) on tokens y ~ π:
  k1 = -d                      unbiased, high variance, can be negative
  k2 = d² / 2                  biased, low variance
  k3 = exp(d) - d - 1          unbiased, low variance, always >= 0 (GRPO's choice)

As a *reward* penalty only the value matters: k1 and k3 are unbiased estimates of KL(π‖π_ref).
As a *loss* term (differentiated, the sampled tokens held fixed) what matters is the expected
gradient E_{y~π}[∇_θ k(y)] (Tang & Munos 2025, arXiv:2506.09477; Shah et al. 2025, "A comedy of
estimators", arXiv:2512.21852):
  k1: E[∇log π] = 0                                    no regularisation at all (config rejects it)
  k2: E[(log π - log π_ref) ∇log π] = ∇ KL(π ‖ π_ref)   the reverse KL, the RLHF objective's
  k3: E[(1 - π_ref/π) ∇log π] = -Σ π_ref ∇log π = ∇ KL(π_ref ‖ π)   the forward KL (as in GRPO, verl)
per token, given its prefix (the effect on later tokens' distributions is not included). The two
agree to first order near π = π_ref. Exact on-policy (the first mini-batch, π_old = π); later
mini-batches use π_old's samples without an importance weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hone.registry import Registry

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")
register_kl = KL_ESTIMATORS.register

# exp(d) of a log-ratio beyond this overflows float32 in practice; clamping keeps k3 finite.
_MAX_LOG_RATIO = 20.0


@register_kl("k1")
def k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    return log_probs - ref_log_probs


@register_kl("k2")
def k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_probs - ref_log_probs) ** 2


@register_kl("k3")
def k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    d = (ref_log_probs - log_probs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(d) - d - 1
