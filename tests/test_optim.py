"""The optimizer step shared by RL and SFT: accumulation, clipping, the non-finite skip and its streak."""

from __future__ import annotations

import math

import pytest
import torch

from hone.training.optim import NonFiniteGradientError, OptimizerStepper, adamw
from hone.training.policy import Policy
from hone.training.sft import run_sft, sft_loss
from tests.conftest import char_tokenizer, tiny_qwen2


def _stepper(w: torch.nn.Parameter, grad_clip: float | None, limit: int = 2) -> OptimizerStepper:
    optimizer = torch.optim.SGD([w], lr=1.0)
    return OptimizerStepper(
        optimizer, [w], grad_clip=grad_clip, max_nonfinite_steps=limit, limit_key="k", advice="a"
    )


def test_losses_accumulate_then_the_norm_is_clipped_and_stepped() -> None:
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    stepper = _stepper(w, grad_clip=2.5)
    # Gradients 3*[1, 0] + 4*[0, 1] = [3, 4]: norm 5, scaled by clip / (norm + 1e-6) as torch clips.
    norm = stepper.step(iter([3 * w[0], 4 * w[1]]), where="step 1")
    scale = 2.5 / (5.0 + 1e-6)
    assert norm == 5.0
    assert w.tolist() == pytest.approx([1.0 - 3 * scale, 2.0 - 4 * scale], abs=1e-12)
    assert w.grad is None  # freed after the step
    stepper.set_lr(0.5)
    start = w.tolist()
    assert stepper.step(iter([w.sum()]), where="step 2") == pytest.approx(2**0.5)
    assert w.tolist() == pytest.approx([start[0] - 0.5, start[1] - 0.5], abs=1e-12)  # under the clip


def test_a_nonfinite_norm_skips_the_step_and_a_streak_raises_one_line() -> None:
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    stepper = _stepper(w, grad_clip=None, limit=2)
    assert math.isnan(stepper.step(iter([w.sum() * float("nan")]), where="step 1"))
    assert w.tolist() == [1.0, 2.0] and stepper.nonfinite_streak == 1 and w.grad is None
    stepper.step(iter([w.sum()]), where="step 2")  # a finite step ends the streak
    assert stepper.nonfinite_streak == 0 and w.tolist() == [0.0, 1.0]
    stepper.step(iter([w.sum() * float("inf")]), where="step 3")
    one_line = r"^stopped at step 4: the gradient norm was nan on 2 "
    one_line += r"optimizer steps in a row \(k\), none applied; a$"
    with pytest.raises(NonFiniteGradientError, match=one_line):
        stepper.step(iter([w.sum() * float("nan")]), where="step 4")
    assert w.tolist() == [0.0, 1.0]


def test_sft_skips_a_nonfinite_step_and_stops_after_the_streak(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    policy = Policy(tiny_qwen2(), char_tokenizer())
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}

    def nan_loss(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        nll, tokens = sft_loss(*args)
        return nll * float("nan"), tokens

    monkeypatch.setattr("hone.training.sft.sft_loss", nan_loss)
    rows: list[dict[str, float]] = []
    streak = r"SFT step 2: .* 2 optimizer steps in a row \(trainer.max_nonfinite_steps\)"
    with pytest.raises(NonFiniteGradientError, match=streak):
        run_sft(policy, [("a=", "bb")], batch_size=1, max_steps=5, log=rows.append, max_nonfinite_steps=2)
    assert len(rows) == 1 and rows[0]["sft/grad_norm"] != rows[0]["sft/grad_norm"]  # step 1 logged, NaN norm
    assert all(torch.equal(v, before[k]) for k, v in policy.model.state_dict().items())  # nothing applied


def test_fused_adamw_takes_the_multi_tensor_steps_within_rounding_and_can_be_turned_off() -> None:
    """`adamw` picks torch's fused kernel (trainer.fused_adamw) and, with it off, the default path; five
    steps of each from the same start agree to float rounding, and the state dicts have the same keys, so
    a checkpoint of one loads into the other."""
    torch.manual_seed(0)
    start = [torch.randn(7, 5), torch.randn(5)]
    grads = [[torch.randn_like(t) for t in start] for _ in range(5)]
    weights = {}
    states = {}
    for fused in (True, False):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        optimizer = adamw(params, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), fused=fused)
        assert bool(optimizer.defaults["fused"]) is fused
        for step in grads:
            for p, g in zip(params, step, strict=True):
                p.grad = g.clone()
            optimizer.step()
        weights[fused] = [p.detach() for p in params]
        states[fused] = optimizer.state_dict()
    for a, b in zip(weights[True], weights[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        assert not torch.equal(a, start[0] if a.shape == start[0].shape else start[1])  # it moved
    assert states[True]["state"].keys() == states[False]["state"].keys()
    assert states[True]["state"][0].keys() == states[False]["state"][0].keys()
