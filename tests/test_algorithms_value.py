"""The critic's loss and explained variance (hone/algorithms/value.py) against hand-computed values."""

from __future__ import annotations

import math

import torch

from hone.algorithms import explained_variance, value_loss

# Two valid tokens and one padding token whose huge return must count nowhere.
VALUES = torch.tensor([[0.5, 1.0, 0.0]])
OLD = torch.tensor([[0.2, 0.2, 0.0]])
RETURNS = torch.tensor([[1.0, 0.0, 100.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0]])


def test_unclipped_value_loss_is_half_the_mean_squared_error() -> None:
    values = VALUES.clone().requires_grad_()
    loss, metrics = value_loss(values, OLD, RETURNS, MASK)
    # 0.5 * ((0.5 - 1)^2 + (1 - 0)^2) / 2 = 0.5 * (0.25 + 1) / 2 = 0.3125
    assert float(loss.detach()) == 0.3125
    assert float(metrics["clip_frac"]) == 0
    loss.backward()
    # d/dV_t = (V_t - R_t) / 2 tokens: (0.5 - 1) / 2 = -0.25, (1 - 0) / 2 = 0.5; padding 0
    torch.testing.assert_close(values.grad, torch.tensor([[-0.25, 0.5, 0.0]]))


def test_clipped_value_loss_takes_the_larger_error_and_counts_clipped_tokens() -> None:
    values = VALUES.clone().requires_grad_()
    loss, metrics = value_loss(values, OLD, RETURNS, MASK, clip=0.2)
    # token 0: V clipped to 0.2 + clamp(0.3, ±0.2) = 0.4;
    #          (0.4 - 1)^2 = 0.36 > (0.5 - 1)^2 = 0.25 → 0.36, clipped
    # token 1: V clipped to 0.2 + 0.2 = 0.4;  (0.4 - 0)^2 = 0.16 < (1 - 0)^2 = 1 → 1, not clipped
    # loss = 0.5 * (0.36 + 1) / 2 = 0.34
    torch.testing.assert_close(loss.detach(), torch.tensor(0.34))
    assert float(metrics["clip_frac"]) == 1  # a sum over tokens: one of the two
    loss.backward()
    # token 0 takes the clipped branch, flat in V past the clip: no gradient; token 1 as unclipped: 0.5
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.5, 0.0]]))


def test_value_loss_divides_by_the_given_token_count() -> None:
    # A micro-batch of a 4-token mini-batch: 0.5 * 1.25 / 4 = 0.15625, so micro-batch losses add up.
    loss, _ = value_loss(VALUES, OLD, RETURNS, MASK, num_tokens=torch.tensor(4.0))
    assert float(loss) == 0.15625


def test_within_the_clip_range_clipping_changes_nothing() -> None:
    loss, metrics = value_loss(VALUES, VALUES - 0.01, RETURNS, MASK, clip=0.2)
    assert float(loss) == 0.3125 and float(metrics["clip_frac"]) == 0


def test_explained_variance_perfect_constant_partial_and_degenerate() -> None:
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    junk = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1e6]])  # on the padding: ignored
    assert explained_variance(returns + junk, returns, mask) == 1.0  # a perfect critic
    assert explained_variance(torch.full_like(returns, 7.0), returns, mask) == 0.0  # a constant: no better
    # V = [1, 2, 3, 2]: R - V = [0, 0, 0, 2], mean 0.5, Var = (3 * 0.25 + 2.25) / 4 = 0.75;
    # Var(R) = (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25; EV = 1 - 0.75 / 1.25 = 0.4
    partial = torch.tensor([[1.0, 2.0, 3.0, 2.0, 0.0]])
    assert math.isclose(explained_variance(partial, returns, mask), 0.4, rel_tol=1e-6)
    # V = -R: R - V = 2R, Var = 4 * 1.25 → EV = 1 - 4 = -3 (worse than a constant)
    assert math.isclose(explained_variance(-returns, returns, mask), -3.0, rel_tol=1e-6)
    assert math.isnan(explained_variance(returns, torch.ones_like(returns), mask))  # nothing to explain
