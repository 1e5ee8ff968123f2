"""RLTrainer.update: micro-batching is exact, the loss moves the policy the right way, dropout is off,
non-finite steps are skipped, and the LR schedule runs on RL steps."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from hone.config import AlgorithmConfig, KLConfig, TrainerConfig
from hone.training.optim import RLSchedule, build_scheduler, decay_factor
from hone.training.policy import LoraSettings, Policy
from hone.training.trainer import (
    NonFiniteGradientError,
    RLTrainer,
    micro_batch_rows,
)
from tests.conftest import tiny_qwen2
from tests.helpers import make_batch


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
    batch = make_batch(policy)
    trainer.update(batch, 0)
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
    before = copy.deepcopy(batch.old_logp)
    metrics = trainer.update(batch, 0)
    with torch.no_grad():
        after, _ = policy.token_log_probs(batch.input_ids, batch.attention_mask)
    delta = ((after - before) * batch.loss_mask).sum(-1)
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


def _trainer(policy: Policy, steps: int = 1, **trainer: object) -> RLTrainer:
    cfg = TrainerConfig(**{"lr": 1e-3, **trainer})
    return RLTrainer(policy, AlgorithmConfig(), cfg, total_rl_steps=steps, temperature=1.0, norm_len=8)


@pytest.mark.parametrize("disable", [True, False])
def test_dropout_is_off_so_the_first_update_is_exactly_on_policy(tmp_path: Path, disable: bool) -> None:
    torch.manual_seed(0)
    tiny_qwen2(attention_dropout=0.5, vocab_size=64).save_pretrained(tmp_path / "model")
    policy = Policy.from_pretrained(tmp_path / "model", lora=LoraSettings(r=4, alpha=8, dropout=0.5))
    trainer = _trainer(policy, disable_dropout=disable)
    policy.model.eval()  # old log-probs as the sampler / recomputation scores them
    batch = make_batch(policy)
    metrics = trainer.update(batch, 0)
    if disable:  # ratio exactly 1: nothing clipped, no divergence at the first (pre-step) forward
        assert metrics["clip_frac"] == 0.0 and metrics["approx_kl"] == 0.0
    else:  # the bug: dropout noise alone moves the ratio off 1
        assert metrics["approx_kl"] > 1e-4


def test_nonfinite_gradient_skips_the_step_and_a_streak_stops_the_run(micro_model_dir: Path) -> None:
    policy = Policy.from_pretrained(micro_model_dir)
    trainer = _trainer(policy, steps=10, max_nonfinite_steps=2)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    bad = make_batch(policy)
    row, col = bad.loss_mask.nonzero()[-1]
    bad.advantages[row, col] = float("nan")  # on a trained (masked-in) token
    metrics = trainer.update(bad, 0)
    assert metrics["train/nonfinite_steps"] == 1.0 and "grad_norm" not in metrics
    assert all(torch.equal(v, before[k]) for k, v in policy.model.state_dict().items())
    assert not trainer.optimizer.state  # Adam moments untouched too
    good = make_batch(policy)
    assert trainer.update(good, 1)["train/nonfinite_steps"] == 0.0  # a finite step ends the streak
    trainer.update(bad, 2)
    with pytest.raises(NonFiniteGradientError, match=r"RL step 4: .* 2 optimizer steps in a row"):
        trainer.update(bad, 3)


def test_lr_logged_is_the_lr_applied_and_filtered_steps_still_advance(micro_model_dir: Path) -> None:
    policy = Policy.from_pretrained(micro_model_dir)
    # 8 mini-batches of a 6-row batch: 6 optimizer steps per update, not the 8 an optimizer clock expects.
    trainer = _trainer(policy, steps=4, schedule="cosine", mini_batches=8)
    applied: list[float] = []
    step = trainer.optimizer.step
    trainer.optimizer.step = lambda: applied.append(trainer.optimizer.param_groups[0]["lr"]) or step()
    logged = []
    for rl_step in (0, 2, 3):  # RL step 1 had all its rollouts filtered: no update
        applied.clear()
        logged.append(trainer.update(make_batch(policy), rl_step)["lr"])
        assert applied == [logged[-1]] * 6
    cosine = [1e-3 * decay_factor("cosine", s / 4) for s in (0, 2, 3)]
    assert logged == pytest.approx(cosine, rel=1e-12)
    assert trainer.schedule.factor(4) == pytest.approx(0.0, abs=1e-15)  # the end, at run.steps


def test_schedule_warmup_in_rl_steps_and_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    sched = RLSchedule("linear", warmup_steps=2, total_steps=12)
    assert [sched.factor(s) for s in (0, 1, 2, 7)] == pytest.approx([0.5, 1.0, 1.0, 0.5])
    now = [100.0]
    monkeypatch.setattr("hone.training.optim.time.perf_counter", lambda: now[0])
    timed = RLSchedule("linear", warmup_steps=0, total_steps=100)
    timed.start_clock(50.0)
    now[0] = 125.0  # half the time budget spent at step 10: time wins
    assert timed.factor(10) == pytest.approx(0.5)
    # Resumed in a new session with a fresh 10 s budget: the rest of the decay maps onto it.
    resumed = RLSchedule("linear", warmup_steps=0, total_steps=100)
    resumed.progress = timed.progress
    resumed.start_clock(10.0)
    now[0] = 130.0  # half of the new budget: half of the remaining half
    assert resumed.factor(11) == pytest.approx(0.25)
    assert RLSchedule("linear", 0, 100).factor(10) == pytest.approx(0.9)  # no clock: steps alone


def test_micro_batch_rows_caps_padded_tokens() -> None:
    cfg = TrainerConfig(micro_batch_size=256, micro_batch_tokens=8192)
    assert micro_batch_rows(cfg, 30) == 256  # short sequences: the row cap
    assert micro_batch_rows(cfg, 1000) == 8  # long ones: 8 x 1000 <= 8192 tokens of logits
    assert micro_batch_rows(cfg, 20_000) == 1  # never zero rows


def test_metrics_count_only_the_optimizer_steps_applied(micro_model_dir: Path) -> None:
    policy = Policy.from_pretrained(micro_model_dir)
    trainer = _trainer(policy, steps=10, mini_batches=6, max_nonfinite_steps=10)  # one row per step
    bad = make_batch(policy)
    row, col = bad.loss_mask.nonzero()[-1]
    bad.advantages[row, col] = float("nan")  # one of the six optimizer steps is skipped
    metrics = trainer.update(bad, 0)
    assert metrics["train/nonfinite_steps"] == 1.0
    assert all(math.isfinite(v) for v in metrics.values()), metrics  # no NaN loss from the skipped one
    assert metrics["lr"] == 1e-3
    bad = dataclasses.replace(
        bad, advantages=bad.advantages * float("nan")
    )  # every step skipped: no loss, no LR was applied
    metrics = trainer.update(bad, 1)
    assert metrics["train/nonfinite_steps"] == 6.0
    assert not {"lr", "loss/policy", "loss/total", "entropy", "clip_frac", "grad_norm"} & metrics.keys()


def test_a_constant_schedule_never_reads_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_clock() -> float:
        raise AssertionError("a constant schedule read the clock")

    monkeypatch.setattr("hone.training.optim.time.perf_counter", no_clock)
    sched = RLSchedule("constant", warmup_steps=2, total_steps=10)
    sched.start_clock(5.0)  # a run with run.time_limit_s
    assert [sched.factor(s) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]
    assert sched.progress == 7 / 8  # by steps alone: what a checkpoint records, the same on any machine


def test_the_loss_is_the_sum_of_its_named_terms(micro_model_dir: Path) -> None:
    policy = Policy.from_pretrained(micro_model_dir)
    algo = AlgorithmConfig(kl=KLConfig(coef=0.5), entropy_coef=0.25)
    trainer = RLTrainer(policy, algo, TrainerConfig(lr=1e-3), total_rl_steps=1, temperature=1.0, norm_len=8)
    batch = make_batch(policy)
    # a reference off the policy, so the KL term is not 0
    batch = dataclasses.replace(batch, ref_logp=batch.old_logp - 0.3 * batch.loss_mask)
    metrics = trainer.update(batch, 0)  # one optimizer step, one micro-batch, token-mean everywhere
    assert metrics["kl"] > 0.01 and metrics["entropy"] > 0.01
    # loss = policy + kl.coef x KL - entropy_coef x entropy; the metrics are the same token means summed
    # in another order (~30 fp32 terms: <= 1e-6 relative).
    expected = metrics["loss/policy"] + 0.5 * metrics["kl"] - 0.25 * metrics["entropy"]
    assert metrics["loss/total"] == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_bf16_autocast_update_matches_fp32_within_bf16_rounding_and_keeps_fp32_weights(
    micro_model_dir: Path,
) -> None:
    """`trainer.autocast: bfloat16` changes the matmuls' precision, not the update: the SGD step (linear in
    the gradient) lands within bf16 rounding of the fp32 one, yet not on it (autocast did engage), and the
    weights, their gradients and the returned log-prob gap stay fp32."""

    def step(autocast: str) -> tuple[dict[str, torch.Tensor], dict[str, float], Policy]:
        policy = Policy.from_pretrained(micro_model_dir)
        trainer = RLTrainer(
            policy,
            AlgorithmConfig(),
            TrainerConfig(lr=1e-2, autocast=autocast),  # type: ignore[arg-type]
            total_rl_steps=1,
            temperature=1.0,
            norm_len=8,
        )
        trainer.optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
        metrics = trainer.update(make_batch(policy), 0)
        return {k: v.clone() for k, v in policy.model.state_dict().items()}, metrics, policy

    start = Policy.from_pretrained(micro_model_dir).model.state_dict()
    full, full_metrics, _ = step("none")
    half, half_metrics, policy = step("bfloat16")
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    moved = {k: full[k] - start[k] for k in full}
    moved_bf16 = {k: half[k] - start[k] for k in half}
    assert any(not torch.equal(moved[k], moved_bf16[k]) for k in moved)  # bf16 matmuls did run
    update = torch.cat([v.flatten() for v in moved.values()])
    update_bf16 = torch.cat([v.flatten() for v in moved_bf16.values()])
    cosine = torch.nn.functional.cosine_similarity(update, update_bf16, dim=0)
    assert cosine > 0.99 and (update_bf16.norm() / update.norm() - 1).abs() < 0.05
    # fp32 recomputation equals the sampler's log-probs here; bf16's is off by bf16 rounding only
    assert full_metrics["mismatch/logprob_abs"] < 1e-5 < half_metrics["mismatch/logprob_abs"] < 0.05


def test_recomputed_old_log_probs_use_the_updates_autocast(tmp_path: Path, micro_model_dir: Path) -> None:
    """With `trainer.autocast: bfloat16` and `old_log_probs: recompute`, π_old is computed in the update's
    precision: before the (single) optimizer step the ratio is exactly 1 (approx_kl 0), while the fp32
    sampler's log-probs differ from it by bf16 rounding (the mismatch metric sees it)."""
    import json

    from tests.helpers import train_tiny

    settings = {"trainer.autocast": "bfloat16", "algorithm.old_log_probs": "recompute"}
    run = train_tiny(tmp_path, micro_model_dir, "autocast", **settings)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]
    assert len(rows) == 3
    assert all(r["approx_kl"] == 0.0 and r["mismatch/logprob_abs"] > 0 for r in rows)
