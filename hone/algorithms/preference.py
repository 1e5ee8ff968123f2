"""Preference losses: DPO and its variants, and the Bradley–Terry reward-model loss. Pure tensor functions.

A DPO-family loss takes per-sequence *summed* response log-probs `[B]` of the policy and the reference
for the chosen and rejected responses (`ref_*` are None for a reference-free loss), their response
lengths in tokens, and its hyper-parameters, by keyword (unknown ones are ignored, so the trainer calls
every registered name the same way). It returns per-pair losses `[B]` (the trainer averages) and the
implicit rewards of chosen and rejected `[B]`, the quantities TRL logs as `rewards/*`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from hone.registry import Registry


class PreferenceLoss(NamedTuple):
    losses: torch.Tensor  # [B], one per pair
    chosen_rewards: torch.Tensor  # [B], detached
    rejected_rewards: torch.Tensor  # [B], detached


PreferenceLossFn = Callable[..., PreferenceLoss]
PREFERENCE_LOSSES: Registry[PreferenceLossFn] = Registry("preference loss")
# Losses that need no reference model: the trainer neither loads nor scores one for them.
REFERENCE_FREE: set[str] = set()
# Each loss's own β when the recipe leaves it unset: TRL's 0.1, SimPO's paper value 2.0 (§4, its β grid).
DEFAULT_BETA: dict[str, float] = {}


def register_preference_loss(
    name: str, *, beta: float, reference_free: bool = False
) -> Callable[[PreferenceLossFn], PreferenceLossFn]:
    def decorator(fn: PreferenceLossFn) -> PreferenceLossFn:
        PREFERENCE_LOSSES.register(name)(fn)
        DEFAULT_BETA[name] = beta
        if reference_free:
            REFERENCE_FREE.add(name)
        return fn

    return decorator


def _log_ratios(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if ref_chosen is None or ref_rejected is None:
        raise ValueError("this preference loss needs the reference model's log-probs")
    return policy_chosen - ref_chosen, policy_rejected - ref_rejected


@register_preference_loss("sigmoid", beta=0.1)
def sigmoid_loss(
    *,
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    beta: float,
    **_: object,
) -> PreferenceLoss:
    """DPO (Rafailov et al. 2023, "Direct Preference Optimization", eq. 7): -log σ(β[(log πc - log refc)
    - (log πr - log refr)]), with summed log-probs; the implicit reward is β (log π - log ref)."""
    chosen, rejected = _log_ratios(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    losses = -F.logsigmoid(beta * (chosen - rejected))
    return PreferenceLoss(losses, beta * chosen.detach(), beta * rejected.detach())


@register_preference_loss("cdpo", beta=0.1)
def cdpo_loss(
    *,
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    beta: float,
    label_smoothing: float,
    **_: object,
) -> PreferenceLoss:
    """Conservative DPO (Mitchell 2023, "A note on DPO with noisy preferences and relationship to IPO"):
    each preference label is taken as wrong with probability ε, so the loss is DPO's on the pair and on
    the flipped pair, weighted (1-ε) and ε: -(1-ε) log σ(βh) - ε log σ(-βh). As TRL's `label_smoothing`."""
    if not 0.0 < label_smoothing < 0.5:
        raise ValueError(f"cdpo needs a label smoothing in (0, 0.5), got {label_smoothing}")
    chosen, rejected = _log_ratios(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    h = beta * (chosen - rejected)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)
    return PreferenceLoss(losses, beta * chosen.detach(), beta * rejected.detach())


@register_preference_loss("ipo", beta=0.1)
def ipo_loss(
    *,
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    beta: float,
    **_: object,
) -> PreferenceLoss:
    """IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human
    Preferences", eq. 17): (h - 1/(2β))², a squared loss that keeps the margin h at a finite target
    instead of pushing it to infinity. h uses *length-normalised* log-ratios (each sequence's log-prob
    divided by its response tokens), as TRL does; the paper's h sums over tokens. The implicit rewards
    are β times those per-token log-ratios, as TRL logs them."""
    chosen, rejected = _log_ratios(
        policy_chosen / chosen_lengths,
        policy_rejected / rejected_lengths,
        None if ref_chosen is None else ref_chosen / chosen_lengths,
        None if ref_rejected is None else ref_rejected / rejected_lengths,
    )
    losses = (chosen - rejected - 1.0 / (2.0 * beta)) ** 2
    return PreferenceLoss(losses, beta * chosen.detach(), beta * rejected.detach())


@register_preference_loss("simpo", beta=2.0, reference_free=True)
def simpo_loss(
    *,
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    beta: float,
    gamma: float,
    **_: object,
) -> PreferenceLoss:
    """SimPO (Meng et al. 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward",
    eq. 6): -log σ(β/|yc| log π(yc|x) - β/|yr| log π(yr|x) - γ). No reference model: the reward is the
    length-normalised log-prob times β, and γ is the target margin between the two."""
    chosen = beta * policy_chosen / chosen_lengths
    rejected = beta * policy_rejected / rejected_lengths
    losses = -F.logsigmoid(chosen - rejected - gamma)
    return PreferenceLoss(losses, chosen.detach(), rejected.detach())


def bradley_terry_loss(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    *,
    margin: torch.Tensor | None = None,
    center_coef: float = 0.0,
) -> torch.Tensor:
    """Per-pair reward-model loss `[B]`: -log σ(rc - rr - margin) (Bradley & Terry 1952, as used for
    RLHF reward models by Ouyang et al. 2022, eq. 1; the margin as Llama 2, Touvron et al. 2023, §3.2.2),
    plus `center_coef` (rc + rr)², which keeps the rewards centred on zero (Eisenstein et al. 2023;
    TRL's `center_rewards_coefficient`): the BT loss sees only differences, so their level drifts."""
    difference = chosen_rewards - rejected_rewards
    if margin is not None:
        difference = difference - margin
    losses = -F.logsigmoid(difference)
    if center_coef:
        losses = losses + center_coef * (chosen_rewards + rejected_rewards) ** 2
    return losses
