"""The off-policy correction inside RLTrainer.update: the policy term's tokens are weighted and masked by
`algorithm.off_policy` (anchor: old_logp, behaviour: behaviour_logp), and `none` changes nothing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from hone.algorithms import POLICY_LOSSES
from hone.config import AlgorithmConfig, OffPolicyConfig, TrainerConfig
from hone.training.policy import Policy
from hone.training.ppo import MicroBatch
from hone.training.trainer import RLTrainer
from hone.types import TrainBatch
from tests.helpers import make_batch


def _trainer(policy: Policy, off_policy: OffPolicyConfig, **algo: object) -> RLTrainer:
    algorithm = AlgorithmConfig(old_log_probs="recompute", off_policy=off_policy, **algo)
    trainer = RLTrainer(
        policy, algorithm, TrainerConfig(lr=1.0), total_rl_steps=1, temperature=1.0, norm_len=8
    )
    # Plain SGD, lr 1: the weights move by exactly the (unclipped) gradient, so updates compare gradients.
    trainer.optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
    trainer.stepper.grad_clip = None
    return trainer


def _hand_batch() -> tuple[TrainBatch, torch.Tensor]:
    """Two rows of four columns in float64 (the second row one token shorter), anchor log-probs off the
    sampler's by log-ratios from -1.5 to 1.5, and the policy's log-probs as a leaf to differentiate."""
    mask = torch.tensor([[1.0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.2], [-0.7, -1.1, -2.2, -0.3]], dtype=torch.float64)
    log_rho = torch.tensor([[-1.5, -0.2, 0.3, 1.5], [0.0, 0.6, -0.6, 0.0]], dtype=torch.float64)
    advantages = torch.tensor([[1.0], [-0.5]], dtype=torch.float64) * mask
    batch = TrainBatch(
        input_ids=torch.zeros(2, 5, dtype=torch.long),
        attention_mask=torch.ones(2, 5, dtype=torch.long),
        loss_mask=mask,
        old_logp=old,
        behaviour_logp=old - log_rho,
        advantages=advantages,
        returns=advantages,
    )
    log_probs = old + torch.tensor([[0.1, -0.3, 0.05, 0.4], [0.0, -0.1, 0.25, 0.0]], dtype=torch.float64)
    return batch, log_probs.requires_grad_()


def _policy_term_grad(trainer: RLTrainer, batch: TrainBatch, log_probs: torch.Tensor) -> torch.Tensor:
    weights, _ = trainer._off_policy(batch)
    rows = torch.arange(2)
    counts = {"num_tokens": batch.loss_mask.sum(), "num_seqs": 2, "norm_len": 8}
    micro = MicroBatch(batch, rows, batch.loss_mask, log_probs, None, counts, weights)
    loss, _ = trainer._policy_term(micro)
    (grad,) = torch.autograd.grad(loss, log_probs)
    return grad


def _ppo_by_hand(batch: TrainBatch, log_probs: torch.Tensor, token_weights: torch.Tensor) -> torch.Tensor:
    """PPO's clipped surrogate (ε 0.2), each token's term times `token_weights`, token-mean."""
    ratio = torch.exp((log_probs - batch.old_logp) * batch.loss_mask)
    adv = batch.advantages
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    return (per_token * token_weights * batch.loss_mask).sum() / batch.loss_mask.sum()


def test_tis_weights_each_token_as_by_hand_in_float64(micro_model_dir: Path) -> None:
    trainer = _trainer(Policy.from_pretrained(micro_model_dir), OffPolicyConfig(name="tis", cap=1.5))
    batch, log_probs = _hand_batch()
    grad = _policy_term_grad(trainer, batch, log_probs)
    # w = min(pi_old / pi_sampler, 1.5): e^1.5 and e^0.6 are capped, e^-1.5 .. e^0.3 pass (some below 1).
    rho = torch.exp(batch.old_logp - batch.behaviour_logp)
    w = rho.clamp(max=1.5)
    assert bool((w < rho).any()) and bool(((w < 1) & (batch.loss_mask > 0)).any())
    (expected,) = torch.autograd.grad(_ppo_by_hand(batch, log_probs, w), log_probs)
    (unweighted,) = torch.autograd.grad(_ppo_by_hand(batch, log_probs, torch.ones_like(w)), log_probs)
    assert not torch.allclose(expected, unweighted)  # the weights matter here
    # Float64 throughout: the two computations differ only in where the weight multiplies (~1e-16).
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)


def test_mis_masked_tokens_get_zero_gradient_and_kept_ones_their_ratio(micro_model_dir: Path) -> None:
    trainer = _trainer(Policy.from_pretrained(micro_model_dir), OffPolicyConfig(name="mis", lo=0.5, hi=2.0))
    batch, log_probs = _hand_batch()
    grad = _policy_term_grad(trainer, batch, log_probs)
    # |log ratio| 1.5 > log 2 on row 0's first and last tokens: dropped; every other response token kept.
    dropped = torch.tensor([[1, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.bool)
    assert bool((grad[dropped] == 0).all())
    kept = ~dropped & batch.loss_mask.bool()
    assert bool((grad[kept] != 0).all())
    w = torch.exp(batch.old_logp - batch.behaviour_logp) * kept
    (expected,) = torch.autograd.grad(_ppo_by_hand(batch, log_probs, w), log_probs)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    _, metrics = trainer._off_policy(batch)
    assert metrics["off_policy/masked_frac"] == pytest.approx(2 / 6)


def _updated(model_dir: Path, off_policy: OffPolicyConfig, sampler_shift: float | None) -> tuple[dict, dict]:
    policy = Policy.from_pretrained(model_dir)
    trainer = _trainer(policy, off_policy)
    batch = make_batch(policy)
    if sampler_shift is not None:
        shift = sampler_shift * torch.linspace(-1, 1, batch.old_logp.shape[1])
        batch = dataclasses.replace(batch, behaviour_logp=batch.old_logp + shift)
    metrics = trainer.update(batch, 0)
    return {k: v.clone() for k, v in policy.model.state_dict().items()}, metrics


def test_none_is_todays_update_bit_for_bit(micro_model_dir: Path) -> None:
    today, _ = _updated(micro_model_dir, OffPolicyConfig(), sampler_shift=None)
    with_sampler, metrics = _updated(micro_model_dir, OffPolicyConfig(), sampler_shift=0.3)
    assert all(torch.equal(with_sampler[k], v) for k, v in today.items())
    assert metrics["mismatch/logprob_abs"] > 0  # the uncorrected mismatch is still measured


def test_update_applies_the_correction_and_logs_it(micro_model_dir: Path) -> None:
    start = {k: v.clone() for k, v in Policy.from_pretrained(micro_model_dir).model.state_dict().items()}
    none, _ = _updated(micro_model_dir, OffPolicyConfig(), sampler_shift=0.3)
    tis, metrics = _updated(micro_model_dir, OffPolicyConfig(name="tis", cap=1.1), sampler_shift=0.3)
    assert any(not torch.equal(tis[k], none[k]) for k in none)
    assert {"off_policy/is_ratio_mean", "off_policy/masked_frac", "mismatch/logprob_abs"} <= metrics.keys()
    # Every ratio outside [0.9, 0.95]: every token dropped, so the step is a zero gradient.
    dropped, metrics = _updated(
        micro_model_dir, OffPolicyConfig(name="mis", lo=0.9, hi=0.95), sampler_shift=5.0
    )
    assert metrics["off_policy/masked_frac"] == 1.0 and metrics["grad_norm"] == 0.0
    assert all(torch.equal(dropped[k], v) for k, v in start.items())


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo"])
def test_every_built_in_loss_weights_its_token_terms(name: str) -> None:
    # Each loss's per-token term is linear in A for positive weights (max(-wA r, -wA clip r) = w max(...)),
    # so weighting the tokens equals scaling their advantages: float64, equal to rounding (~1e-16).
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float64)
    old = -torch.rand(2, 4, generator=g, dtype=torch.float64) - 0.5
    log_probs = (old + 0.3 * torch.randn(2, 4, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(2, 4, generator=g, dtype=torch.float64) * mask
    w = torch.tensor([[0.5, 2.0, 1.3, 1.0], [0.7, 1.9, 1.0, 1.0]], dtype=torch.float64)
    loss_fn = POLICY_LOSSES[name]
    common = {"log_probs": log_probs, "old_log_probs": old, "response_mask": mask}
    weighted, _ = loss_fn(advantages=adv, token_weights=w, **common)
    by_hand, _ = loss_fn(advantages=adv * w, **common)
    torch.testing.assert_close(weighted, by_hand, rtol=1e-12, atol=1e-15)
    (grad,) = torch.autograd.grad(weighted, log_probs)
    (expected,) = torch.autograd.grad(by_hand, log_probs)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    unweighted, _ = loss_fn(advantages=adv, **common)
    assert not torch.isclose(weighted, unweighted)
