"""Preference losses against the papers' formulas worked by hand, and the direction of their gradients."""

from __future__ import annotations

import math

import pytest
import torch

from hone.algorithms import DEFAULT_BETA, PREFERENCE_LOSSES, REFERENCE_FREE, bradley_terry_loss


def softplus(x: float) -> float:
    """-log σ(-x) = log(1 + e^x), the form the hand computations below use."""
    return math.log1p(math.exp(x))


def logps(requires_grad: bool = False) -> dict[str, torch.Tensor]:
    """One pair: policy chosen -1, rejected -3; reference chosen -2, rejected -2.5; lengths 2 and 4."""
    values = {
        "policy_chosen": -1.0,
        "policy_rejected": -3.0,
        "ref_chosen": -2.0,
        "ref_rejected": -2.5,
        "chosen_lengths": 2.0,
        "rejected_lengths": 4.0,
    }
    trained = {"policy_chosen", "policy_rejected"}
    return {k: torch.tensor([v], requires_grad=requires_grad and k in trained) for k, v in values.items()}


def loss_of(name: str, **hyper: float) -> tuple[float, float, float]:
    out = PREFERENCE_LOSSES[name](**logps(), **hyper)
    return out.losses.item(), out.chosen_rewards.item(), out.rejected_rewards.item()


def test_sigmoid_is_dpo() -> None:
    # Log-ratios: chosen -1 - (-2) = 1, rejected -3 - (-2.5) = -0.5; h = β (1 - (-0.5)) = 0.5 * 1.5 = 0.75.
    # DPO: -log σ(0.75) = log(1 + e^-0.75); rewards β·1 = 0.5 and β·(-0.5) = -0.25.
    loss, chosen, rejected = loss_of("sigmoid", beta=0.5)
    assert loss == pytest.approx(softplus(-0.75), rel=1e-6)
    assert (chosen, rejected) == pytest.approx((0.5, -0.25))


def test_cdpo_mixes_the_pair_and_the_flipped_pair() -> None:
    # h = 0.75 as above; ε = 0.1: 0.9 · -log σ(0.75) + 0.1 · -log σ(-0.75).
    loss, chosen, rejected = loss_of("cdpo", beta=0.5, label_smoothing=0.1)
    assert loss == pytest.approx(0.9 * softplus(-0.75) + 0.1 * softplus(0.75), rel=1e-6)
    assert (chosen, rejected) == pytest.approx((0.5, -0.25))
    with pytest.raises(ValueError, match=r"label smoothing in \(0, 0.5\)"):
        loss_of("cdpo", beta=0.5, label_smoothing=0.0)


def test_ipo_uses_length_normalised_log_ratios() -> None:
    # Per-token log-ratios: chosen (-1 - -2) / 2 = 0.5, rejected (-3 - -2.5) / 4 = -0.125; h = 0.625.
    # Target 1/(2β) = 1/(2 · 0.5) = 1; loss (0.625 - 1)² = 0.140625; rewards 0.5·0.5, 0.5·-0.125.
    loss, chosen, rejected = loss_of("ipo", beta=0.5)
    assert loss == pytest.approx(0.140625)
    assert (chosen, rejected) == pytest.approx((0.25, -0.0625))


def test_simpo_is_reference_free_and_length_normalised() -> None:
    # Rewards β/|y| log π: 2 · -1/2 = -1, 2 · -3/4 = -1.5; -log σ(-1 - (-1.5) - γ) with γ = 0.5 = log 2.
    loss, chosen, rejected = loss_of("simpo", beta=2.0, gamma=0.5)
    assert loss == pytest.approx(math.log(2.0))
    assert (chosen, rejected) == pytest.approx((-1.0, -1.5))
    inputs = logps() | {"ref_chosen": None, "ref_rejected": None}
    assert PREFERENCE_LOSSES["simpo"](**inputs, beta=2.0, gamma=0.5).losses.item() == pytest.approx(
        math.log(2)
    )
    assert sorted(REFERENCE_FREE) == ["simpo"]
    assert (DEFAULT_BETA["simpo"], DEFAULT_BETA["sigmoid"]) == (2.0, 0.1)


def test_reference_losses_refuse_missing_reference() -> None:
    inputs = logps() | {"ref_chosen": None, "ref_rejected": None}
    for name in ["sigmoid", "cdpo", "ipo"]:
        with pytest.raises(ValueError, match="needs the reference model's log-probs"):
            PREFERENCE_LOSSES[name](**inputs, beta=0.1, label_smoothing=0.1)


@pytest.mark.parametrize("name", ["sigmoid", "cdpo", "ipo", "simpo"])
def test_gradient_raises_chosen_and_lowers_rejected(name: str) -> None:
    # β = 0.1: IPO's margin 0.625 is below its target 1/(2β) = 5, so it too pushes the pair apart.
    inputs = logps(requires_grad=True)
    PREFERENCE_LOSSES[name](**inputs, beta=0.1, label_smoothing=0.1, gamma=0.5).losses.sum().backward()
    assert inputs["policy_chosen"].grad.item() < 0 < inputs["policy_rejected"].grad.item()


def test_ipo_pulls_back_a_margin_past_its_target() -> None:
    # β = 2: target 1/(2β) = 0.25 < h = 0.625, so IPO (unlike DPO) lowers chosen and raises rejected.
    inputs = logps(requires_grad=True)
    PREFERENCE_LOSSES["ipo"](**inputs, beta=2.0).losses.sum().backward()
    assert inputs["policy_chosen"].grad.item() > 0 > inputs["policy_rejected"].grad.item()


def test_bradley_terry_with_margin_and_centring() -> None:
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([0.5, 1.0])
    # Pair 1: -log σ(2 - 0.5 - 0.5) = log(1 + e^-1); pair 2: -log σ(0 - 1 - 0) = log(1 + e^1).
    losses = bradley_terry_loss(chosen, rejected, margin=torch.tensor([0.5, 0.0]))
    assert losses.tolist() == pytest.approx([softplus(-1.0), softplus(1.0)], rel=1e-6)
    # Centring adds 0.01 (rc + rr)²: 0.01 · 2.5² = 0.0625 and 0.01 · 1² = 0.01.
    centred = bradley_terry_loss(chosen, rejected, margin=torch.tensor([0.5, 0.0]), center_coef=0.01)
    assert (centred - losses).tolist() == pytest.approx([0.0625, 0.01], rel=1e-5)
    assert bradley_terry_loss(chosen, rejected).tolist() == pytest.approx([softplus(-1.5), softplus(1.0)])


def test_bradley_terry_gradients() -> None:
    chosen, rejected = torch.tensor([1.0], requires_grad=True), torch.tensor([1.0], requires_grad=True)
    bradley_terry_loss(chosen, rejected).sum().backward()
    assert chosen.grad.item() < 0 < rejected.grad.item()  # separate them
    chosen.grad = rejected.grad = None
    # With both at +1 the BT term's gradients cancel in their sum; the centring term pulls both down.
    bradley_terry_loss(chosen, rejected, center_coef=1.0).sum().backward()
    assert (chosen.grad + rejected.grad).item() == pytest.approx(2 * 2 * 2.0)
