"""SFT: prompt masking, token boundaries, accumulation and that a tiny model actually learns."""

from __future__ import annotations

import time

import pytest
import torch

from hone.training.policy import Policy
from hone.training.sft import collate_sft, encode_pair, run_sft, sft_loss
from tests.conftest import LETTERS, char_tokenizer, tiny_qwen2

PAIRS = [(f"{c}=", LETTERS[(i + 1) % 26] * 2) for i, c in enumerate(LETTERS[:8])]  # "a=" -> "bb"


@pytest.fixture
def policy() -> Policy:
    torch.manual_seed(0)
    return Policy(tiny_qwen2(), char_tokenizer())


def _exact_match(policy: Policy) -> float:
    """Teacher-forced greedy accuracy: every response token (and the eos) is the argmax."""
    assert policy.tokenizer is not None
    encoded = [encode_pair(policy.tokenizer, p, r) for p, r in PAIRS]
    ids, mask, loss_mask = collate_sft(encoded, pad_id=0)
    with torch.no_grad():
        predicted = policy.model(input_ids=ids, attention_mask=mask).logits[:, :-1].argmax(-1)
    hit = (predicted == ids[:, 1:]) | (loss_mask == 0)
    return hit.all(-1).float().mean().item()


def test_encode_and_collate_mask_exactly_response_and_eos(policy: Policy) -> None:
    assert policy.tokenizer is not None
    ids, prompt_len = encode_pair(policy.tokenizer, "ab=", "cd")
    assert ids == [3, 4, 29, 5, 6, 1] and prompt_len == 3
    input_ids, attention_mask, loss_mask = collate_sft([(ids, prompt_len), ([7, 8, 9], 1)], pad_id=0)
    assert input_ids.tolist() == [[3, 4, 29, 5, 6, 1], [7, 8, 9, 0, 0, 0]]
    assert attention_mask.tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]
    # Column t scores token t+1: row 0 trains on "c", "d", eos; row 1 on 8, 9.
    assert loss_mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 0, 0, 0]]
    with pytest.raises(ValueError):
        collate_sft([([1, 2], 2)], pad_id=0)


def test_prompt_and_padding_positions_get_zero_gradient(policy: Policy) -> None:
    assert policy.tokenizer is not None
    batch = [encode_pair(policy.tokenizer, "abc=", "de"), encode_pair(policy.tokenizer, "f=", "g")]
    input_ids, attention_mask, loss_mask = collate_sft(batch, pad_id=0)
    captured: list[torch.Tensor] = []

    def keep_logits(_module: torch.nn.Module, _inputs: object, logits: torch.Tensor) -> None:
        logits.retain_grad()
        captured.append(logits)

    handle = policy.model.lm_head.register_forward_hook(keep_logits)
    nll, tokens = sft_loss(policy, input_ids, attention_mask, loss_mask)
    handle.remove()
    nll.backward()
    grad_per_position = captured[0].grad.abs().sum(-1)[:, :-1]  # [B, L-1], column t predicts token t+1
    assert tokens.item() == 3 + 2
    assert bool((grad_per_position[loss_mask == 0] == 0).all())
    assert bool((grad_per_position[loss_mask == 1] > 0).all())
    # The loss is exactly the masked response NLL, nothing from prompt or padding columns.
    with torch.no_grad():
        lp, _ = policy.token_log_probs(input_ids, attention_mask)
    assert nll.item() == pytest.approx(-(lp * loss_mask).sum().item(), rel=1e-6)


def test_micro_batching_matches_full_batch() -> None:
    results = []
    for micro in (None, 3):
        torch.manual_seed(0)
        pol = Policy(tiny_qwen2(), char_tokenizer())
        run_sft(pol, PAIRS, batch_size=8, micro_batch_size=micro, lr=1e-3, max_steps=2, seed=1)
        results.append(pol.model.state_dict())
    for key, value in results[0].items():
        torch.testing.assert_close(value, results[1][key], rtol=1e-4, atol=1e-5)


def test_tiny_model_learns_mapping_and_stops_on_eval(policy: Policy) -> None:
    rows: list[dict[str, float]] = []
    assert _exact_match(policy) == 0.0
    result = run_sft(
        policy,
        PAIRS,
        batch_size=8,
        lr=1e-2,
        warmup_steps=3,
        max_steps=80,
        eval_fn=lambda: _exact_match(policy),
        eval_every=5,
        stop_at=1.0,
        log=rows.append,
        seed=0,
    )
    assert result["stopped_early"] and result["eval"] == 1.0 and result["steps"] < 80
    assert result["steps"] % 5 == 0
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    assert losses[-1] < 0.2 * losses[0]
    assert [r["step"] for r in rows if "sft/eval" in r] == list(range(5, result["steps"] + 1, 5))
    assert not policy.model.training  # mode restored


def test_sft_stops_at_the_deadline_of_the_runs_time_budget(policy: Policy) -> None:
    result = run_sft(policy, PAIRS, batch_size=4, max_steps=50, deadline=time.perf_counter() - 1)
    assert result["steps"] == 1 and result["out_of_time"] is True


def test_token_mask_examples_train_only_where_the_mask_is_one() -> None:
    ids, mask = [5, 6, 7, 8, 9], [0, 1, 0, 1, 1]  # prompt, assistant, observation, assistant, eos
    _, _, loss_mask = collate_sft([(ids, mask)], pad_id=0)
    assert loss_mask.tolist() == [[1.0, 0.0, 1.0, 1.0]]  # column t scores token t+1
    with pytest.raises(ValueError, match="one 0/1 per token"):
        collate_sft([(ids, [1, 1, 1, 1, 1])], pad_id=0)
