"""RLTrainer.update: micro-batching is exact, the loss moves the policy the right way."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from hone.config import AlgorithmConfig, TrainerConfig
from hone.orchestration.collate import collate
from hone.training.policy import Policy
from hone.training.trainer import RLTrainer, build_scheduler
from hone.types import Batch, Rollout


def make_batch(policy: Policy) -> Batch:
    g = torch.Generator().manual_seed(0)
    rollouts = []
    for i in range(6):
        prompt = torch.randint(2, 60, (3 + i % 2,), generator=g).tolist()
        response = torch.randint(2, 60, (1 + (5 * i) % 7,), generator=g).tolist()  # uneven lengths
        rollouts.append(
            Rollout("s", i // 3, prompt + response, len(prompt), [1] * len(response), [0.0] * len(response))
        )
    batch = collate(rollouts, pad_id=0)
    with torch.no_grad():
        batch.old_log_probs, _ = policy.token_log_probs(batch.input_ids, batch.attention_mask)
    batch.advantages = torch.linspace(-1, 1, 6).unsqueeze(-1) * batch.response_mask
    return batch


def trained_weights(model_dir: Path, micro: int, agg: str, mini_batches: int = 1) -> dict[str, torch.Tensor]:
    policy = Policy.from_pretrained(model_dir)
    trainer = RLTrainer(
        policy,
        AlgorithmConfig(loss_agg=agg),
        TrainerConfig(lr=1e-2, micro_batch_size=micro, mini_batches=mini_batches),
        total_rl_steps=1,
        temperature=1.0,
        norm_len=8,
    )
    # Plain SGD: the update is linear in the gradient, so this compares gradients (Adam's g/sqrt(v) would
    # amplify float noise on near-zero gradients into full-size steps).
    trainer.optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
    trainer.scheduler = build_scheduler(trainer.optimizer, "constant", 0, 1)
    batch = make_batch(policy)
    trainer.update(batch)
    return {k: v.clone() for k, v in policy.model.state_dict().items()}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_size_does_not_change_the_update(micro_model_dir: Path, agg: str) -> None:
    whole = trained_weights(micro_model_dir, micro=6, agg=agg)
    split = trained_weights(micro_model_dir, micro=1, agg=agg)
    start = Policy.from_pretrained(micro_model_dir).model.state_dict()
    assert any(not torch.equal(whole[k], start[k]) for k in whole)
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], atol=1e-6, rtol=1e-5)


def test_update_raises_log_prob_of_positive_advantage_tokens(micro_model_dir: Path) -> None:
    policy = Policy.from_pretrained(micro_model_dir)
    trainer = RLTrainer(
        policy, AlgorithmConfig(), TrainerConfig(lr=1e-3), total_rl_steps=1, temperature=1.0, norm_len=8
    )
    batch = make_batch(policy)
    before = copy.deepcopy(batch.old_log_probs)
    metrics = trainer.update(batch)
    with torch.no_grad():
        after, _ = policy.token_log_probs(batch.input_ids, batch.attention_mask)
    delta = ((after - before) * batch.response_mask).sum(-1)
    assert delta[-1] > 0 > delta[0]  # advantage +1 row went up, -1 row went down
    assert {"loss/policy", "entropy", "clip_frac", "approx_kl", "grad_norm", "lr"} <= metrics.keys()


def test_scheduler_warmup_then_cosine() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, "cosine", warmup_steps=2, total_steps=6)
    lrs = []
    for _ in range(6):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[:3] == pytest.approx([0.5, 1.0, 1.0]) and lrs[-1] == pytest.approx(
        0.5 * (1 + torch.cos(torch.tensor(0.75 * torch.pi)).item())
    )
