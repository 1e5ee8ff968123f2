"""Classic-control algorithm pieces against hand-computed values and reference implementations: `gae` with
episode boundaries (hone/algorithms/advantages.py) and SAC / TD3 (hone/algorithms/qlearning.py)."""

from __future__ import annotations

import math

import pytest
import torch

from hone.algorithms import (
    ADVANTAGE_ESTIMATORS,
    masked_whiten,
    polyak_update,
    q_loss,
    sac_actor_loss,
    sac_alpha_loss,
    sac_critic_target,
    smoothed_target_action,
    tanh_gaussian_log_prob,
    td3_actor_loss,
    td3_target,
)
from hone.algorithms.advantages import hyperparameters

gae = ADVANTAGE_ESTIMATORS["gae"]
T_ = True
F_ = False


# --- GAE with episode boundaries -------------------------------------------------------------------


def test_gae_without_boundaries_is_the_same_computation_as_before() -> None:
    # Dyadic numbers, so every step is exact in float32 and torch.equal is the right check.
    # gamma = lam = 0.5; the last column is padding (its value 8 must not be used).
    # t=1: delta = 1 + 0.5*0 - 0.25 = 0.75;           A1 = 0.75
    # t=0: delta = 0 + 0.5*0.25 - 0.5 = -0.375;       A0 = -0.375 + 0.25*0.75 = -0.1875
    # returns = A + V = [0.3125, 1.0, 0]
    r = torch.tensor([[0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.25, 8.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv, ret = gae(token_rewards=r, response_mask=mask, values=v, gamma=0.5, lam=0.5)
    assert torch.equal(adv, torch.tensor([[-0.1875, 0.75, 0.0]]))
    assert torch.equal(ret, torch.tensor([[0.3125, 1.0, 0.0]]))


def test_gae_hyperparameters_are_unchanged_by_the_boundary_inputs() -> None:
    assert hyperparameters("gae") == {"gamma", "lam", "whiten", "eps"}


def test_gae_with_a_truncation_and_a_termination_by_hand() -> None:
    # gamma = 0.9, lam = 0.8 (gamma*lam = 0.72); r = [1, 0, 2], V = [0.5, 1.0, 0.2] in every row.
    # Row 0: truncated at t=1 (done, not terminated): bootstraps from V(final obs) = 3.0.
    #   t=2: delta = 2 + 0.9*0.4 - 0.2 = 2.16                  A2 = 2.16 (segment end)
    #   t=1: delta = 0 + 0.9*3.0 - 1.0 = 1.7                   A1 = 1.7 (done: no A2)
    #   t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4                   A0 = 1.4 + 0.72*1.7 = 2.624
    # Row 1: terminated at t=0: next value 7.0 is ignored.
    #   t=2: 2.16;  t=1: delta = 0 + 0.9*0.2 - 1.0 = -0.82     A1 = -0.82 + 0.72*2.16 = 0.7352
    #   t=0: delta = 1 + 0 - 0.5 = 0.5                         A0 = 0.5 (done)
    # Row 2: the same step truncated instead: delta0 = 1 + 0.9*7.0 - 0.5 = 6.8 = A0.
    r = torch.tensor([[1.0, 0.0, 2.0]] * 3)
    v = torch.tensor([[0.5, 1.0, 0.2]] * 3)
    next_v = torch.tensor([[1.0, 3.0, 0.4], [7.0, 0.2, 0.4], [7.0, 0.2, 0.4]])
    dones = torch.tensor([[F_, T_, F_], [T_, F_, F_], [T_, F_, F_]])
    terminated = torch.tensor([[F_, F_, F_], [T_, F_, F_], [F_, F_, F_]])
    adv, ret = gae(
        token_rewards=r,
        response_mask=torch.ones(3, 3),
        values=v,
        next_values=next_v,
        dones=dones,
        terminated=terminated,
        gamma=0.9,
        lam=0.8,
    )
    expected = torch.tensor([[2.624, 1.7, 2.16], [0.5, 0.7352, 2.16], [6.8, 0.7352, 2.16]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + v)


def _reference_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    dones: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CleanRL's ppo_continuous_action loop in its [T, N] layout, with TorchRL's done/terminated split:
    a terminal does not bootstrap, a truncation bootstraps from next_values, either ends the episode."""
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        nextnonterminal = 1.0 - terminated[t].double()
        nextnotdone = 1.0 - dones[t].double()
        delta = rewards[t] + gamma * next_values[t] * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * nextnotdone * lastgaelam
    return advantages, advantages + values


def _rollout(n_envs: int, steps: int, seed: int) -> dict[str, torch.Tensor]:
    """A random [N, T] segment with terminations and truncations mid-segment; next_values is the next
    column's value inside an episode, V(final obs) at a truncation, garbage at a terminal."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n_envs, steps + 1, generator=g, dtype=torch.float64)  # last: V after the segment
    ended = torch.rand(n_envs, steps, generator=g) < 0.15
    terminal = ended & (torch.rand(n_envs, steps, generator=g) < 0.5)
    ended[0, 3] = terminal[0, 3] = True  # at least one of each, mid-segment
    ended[1, 5], terminal[1, 5] = True, False
    final_obs_value = torch.randn(n_envs, steps, generator=g, dtype=torch.float64)
    next_values = torch.where(ended & ~terminal, final_obs_value, values[:, 1:])
    next_values = torch.where(terminal, torch.full_like(next_values, 1e3), next_values)
    return {
        "rewards": torch.randn(n_envs, steps, generator=g, dtype=torch.float64),
        "values": values[:, :-1],
        "next_values": next_values,
        "dones": ended,
        "terminated": terminal,
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_with_boundaries_matches_a_cleanrl_style_reference(seed: int) -> None:
    ro = _rollout(n_envs=4, steps=40, seed=seed)
    gamma, lam = 0.99, 0.95
    adv, ret = gae(
        token_rewards=ro["rewards"],
        response_mask=torch.ones_like(ro["rewards"]),
        values=ro["values"],
        next_values=ro["next_values"],
        dones=ro["dones"],
        terminated=ro["terminated"],
        gamma=gamma,
        lam=lam,
    )
    ref_adv, ref_ret = _reference_gae(
        *(ro[k].T for k in ("rewards", "values", "next_values", "dones", "terminated")), gamma, lam
    )
    torch.testing.assert_close(adv, ref_adv.T, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, ref_ret.T, atol=1e-6, rtol=0)
    # The boundaries matter: without them the answer is different.
    unbounded, _ = gae(
        token_rewards=ro["rewards"],
        response_mask=torch.ones_like(ro["rewards"]),
        values=ro["values"],
        next_values=ro["next_values"],
        gamma=gamma,
        lam=lam,
    )
    assert not torch.allclose(unbounded, adv)


def test_gae_with_boundaries_agrees_with_the_token_path_on_one_episode() -> None:
    # One episode filling the segment and terminating at its end is the language-model case.
    g = torch.Generator().manual_seed(3)
    r, v = torch.randn(2, 6, generator=g), torch.randn(2, 6, generator=g)
    next_v = torch.cat([v[:, 1:], torch.full((2, 1), 5.0)], dim=1)
    terminated = torch.zeros(2, 6, dtype=torch.bool)
    terminated[:, -1] = True
    mask = torch.ones(2, 6)
    old = gae(token_rewards=r, response_mask=mask, values=v, gamma=0.9, lam=0.7)
    new = gae(
        token_rewards=r,
        response_mask=mask,
        values=v,
        next_values=next_v,
        terminated=terminated,
        gamma=0.9,
        lam=0.7,
    )
    torch.testing.assert_close(new, old)


def test_gae_with_boundaries_skips_masked_steps_and_can_whiten() -> None:
    ro = _rollout(n_envs=3, steps=8, seed=4)
    kw = {k: ro[k] for k in ("values", "next_values", "dones", "terminated")}
    full, _ = gae(token_rewards=ro["rewards"], response_mask=torch.ones(3, 8), **kw, gamma=0.9, lam=0.8)
    # A masked column with garbage everywhere, inserted at position 4, changes nothing else.
    garbage = {k: torch.cat([t[:, :4], torch.full_like(t[:, :1], 99), t[:, 4:]], 1) for k, t in ro.items()}
    mask = torch.ones(3, 9)
    mask[:, 4] = 0
    kw_g = {k: garbage[k] for k in ("values", "next_values", "dones", "terminated")}
    padded, ret = gae(token_rewards=garbage["rewards"], response_mask=mask, **kw_g, gamma=0.9, lam=0.8)
    torch.testing.assert_close(torch.cat([padded[:, :4], padded[:, 5:]], 1), full)
    assert (padded[:, 4] == 0).all() and (ret[:, 4] == 0).all()
    whitened, _ = gae(
        token_rewards=ro["rewards"], response_mask=torch.ones(3, 8), **kw, gamma=0.9, lam=0.8, whiten=True
    )
    torch.testing.assert_close(whitened, masked_whiten(full, torch.ones(3, 8)))


def test_gae_terminated_defaults_to_dones_and_dones_need_next_values() -> None:
    ro = _rollout(n_envs=2, steps=8, seed=5)
    common = {"token_rewards": ro["rewards"], "response_mask": torch.ones(2, 8), "values": ro["values"]}
    all_terminal = gae(**common, next_values=ro["next_values"], dones=ro["dones"], terminated=ro["dones"])
    torch.testing.assert_close(gae(**common, next_values=ro["next_values"], dones=ro["dones"]), all_terminal)
    with pytest.raises(ValueError, match="next_values"):
        gae(**common, dones=ro["dones"])


# --- SAC -------------------------------------------------------------------------------------------


def test_sac_critic_target_by_hand_and_without_gradient() -> None:
    # row 0: min(3, 4) - 0.2 * (-1) = 3.2;  y = 1 + 0.99 * 3.2 = 4.168
    # row 1: terminated: y = r = 2
    next_q1 = torch.tensor([3.0, 5.0], requires_grad=True)
    log_alpha = torch.tensor(math.log(0.2), requires_grad=True)
    y = sac_critic_target(
        torch.tensor([1.0, 2.0]),
        torch.tensor([F_, T_]),
        next_q1,
        torch.tensor([4.0, 1.0]),
        torch.tensor([-1.0, 0.5], requires_grad=True),
        alpha=log_alpha.exp(),
        gamma=0.99,
    )
    torch.testing.assert_close(y, torch.tensor([4.168, 2.0]))
    assert not y.requires_grad
    # Float 0/1 terminal flags read the same as bools.
    y_float = sac_critic_target(
        torch.tensor([1.0, 2.0]),
        torch.tensor([0.0, 1.0]),
        torch.tensor([3.0, 5.0]),
        torch.tensor([4.0, 1.0]),
        torch.tensor([-1.0, 0.5]),
        alpha=0.2,
        gamma=0.99,
    )
    torch.testing.assert_close(y_float, y)


def test_target_functions_reject_a_column_critic_output() -> None:
    with pytest.raises(ValueError, match=r"next_q1 \[2, 1\]"):
        td3_target(torch.zeros(2), torch.zeros(2), torch.zeros(2, 1), torch.zeros(2), gamma=0.9)
    with pytest.raises(ValueError, match="shapes differ"):
        q_loss(torch.zeros(2, 1), torch.zeros(2))


def test_sac_actor_loss_by_hand_with_gradients() -> None:
    # min(Q1, Q2) = [1.0 (Q1), 0.5 (Q2)];  α log π = 0.5 * [-1, 2] = [-0.5, 1.0]
    # loss = mean([-0.5 - 1.0, 1.0 - 0.5]) = mean([-1.5, 0.5]) = -0.5
    q1 = torch.tensor([1.0, 2.0], requires_grad=True)
    q2 = torch.tensor([1.5, 0.5], requires_grad=True)
    log_prob = torch.tensor([-1.0, 2.0], requires_grad=True)
    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    loss = sac_actor_loss(q1, q2, log_prob, alpha=log_alpha.exp())
    torch.testing.assert_close(loss, torch.tensor(-0.5))
    loss.backward()
    # d/dlogπ = α / B = 0.25; d/dQ = -1/B = -0.5 on whichever critic is the min; α is a constant.
    torch.testing.assert_close(log_prob.grad, torch.tensor([0.25, 0.25]))
    torch.testing.assert_close(q1.grad, torch.tensor([-0.5, 0.0]))
    torch.testing.assert_close(q2.grad, torch.tensor([0.0, -0.5]))
    assert log_alpha.grad is None


def test_sac_alpha_loss_by_hand_and_it_does_not_reach_the_policy() -> None:
    # log π + H̄ = [-1, -3] + (-2) = [-3, -5];  loss = -mean(0.3 * [-3, -5]) = 1.2
    # d/dlog α = -mean([-3, -5]) = 4 > 0: the entropy (mean -log π = 2) is above the target -2, so a
    # descent step lowers α.
    log_alpha = torch.tensor(0.3, requires_grad=True)
    log_prob = torch.tensor([-1.0, -3.0], requires_grad=True)
    loss = sac_alpha_loss(log_alpha, log_prob, target_entropy=-2.0)
    torch.testing.assert_close(loss, torch.tensor(1.2))
    loss.backward()
    torch.testing.assert_close(log_alpha.grad, torch.tensor(4.0))
    assert log_prob.grad is None


# --- TD3 -------------------------------------------------------------------------------------------


def test_td3_target_by_hand_and_equal_to_sac_with_zero_alpha() -> None:
    # row 0: 1 + 0.99 * min(3, 4) = 3.97;  row 1: terminated: 2
    reward, terminated = torch.tensor([1.0, 2.0]), torch.tensor([F_, T_])
    next_q1 = torch.tensor([3.0, 5.0], requires_grad=True)
    next_q2 = torch.tensor([4.0, 1.0])
    y = td3_target(reward, terminated, next_q1, next_q2, gamma=0.99)
    torch.testing.assert_close(y, torch.tensor([3.97, 2.0]))
    assert not y.requires_grad
    sac = sac_critic_target(
        reward, terminated, next_q1, next_q2, torch.tensor([5.0, 5.0]), alpha=0.0, gamma=0.99
    )
    torch.testing.assert_close(sac, y)


def test_td3_actor_loss_is_minus_the_mean_q() -> None:
    q1 = torch.tensor([1.0, 3.0], requires_grad=True)
    loss = td3_actor_loss(q1)
    torch.testing.assert_close(loss, torch.tensor(-2.0))
    loss.backward()
    torch.testing.assert_close(q1.grad, torch.tensor([-0.5, -0.5]))


def test_smoothed_target_action_clips_noise_then_bounds() -> None:
    action = torch.tensor([[0.0, 1.9], [0.9, -0.5]], requires_grad=True)
    low, high = torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 2.0])
    out = smoothed_target_action(
        action, noise_std=0.2, noise_clip=0.5, low=low, high=high, generator=torch.Generator().manual_seed(0)
    )
    eps = torch.randn(2, 2, generator=torch.Generator().manual_seed(0))
    expected = torch.clamp(action.detach() + (0.2 * eps).clamp(-0.5, 0.5), low, high)
    torch.testing.assert_close(out, expected)
    assert not out.requires_grad
    # Huge noise: every action moves by exactly ±c (0.5) before the bounds, then -0.5 is clipped to -0.4.
    wide = smoothed_target_action(
        torch.zeros(1000, 1),
        noise_std=1e6,
        noise_clip=0.5,
        low=-0.4,
        high=1.0,
        generator=torch.Generator().manual_seed(1),
    )
    assert ((wide == -0.4) | (wide == 0.5)).all()
    assert (wide == -0.4).any() and (wide == 0.5).any()
    # No noise: the action, clipped to the bounds (0.9 -> 0.5 here).
    still = smoothed_target_action(
        torch.tensor([[0.9, -0.1]]), noise_std=0.0, noise_clip=0.5, low=-1.0, high=0.5
    )
    torch.testing.assert_close(still, torch.tensor([[0.5, -0.1]]))


# --- shared pieces ---------------------------------------------------------------------------------


def test_q_loss_is_the_mean_squared_error_with_the_target_detached() -> None:
    # mean((1 - 0)^2, (2 - 4)^2) = (1 + 4) / 2 = 2.5;  d/dq = 2 (q - y) / B = [1, -2]
    q = torch.tensor([1.0, 2.0], requires_grad=True)
    target = torch.tensor([0.0, 4.0], requires_grad=True)
    loss = q_loss(q, target)
    torch.testing.assert_close(loss, torch.tensor(2.5))
    loss.backward()
    torch.testing.assert_close(q.grad, torch.tensor([1.0, -2.0]))
    assert target.grad is None


def test_polyak_update_by_hand_and_at_the_ends() -> None:
    # tau = 0.25: 0.25 * [1, 0] + 0.75 * [0, 4] = [0.25, 3.0]
    target = [torch.tensor([0.0, 4.0])]
    polyak_update(target, [torch.tensor([1.0, 0.0])], tau=0.25)
    assert torch.equal(target[0], torch.tensor([0.25, 3.0]))

    g = torch.Generator().manual_seed(0)
    online = torch.nn.Linear(3, 2)
    for tau, expect in [(1.0, "online"), (0.0, "target")]:
        tgt = torch.nn.Linear(3, 2)
        with torch.no_grad():  # magnitudes far apart, where θ' + τ(θ - θ') would round
            for p in tgt.parameters():
                p.copy_(1e8 * torch.randn(p.shape, generator=g))
        before = [p.detach().clone() for p in tgt.parameters()]
        polyak_update(tgt.parameters(), online.parameters(), tau=tau)
        want = [p.detach() for p in online.parameters()] if expect == "online" else before
        assert all(torch.equal(a, b) for a, b in zip(tgt.parameters(), want, strict=True))
        assert all(p.is_leaf and p.grad_fn is None for p in tgt.parameters())


def test_polyak_update_matches_the_formula_on_parameters() -> None:
    torch.manual_seed(0)
    target, online = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    expected = [
        0.005 * o.detach() + 0.995 * t.detach()
        for t, o in zip(target.parameters(), online.parameters(), strict=True)
    ]
    polyak_update(target.parameters(), online.parameters(), tau=0.005)
    for got, want in zip(target.parameters(), expected, strict=True):
        torch.testing.assert_close(got.detach(), want, atol=1e-7, rtol=1e-6)


def test_polyak_update_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="tau"):
        polyak_update([torch.zeros(1)], [torch.zeros(1)], tau=1.5)
    with pytest.raises(ValueError, match="1 target tensors but 2"):
        polyak_update([torch.zeros(1)], [torch.zeros(1), torch.zeros(1)], tau=0.1)


def test_tanh_gaussian_log_prob_by_hand() -> None:
    # u = 0, N(0, 1): log N = -0.5 log(2π) = -0.9189385 per dim, log(1 - tanh(0)^2) = 0; two dims
    got = tanh_gaussian_log_prob(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2))
    torch.testing.assert_close(got, torch.tensor([-math.log(2 * math.pi)]))


def test_tanh_gaussian_log_prob_matches_the_direct_form_where_it_is_stable() -> None:
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(64, 3, generator=g).requires_grad_()
    log_std = (0.5 * torch.randn(64, 3, generator=g)).requires_grad_()
    u = (3.0 * torch.rand(64, 3, generator=g) * 2 - 3.0).requires_grad_()  # |u| < 3
    got = tanh_gaussian_log_prob(mean, log_std, u)
    normal = torch.distributions.Normal(mean, log_std.exp())
    direct = (normal.log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)
    assert got.shape == (64,)
    torch.testing.assert_close(got, direct, atol=1e-5, rtol=0)
    got.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (mean, log_std, u))


def test_tanh_gaussian_log_prob_stays_finite_far_in_the_tails() -> None:
    # log(1 - tanh(20)^2) = 2 (log 2 - 20 - softplus(-40)) ≈ 2 log 2 - 40; the direct form gives log 0.
    u = torch.tensor([[20.0]])
    got = tanh_gaussian_log_prob(torch.zeros(1, 1), torch.zeros(1, 1), u)
    expected = -0.5 * 400 - 0.5 * math.log(2 * math.pi) - (2 * math.log(2) - 40)
    torch.testing.assert_close(got, torch.tensor([expected]))
    assert torch.isinf(torch.log(1 - torch.tanh(u) ** 2)).all()
