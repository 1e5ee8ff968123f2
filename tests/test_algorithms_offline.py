"""Offline RL losses (hone.algorithms.offline) against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from hone.algorithms.offline import (
    advantage_weights,
    bc_loss,
    cql_penalty,
    expectile_loss,
    iql_q_target,
    td3_bc_actor_loss,
    weighted_regression_loss,
)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_bc_loss_sums_over_action_dimensions_and_averages_over_the_batch() -> None:
    # rows: (1-0)² + (2-0)² = 5 and (0-1)² + (0-1)² = 2; mean 3.5
    policy = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    data = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    assert bc_loss(policy, data).item() == pytest.approx(3.5)
    with pytest.raises(ValueError, match="shapes differ"):
        bc_loss(policy, data[:, :1])


def test_td3_bc_scales_q_by_alpha_over_its_mean_magnitude_without_gradient_through_lambda() -> None:
    # λ = 2.5 / mean(|2|, |-4|) = 2.5/3; -λ·mean(q) = -(2.5/3)·(-1) = 0.8333;
    # BC term mean((1-0)², (0-0)²) = 0.5
    q = t(2.0, -4.0).requires_grad_()
    loss = td3_bc_actor_loss(q, t(1.0, 0.0)[:, None], t(0.0, 0.0)[:, None], alpha=2.5)
    assert loss.item() == pytest.approx(2.5 / 3 + 0.5)
    loss.backward()
    assert q.grad is not None
    # d/dq of -λ·mean(q) with λ constant: -λ/2 each (λ's own dependence on q would change this)
    assert q.grad.tolist() == pytest.approx([-2.5 / 6, -2.5 / 6])


def test_expectile_loss_weights_positive_errors_by_tau_and_negative_by_one_minus_tau() -> None:
    # u = 2: 0.7·4 = 2.8; u = -1: 0.3·1 = 0.3; mean 1.55
    assert expectile_loss(t(2.0, -1.0), tau=0.7).item() == pytest.approx(1.55)
    # tau 0.5 is half the mean squared error
    assert expectile_loss(t(2.0, -1.0), tau=0.5).item() == pytest.approx(0.5 * (4 + 1) / 2)
    with pytest.raises(ValueError, match="tau"):
        expectile_loss(t(1.0), tau=1.0)


def test_expectile_value_minimiser_is_an_upper_expectile() -> None:
    # the V minimising the τ-expectile loss of Q - V over {0, 10} with τ = 0.9 solves
    # 0.9·(10 - V) = 0.1·(V - 0), V = 9: close to the max, as IQL intends
    v = torch.zeros((), requires_grad=True)
    q = t(0.0, 10.0).float()
    opt = torch.optim.SGD([v], lr=0.5)
    for _ in range(500):
        opt.zero_grad()
        expectile_loss(q - v, tau=0.9).backward()
        opt.step()
    assert v.item() == pytest.approx(9.0, abs=1e-3)


def test_iql_q_target_bootstraps_from_v_unless_terminated() -> None:
    target = iql_q_target(t(1.0, 1.0), torch.tensor([False, True]), t(10.0, 10.0), gamma=0.9)
    assert target.tolist() == pytest.approx([1.0 + 0.9 * 10.0, 1.0])
    assert not target.requires_grad
    with pytest.raises(ValueError, match="squeeze"):
        iql_q_target(t(1.0, 1.0), torch.tensor([False, True]), t(10.0, 10.0)[:, None], gamma=0.9)


def test_advantage_weights_are_exp_beta_a_clipped_and_constant() -> None:
    adv = t(0.0, 1.0, 10.0).requires_grad_()
    w = advantage_weights(adv, inverse_temperature=1.0, max_weight=100.0)
    assert w.tolist() == pytest.approx([1.0, math.e, 100.0])  # e^10 = 22026 clipped
    assert not w.requires_grad
    # AWR's exp(A/β) with β = 0.5 is inverse temperature 2
    assert advantage_weights(t(1.0), inverse_temperature=2.0).item() == pytest.approx(math.exp(2.0))


def test_weighted_regression_loss() -> None:
    # -(1·(-1) + 2·(-2)) / 2 = 2.5
    log_prob = t(-1.0, -2.0).requires_grad_()
    loss = weighted_regression_loss(log_prob, t(1.0, 2.0))
    assert loss.item() == pytest.approx(2.5)
    loss.backward()
    assert log_prob.grad is not None and log_prob.grad.tolist() == pytest.approx([-0.5, -1.0])


def test_cql_penalty_is_the_log_sum_exp_over_sampled_actions_minus_the_data_q() -> None:
    # equal sampled Q = 1, density 1: logsumexp([1, 1]) - 1 = ln 2
    assert cql_penalty(t(1.0), t(1.0, 1.0)[None], t(0.0, 0.0)[None]).item() == pytest.approx(math.log(2))
    # temperature 2: 2·logsumexp([0.5, 0.5]) - 1 = 2 ln 2
    penalty = cql_penalty(t(1.0), t(1.0, 1.0)[None], t(0.0, 0.0)[None], temperature=2.0)
    assert penalty.item() == pytest.approx(2 * math.log(2))
    # importance sampling: the first action's density is 2, so its term is e^(1 - ln 2) = e/2:
    # ln(e/2 + e) - 1 = ln 1.5
    penalty = cql_penalty(t(1.0), t(1.0, 1.0)[None], t(math.log(2), 0.0)[None])
    assert penalty.item() == pytest.approx(math.log(1.5))
    with pytest.raises(ValueError, match=r"\[B, N\]"):
        cql_penalty(t(1.0, 2.0), t(1.0, 1.0)[None], t(0.0, 0.0)[None])


def test_cql_gradient_lowers_sampled_q_and_raises_the_data_q() -> None:
    q_data = t(0.0).requires_grad_()
    q_sampled = t(0.0, 0.0)[None].requires_grad_()
    cql_penalty(q_data, q_sampled, torch.zeros(1, 2, dtype=torch.float64)).backward()
    assert q_data.grad is not None and q_sampled.grad is not None
    assert q_data.grad.item() == pytest.approx(-1.0)  # descending raises Q on the data's action
    assert q_sampled.grad[0].tolist() == pytest.approx([0.5, 0.5])  # softmax weights: lowered
