"""`hone serve tinker`'s built-in losses (hone/tinker/losses.py) against values worked out by hand.

Log-probs are logs of simple probabilities, so each ratio r = p / q is a round number: log(0.5) against
log(0.25) is r = 2, log(0.25) against log(0.5) is r = 0.5, log(0.8) against log(0.1) is r = 8. Each test
checks the per-token loss and its gradient with respect to the log-probs (what reaches the model).
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("tinker")  # hone.tinker.wire reads the SDK's protobuf messages
from hone.tinker.losses import get_loss
from hone.tinker.wire import WireError

LN2 = math.log(2.0)  # 0.693147


def run(
    name: str, lp: list[float], config: dict[str, float | str] | None = None, **inputs: list[float]
) -> tuple[list[float], list[float]]:
    """(per-token loss, d loss.sum() / d logprobs) of loss `name` on log-probs `lp`."""
    logprobs = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    tensors = {k: torch.tensor(v, dtype=torch.float64) for k, v in inputs.items()}
    loss = get_loss(name, config or {})(logprobs, tensors)
    loss.sum().backward()
    assert logprobs.grad is not None
    return loss.detach().tolist(), logprobs.grad.tolist()


LP = [math.log(0.5), math.log(0.25)]  # with Q: r = [2, 0.5]
Q = [math.log(0.25), math.log(0.5)]


def test_ppo_clips_the_ratio_to_its_default_bounds() -> None:
    # A = +1, bounds 0.8 and 1.2. Token 0: r = 2, min(2·1, 1.2·1) = 1.2 (clipped: no gradient).
    # Token 1: r = 0.5, min(0.5, 0.8) = 0.5 (unclipped: d(-r)/dlog p = -r = -0.5).
    loss, grad = run("ppo", LP, logprobs=Q, advantages=[1.0, 1.0])
    assert loss == pytest.approx([-1.2, -0.5]) and grad == pytest.approx([0.0, -0.5])
    # A = -1. Token 0: min(-2, -1.2) = -2 (unclipped: -A·r = 2). Token 1: min(-0.5, -0.8) = -0.8 (clipped).
    loss, grad = run("ppo", LP, logprobs=Q, advantages=[-1.0, -1.0])
    assert loss == pytest.approx([2.0, 0.8]) and grad == pytest.approx([2.0, 0.0])


def test_ppo_bounds_from_config_and_per_token_inputs() -> None:
    # Bounds 0.9 and 3 from the config: token 0's r = 2 is inside now, so -2 with gradient -2.
    config: dict[str, float | str] = {"clip_low_threshold": 0.9, "clip_high_threshold": 3.0}
    loss, grad = run("ppo", LP, config, logprobs=Q, advantages=[1.0, 1.0])
    assert loss == pytest.approx([-2.0, -0.5]) and grad == pytest.approx([-2.0, -0.5])
    # Per-token bounds in the inputs win over the config: token 0 capped at 1.5, token 1 at 3.
    loss, _ = run(
        "ppo", LP, config, logprobs=Q, advantages=[1.0, 1.0],
        clip_low_threshold=[0.5, 0.5], clip_high_threshold=[1.5, 3.0],
    )  # fmt: skip
    assert loss == pytest.approx([-1.5, -0.5])


def test_cispo_weighs_the_log_prob_by_the_clipped_ratio() -> None:
    # Default bounds 0 and 4, A = +1. Token 0: r = 2, -2·log 0.5 = 2 ln 2 = 1.386294, gradient -2.
    # Token 1: r = 0.5, -0.5·log 0.25 = ln 2 = 0.693147, gradient -0.5.
    # Token 2: r = 8 clipped to 4, -4·log 0.8 = 0.892574, gradient -4 (a gradient even where clipped).
    lp, q = [*LP, math.log(0.8)], [*Q, math.log(0.1)]
    loss, grad = run("cispo", lp, logprobs=q, advantages=[1.0, 1.0, 1.0])
    assert loss == pytest.approx([2 * LN2, LN2, 0.892574], abs=1e-6)
    assert grad == pytest.approx([-2.0, -0.5, -4.0])


def test_dro_penalises_the_squared_log_ratio() -> None:
    # β = 0.1, A = +1, token 0: log p = -0.693147, log p - q = ln 2.
    # -(log p · A - β/2 · ln2²) = 0.693147 + 0.05 · 0.480453 = 0.717170;
    # gradient -(A - β · ln 2) = -(1 - 0.0693147) = -0.930685.
    # Token 1, A = -2: log p = log 0.25 = -1.386294, log p - q = -ln 2.
    # -(-1.386294 · -2 - 0.05 · 0.480453) = -2.772589 + 0.024023 = -2.748566;
    # gradient -(-2 + 0.0693147) = 1.930685.
    loss, grad = run("dro", LP, {"beta": 0.1}, logprobs=Q, advantages=[1.0, -2.0])
    assert loss == pytest.approx([0.717170, -2.748566], abs=1e-6)
    assert grad == pytest.approx([-0.930685, 1.930685], abs=1e-6)


def test_gspo_uses_the_sequence_ratio_over_the_masked_tokens() -> None:
    # Token 0 is the prompt's (mask 0, A 0) with log p - q = ln 8; tokens 1 and 2 have log p - q = ln 2.
    # The sequence ratio over the masked tokens is exp(mean(ln 2, ln 2)) = 2 (unmasked it would be
    # exp(5 ln 2 / 3) = 3.17). Default bounds 0.9997 and 1.0004.
    lp = [math.log(0.8), math.log(0.5), math.log(0.5)]
    q = [math.log(0.1), math.log(0.25), math.log(0.25)]
    mask = [0.0, 1.0, 1.0]
    # A = +1: min(2, 1.0004) = 1.0004 on tokens 1 and 2 (clipped: no gradient); token 0 has A = 0.
    loss, grad = run("gspo", lp, logprobs=q, advantages=[0.0, 1.0, 1.0], sequence_ratio_mask=mask)
    assert loss == pytest.approx([0.0, -1.0004, -1.0004]) and grad == pytest.approx([0.0, 0.0, 0.0])
    # A = -1: min(-2, -1.0004) = -2, unclipped: loss 2 per token, and each token's gradient is its own
    # -A · s_t = 2 (the sequence ratio's value, the token's own log-prob's gradient).
    loss, grad = run("gspo", lp, logprobs=q, advantages=[0.0, -1.0, -1.0], sequence_ratio_mask=mask)
    assert loss == pytest.approx([0.0, 2.0, 2.0]) and grad == pytest.approx([0.0, 2.0, 2.0])


def test_importance_sampling_and_cross_entropy() -> None:
    # -r · A = [-2 · 1, -0.5 · 3] = [-2, -1.5]; gradient -r · A as well.
    loss, grad = run("importance_sampling", LP, logprobs=Q, advantages=[1.0, 3.0])
    assert loss == pytest.approx([-2.0, -1.5]) and grad == pytest.approx([-2.0, -1.5])
    # -w · log p = [0, 2 · 1.386294]; gradient -w.
    loss, grad = run("cross_entropy", LP, weights=[0.0, 2.0])
    assert loss == pytest.approx([0.0, 4 * LN2]) and grad == pytest.approx([0.0, -2.0])


RL = {"logprobs": Q, "advantages": [1.0, 1.0]}


@pytest.mark.parametrize(
    ("name", "config", "inputs", "message"),
    [
        ("dro", {}, RL, r"dro needs loss_fn_config\['beta'\]"),
        ("ppo", {}, {"logprobs": Q}, r"ppo needs loss_fn_inputs\['advantages'\]"),
        ("gspo", {}, RL, r"gspo needs loss_fn_inputs\['sequence_ratio_mask'\]"),
        ("gspo", {}, {**RL, "sequence_ratio_mask": [0.0, 0.0]}, "marks no token"),
        ("ppo", {"clip_ratio": 0.2}, RL, r"keys \['clip_ratio'\] are not read by it"),
        ("cispo", {"clip_low_threshold": "x"}, RL, "must be a number"),
        ("ppo", {"clip_low_threshold": 2.0}, RL, "clip_low_threshold is above clip_high_threshold"),
        ("stable_reinforce", {}, {}, "'stable_reinforce' is not served .*not published"),
        ("custom", {}, {}, "use forward_backward_custom"),
    ],
)
def test_refusals_are_one_line(name: str, config: dict, inputs: dict, message: str) -> None:
    with pytest.raises(WireError, match=message) as e:
        run(name, LP, config, **inputs)
    assert "\n" not in str(e.value)
