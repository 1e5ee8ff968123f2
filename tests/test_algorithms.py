"""Numerical checks of the algorithm layer against hand-computed values and written-out formulas."""

from __future__ import annotations

import math

import pytest
import torch

from hone.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate_loss,
    register_advantage,
    scores_to_token_rewards,
)

ONE_GROUP = torch.zeros(4, dtype=torch.long)


def outcome(scores: list[float], width: int = 3, lengths: list[int] | None = None):
    lengths = lengths or [width] * len(scores)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    return scores_to_token_rewards(torch.tensor(scores), mask), mask


# --- advantages -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "expected"), [("grpo", 0.8660254), ("rloo", 2 / 3), ("dr_grpo", 0.5)])
def test_group_estimators_on_1001(name: str, expected: float) -> None:
    rewards, mask = outcome([1, 0, 0, 1])
    adv, ret = ADVANTAGE_ESTIMATORS[name](
        token_rewards=rewards, response_mask=mask, group_ids=ONE_GROUP, eps=1e-6, norm_by_std=True
    )
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0]).unsqueeze(-1)
    torch.testing.assert_close(adv, signs * expected * mask, atol=1e-4, rtol=0)
    torch.testing.assert_close(ret, adv)


def test_grpo_eps_and_std_convention() -> None:
    # rewards [3, 1]: mean 2, unbiased std sqrt(2); with eps=0.5 → ±1/(sqrt 2 + 0.5)
    rewards, mask = outcome([3, 1])
    adv, _ = ADVANTAGE_ESTIMATORS["grpo"](
        token_rewards=rewards, response_mask=mask, group_ids=torch.tensor([7, 7]), eps=0.5
    )
    expected = 1 / (math.sqrt(2) + 0.5)
    torch.testing.assert_close(adv[:, 0], torch.tensor([expected, -expected]))


def test_grpo_groups_are_independent_and_singletons_get_zero() -> None:
    rewards, mask = outcome([1, 0, 5, 2, 2])
    groups = torch.tensor([0, 0, 1, 2, 2])
    adv, _ = ADVANTAGE_ESTIMATORS["grpo"](token_rewards=rewards, response_mask=mask, group_ids=groups)
    col = adv[:, 0]
    assert col[2] == 0  # singleton group
    assert torch.all(col[3:] == 0)  # equal rewards: no signal
    torch.testing.assert_close(col[:2], torch.tensor([0.7071, -0.7071]), atol=1e-4, rtol=0)


def test_grpo_batch_std_divides_by_the_std_of_every_row() -> None:
    # scores [1, 0 | 5 | 2, 2]: the batch std is over all five (mean 2, squared deviations 1+4+9+0+0 = 14,
    # unbiased 14/4 = 3.5, std 1.8708287), the singleton and all-equal groups still count in it and get 0
    rewards, mask = outcome([1, 0, 5, 2, 2])
    groups = torch.tensor([0, 0, 1, 2, 2])
    adv, _ = ADVANTAGE_ESTIMATORS["grpo"](
        token_rewards=rewards, response_mask=mask, group_ids=groups, eps=0.0, std_over="batch"
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.2672612, -0.2672612, 0, 0, 0]), atol=1e-6, rtol=0)
    # one row: no batch std and no signal; the advantage is 0, not NaN or ±1/eps
    one, one_mask = outcome([3.0])
    alone, _ = ADVANTAGE_ESTIMATORS["grpo"](
        token_rewards=one, response_mask=one_mask, group_ids=torch.tensor([0]), std_over="batch"
    )
    assert torch.all(alone == 0)
    with pytest.raises(ValueError, match="std_over must be 'group' or 'batch', not 'prompt'"):
        ADVANTAGE_ESTIMATORS["grpo"](
            token_rewards=rewards, response_mask=mask, group_ids=groups, std_over="prompt"
        )


def test_equal_rewards_after_float_rounding_still_give_zero_advantage() -> None:
    # 0.5 * 0.2335... three times: the float mean differs from the values by an ulp (found by hypothesis)
    value = 0.5 * 0.23350265692922156
    rewards, mask = outcome([value] * 3, width=1)
    adv, _ = ADVANTAGE_ESTIMATORS["grpo"](
        token_rewards=rewards, response_mask=mask, group_ids=torch.zeros(3, dtype=torch.long), eps=0.0
    )
    assert torch.all(adv == 0)


def test_rloo_uses_leave_one_out_mean() -> None:
    rewards, mask = outcome([1.0, 2.0, 6.0], width=2)
    adv, _ = ADVANTAGE_ESTIMATORS["rloo"](
        token_rewards=rewards, response_mask=mask, group_ids=torch.zeros(3, dtype=torch.long)
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([1 - 4.0, 2 - 3.5, 6 - 1.5]))


def test_reinforce_pp_discounts_then_whitens_over_valid_tokens() -> None:
    # one sequence of 3 valid tokens + 1 pad, reward 1 at the end, gamma 0.5 → G = [0.25, 0.5, 1]
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = ADVANTAGE_ESTIMATORS["reinforce_pp"](token_rewards=rewards, response_mask=mask, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 1.0, 0.0]]))
    g = torch.tensor([0.25, 0.5, 1.0])
    whitened = (g - g.mean()) / (g.std(unbiased=True) + 1e-8)
    torch.testing.assert_close(adv[0, :3], whitened)
    assert adv[0, 3] == 0


def test_returns_skip_masked_tokens_inside_a_response() -> None:
    # a tool token (mask 0) in the middle neither discounts nor resets the return
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    _, ret = ADVANTAGE_ESTIMATORS["reinforce_pp"](token_rewards=rewards, response_mask=mask, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.0, 0.5, 1.0]]))


def test_reinforce_pp_baseline_centres_by_group_then_whitens() -> None:
    rewards, mask = outcome([1, 0, 3, 1], width=2)
    groups = torch.tensor([0, 0, 1, 1])
    adv, centred = ADVANTAGE_ESTIMATORS["reinforce_pp_baseline"](
        token_rewards=rewards, response_mask=mask, group_ids=groups
    )
    torch.testing.assert_close(centred[:, 0], torch.tensor([0.5, -0.5, 1.0, -1.0]))
    flat = centred.flatten()
    torch.testing.assert_close(adv.flatten(), (flat - flat.mean()) / (flat.std() + 1e-8))


def test_gae_matches_hand_computation() -> None:
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.4, 0.8, 9.0]])  # last column is padding: its value must not be used
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    gamma, lam = 0.9, 0.8
    d2 = 1.0 - 0.8
    d1 = 0.0 + gamma * 0.8 - 0.4
    d0 = 0.0 + gamma * 0.4 - 0.5
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    adv, ret = ADVANTAGE_ESTIMATORS["gae"](
        token_rewards=r, response_mask=mask, values=v, gamma=gamma, lam=lam
    )
    torch.testing.assert_close(adv, torch.tensor([[a0, a1, a2, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[a0 + 0.5, a1 + 0.4, a2 + 0.8, 0.0]]))


def test_gae_lambda_one_gamma_one_is_return_minus_value() -> None:
    r = torch.tensor([[0.0, 0.0, 2.0]])
    v = torch.tensor([[0.3, 0.1, 0.7]])
    adv, _ = ADVANTAGE_ESTIMATORS["gae"](token_rewards=r, response_mask=torch.ones(1, 3), values=v)
    torch.testing.assert_close(adv, 2.0 - v)


def test_missing_inputs_give_clear_errors() -> None:
    rewards, mask = outcome([1, 0])
    with pytest.raises(ValueError, match="group_ids"):
        ADVANTAGE_ESTIMATORS["grpo"](token_rewards=rewards, response_mask=mask)
    with pytest.raises(ValueError, match="values"):
        ADVANTAGE_ESTIMATORS["gae"](token_rewards=rewards, response_mask=mask)
    with pytest.raises(KeyError, match=r"registered: .*grpo"):
        ADVANTAGE_ESTIMATORS["gpro"]


def test_register_advantage_adds_a_new_estimator() -> None:
    @register_advantage("test_constant_one")
    def constant(*, token_rewards: torch.Tensor, response_mask: torch.Tensor, **_: object):
        return response_mask.clone(), response_mask.clone()

    try:
        adv, _ = ADVANTAGE_ESTIMATORS["test_constant_one"](
            token_rewards=torch.zeros(1, 2), response_mask=torch.ones(1, 2), group_ids=None
        )
        assert adv.sum() == 2
        with pytest.raises(ValueError, match="already registered"):
            register_advantage("test_constant_one")(constant)
    finally:
        del ADVANTAGE_ESTIMATORS["test_constant_one"]


def test_scores_to_token_rewards_places_score_on_last_valid_token() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    out = scores_to_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    torch.testing.assert_close(out, torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]))


# --- KL ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "expected"), [("k1", 0.5), ("k2", 0.125), ("k3", 0.10653066)])
def test_kl_estimators_hand_values(name: str, expected: float) -> None:
    out = KL_ESTIMATORS[name](torch.tensor([-1.0]), torch.tensor([-1.5]))
    assert out.item() == pytest.approx(expected, abs=1e-6)


def test_k3_is_unbiased_and_nonnegative() -> None:
    # Sample y ~ p and check E[k3] = KL(p || q) for two categorical distributions.
    torch.manual_seed(0)
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.2, 0.5, 0.3])
    y = torch.multinomial(p, 200_000, replacement=True)
    samples = KL_ESTIMATORS["k3"](p.log()[y], q.log()[y])
    assert samples.min() >= 0
    assert samples.mean().item() == pytest.approx((p * (p / q).log()).sum().item(), rel=0.02)


def _reverse_kl(pi: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (pi * (pi.log() - ref.log())).sum()


def _forward_kl(pi: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (ref * (ref.log() - pi.log())).sum()


@pytest.mark.parametrize(("name", "divergence"), [("k2", _reverse_kl), ("k3", _forward_kl)])
def test_kl_in_the_loss_gives_the_stated_divergence_gradient(name: str, divergence) -> None:
    # The trainer differentiates k(log π(y), log π_ref(y)) at fixed sampled tokens y ~ π. Its expected
    # gradient, exactly: the sum over a categorical support weighted by the (detached) probabilities.
    # float64 and 5 terms: exact up to ~1e-15, so a 1e-10 tolerance cannot hide a wrong divergence
    # (here the reverse and forward KL gradients differ by > 0.05 in every coordinate).
    logits = torch.tensor([1.0, -0.5, 0.3, 2.0, -1.2], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([0.1, 0.3, 0.2, 0.15, 0.25], dtype=torch.float64)
    pi = logits.softmax(-1)
    expected_loss = (pi.detach() * KL_ESTIMATORS[name](pi.log(), ref.log())).sum()
    (estimated,) = torch.autograd.grad(expected_loss, logits)
    (stated,) = torch.autograd.grad(divergence(logits.softmax(-1), ref), logits)
    other = _forward_kl if divergence is _reverse_kl else _reverse_kl
    (wrong,) = torch.autograd.grad(other(logits.softmax(-1), ref), logits)
    assert (stated - wrong).abs().min() > 0.05
    torch.testing.assert_close(estimated, stated, atol=1e-10, rtol=0)


def test_k1_in_the_loss_has_zero_expected_gradient() -> None:
    logits = torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    pi = logits.softmax(-1)
    (grad,) = torch.autograd.grad((pi.detach() * KL_ESTIMATORS["k1"](pi.log(), ref.log())).sum(), logits)
    torch.testing.assert_close(grad, torch.zeros_like(grad), atol=1e-12, rtol=0)


# --- policy losses ----------------------------------------------------------------------------------


def ratio_case(ratios: list[float], advantages: list[float]):
    log_probs = torch.tensor([ratios]).log().requires_grad_(True)
    return dict(
        log_probs=log_probs,
        old_log_probs=torch.zeros(1, len(ratios)),
        advantages=torch.tensor([advantages]),
        response_mask=torch.ones(1, len(ratios)),
    )


def test_ppo_clip_higher_and_dual_clip_hand_values() -> None:
    for ratio, adv, expected in [(1.5, 1.0, -1.28), (4.0, -1.0, 3.0), (0.5, -1.0, 0.8), (1.1, 1.0, -1.1)]:
        loss, _ = POLICY_LOSSES["ppo"](
            **ratio_case([ratio], [adv]), clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg="token-mean"
        )
        assert loss.item() == pytest.approx(expected, abs=1e-6), (ratio, adv)


def test_ppo_metrics_report_clip_fraction_and_kl() -> None:
    case = ratio_case([1.5, 1.0, 0.5, 1.1], [1.0, 1.0, -1.0, -1.0])
    _, metrics = POLICY_LOSSES["ppo"](**case, clip_low=0.2, clip_high=0.2)
    assert metrics["clip_frac"].item() == pytest.approx(0.5)  # 1.5 with A>0 and 0.5 with A<0
    r = torch.tensor([1.5, 1.0, 0.5, 1.1])
    assert metrics["approx_kl"].item() == pytest.approx(((r - 1) - r.log()).mean().item(), abs=1e-6)


def written_out_ppo(logp, old, adv, mask, lo, hi, c):
    ratio = torch.exp(logp - old)
    surr = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - lo, 1 + hi))
    surr = torch.where(adv < 0, torch.min(surr, -adv * c), surr)
    return (surr * mask).sum() / mask.sum()


def random_case(seed: int, b: int = 3, t: int = 5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 2
    logp = (old + torch.randn(b, t, generator=g) * 0.4).requires_grad_(True)
    adv = torch.randn(b, t, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[:, 0] = 1
    return logp, old, adv, mask


@pytest.mark.parametrize("seed", range(3))
def test_ppo_gradient_matches_written_out_formula(seed: int) -> None:
    logp, old, adv, mask = random_case(seed)
    loss, _ = POLICY_LOSSES["ppo"](
        log_probs=logp,
        old_log_probs=old,
        advantages=adv,
        response_mask=mask,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=3.0,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    ref = written_out_ppo(logp, old, adv, mask, 0.2, 0.28, 3.0)
    (ref_grad,) = torch.autograd.grad(ref, logp)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, ref_grad)


@pytest.mark.parametrize("seed", range(3))
def test_gspo_value_and_gradient_match_written_out_formula(seed: int) -> None:
    logp, old, adv, mask = random_case(seed)
    adv = adv[:, :1].expand_as(adv)  # GSPO uses sequence-level advantages
    lo, hi = 0.05, 0.1
    loss, _ = POLICY_LOSSES["gspo"](
        log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask, clip_low=lo, clip_high=hi
    )
    # Written out from the paper: per sequence, -min(s A, clip(s) A) with s = exp(mean log-ratio);
    # the sequence-level objective has the same value and gradient as GSPO-token for shared A.
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    a = adv[:, 0]
    ref = torch.max(-a * s, -a * s.clamp(1 - lo, 1 + hi)).mean()
    (grad,) = torch.autograd.grad(loss, logp)
    (ref_grad,) = torch.autograd.grad(ref, logp)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, ref_grad)


def test_cispo_gradient_is_clipped_weight_times_advantage() -> None:
    case = ratio_case([2.0, 0.5, 1.1], [1.0, -2.0, 0.5])
    loss, metrics = POLICY_LOSSES["cispo"](**case, clip_high=0.28)
    (grad,) = torch.autograd.grad(loss, case["log_probs"])
    # d/dlogp of -sg(w) A logp = -w A, token-mean over 3 tokens; w = min(r, 1.28)
    expected = -torch.tensor([[1.28 * 1.0, 0.5 * -2.0, 1.1 * 0.5]]) / 3
    torch.testing.assert_close(grad, expected)
    assert metrics["clip_frac"].item() == pytest.approx(1 / 3)


def test_padding_with_extreme_log_probs_never_gives_nan_gradients() -> None:
    logp = torch.tensor([[-1.0, 80.0]], requires_grad=True)  # padding position holds garbage
    for name in POLICY_LOSSES:
        loss, _ = POLICY_LOSSES[name](
            log_probs=logp,
            old_log_probs=torch.tensor([[-1.2, -90.0]]),
            advantages=torch.tensor([[1.0, 1.0]]),
            response_mask=torch.tensor([[1.0, 0.0]]),
        )
        (grad,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), name
        assert grad[0, 1] == 0, name


def test_dual_clip_must_exceed_one() -> None:
    with pytest.raises(ValueError, match="dual_clip"):
        POLICY_LOSSES["ppo"](**ratio_case([1.0], [1.0]), dual_clip=0.5)


# --- aggregation ------------------------------------------------------------------------------------


def test_aggregation_modes_hand_values() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(10 / (2 * 4))
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", norm_len=10).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(loss, mask, "mean")


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_gradient_accumulation_over_4_micro_batches_equals_full_batch(mode: str) -> None:
    logp, old, adv, mask = random_case(seed=11, b=8, t=6)
    mask[0, 1:] = 0  # very uneven lengths: where per-micro-batch normalisation goes wrong
    mask[5, :] = 1
    full, _ = POLICY_LOSSES["ppo"](
        log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask, agg=mode
    )
    (full_grad,) = torch.autograd.grad(full, logp)

    accumulated = torch.zeros_like(logp)
    total = 0.0
    for rows in torch.arange(8).chunk(4):
        micro, _ = POLICY_LOSSES["ppo"](
            log_probs=logp[rows],
            old_log_probs=old[rows],
            advantages=adv[rows],
            response_mask=mask[rows],
            agg=mode,
            num_tokens=mask.sum(),
            num_seqs=8,
            norm_len=6,
        )
        (g,) = torch.autograd.grad(micro, logp)
        accumulated += g
        total += micro.item()
    assert total == pytest.approx(full.item(), rel=1e-6)
    torch.testing.assert_close(accumulated, full_grad)


def test_naive_micro_batch_mean_differs_from_full_batch() -> None:
    # Guards the test above: with uneven lengths the common bug gives a different answer.
    loss = torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    naive = sum(aggregate_loss(loss[i : i + 1], mask[i : i + 1]) for i in range(2)) / 2
    assert naive.item() != pytest.approx(aggregate_loss(loss, mask).item())
