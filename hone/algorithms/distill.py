"""On-policy distillation: a teacher scores the student's own samples, token by token.

Papers and systems:
  - Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from Self-Generated
    Mistakes" (GKD, ICLR 2024, arXiv:2306.13649): train the student on sequences it sampled itself,
    against the teacher's token distributions, with a divergence D (forward KL, reverse KL or a
    generalised JSD) per token.
  - Gu et al. 2024, "MiniLLM: Knowledge Distillation of Large Language Models" (ICLR 2024,
    arXiv:2306.08543): minimise the reverse KL(π_student ‖ π_teacher) (mode-seeking) with a policy
    gradient over the student's samples.
  - Thinking Machines Lab, "On-Policy Distillation" (Lu et al., Oct 2025): the per-token reverse KL,
    estimated on the sampled token, is a per-token (negative) reward with discount 0, fed to the
    importance-sampled policy-gradient loss the RL run already uses; verl's `opd`, TRL's
    `GKDTrainer`/GOLD and slime's `--use-opd` do the same.

With x_t the student's sampled token and its prefix x_<t:
    k_t = log π_student(x_t | x_<t) - log π_teacher(x_t | x_<t)
is a single-sample, unbiased estimate of KL(π_student ‖ π_teacher) at position t (Schulman's k1), and
the advantage of token t is A_t = -coef · k_t: each token is credited with its own log-ratio only
(discount 0), so a token the teacher finds likelier than the student does is pushed up. Minimising
E_{x~π}[Σ_t k_t] by the policy gradient is minimising the sequence-level reverse KL (MiniLLM's
objective without its long-horizon credit).

Where this implementation departs:
  - Discount 0, as Thinking Machines: no reverse-KL return-to-go (MiniLLM sums later tokens' KL into
    each token's reward and adds a single-step term; GKD differentiates the full per-token divergence
    over the vocabulary). Only the sampled token's log-ratio is read, so the teacher needs no full-vocab
    logits sent anywhere: its log-prob of each sampled token is enough.
  - π_student is the behaviour policy's log-prob (`algorithm.old_log_probs`: the sampler's, or the
    trainer's recomputation), fixed for the step, as the PPO ratio's anchor is; the loss is the run's
    own policy loss (PPO clip by default), not a plain REINFORCE.
  - Both models score at the sampling temperature (`rollout.temperature`), as the KL reference does: at
    temperature 1 (the default recipe's) this is the plain reverse KL; at τ ≠ 1 it is the KL between the
    two tempered distributions.
  - With a verifiable reward too, the reward's advantage (e.g. GRPO's group-normalised score, the same
    on every token of a response) and -coef · k_t are summed per token, unnormalised: `coef` trades them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hone.algorithms.utils import masked_mean
from hone.registry import Registry

# (student_log_probs, teacher_log_probs, response_mask, coef) -> (advantages [B,T], divergence [B,T])
DistillFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
DISTILL_MODES: Registry[DistillFn] = Registry("distillation mode")
register_distill = DISTILL_MODES.register


@register_distill("reverse_kl")
def reverse_kl(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token advantage -coef · k_t and the estimate k_t = log π_student - log π_teacher of
    KL(π_student ‖ π_teacher) on each sampled token; both 0 where `response_mask` is 0."""
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=student_log_probs.dtype, device=student_log_probs.device)
    kl = torch.where(mask, student_log_probs - teacher_log_probs, zero)
    return -coef * kl, kl


def distill_advantages(
    mode: str,
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The per-token distillation advantages of `mode` and their metric: `distill/reverse_kl`, the mean
    of k_t over the batch's response tokens (every token weighs the same)."""
    advantages, divergence = DISTILL_MODES[mode](student_log_probs, teacher_log_probs, response_mask, coef)
    return advantages, {f"distill/{mode}": float(masked_mean(divergence, response_mask))}
