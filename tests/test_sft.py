"""SFT: prompt masking, token boundaries, accumulation, the deadline, held-out validation, learning."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hone.config import HoneConfig, load_config
from hone.data.splits import held_out_samples, problem_key
from hone.envs import make_env
from hone.rl import warmstart
from hone.rl.evaluate import evaluate
from hone.rl.loop import train
from hone.training import fit as fit_module
from hone.training import sft as sft_module
from hone.training.policy import Policy
from hone.training.sft import _batch_losses, _response_tokens, collate_sft, encode_pair, run_sft, sft_loss
from hone.types import Sample
from tests.conftest import LETTERS, char_tokenizer, tiny_qwen2
from tests.helpers import run_splits, run_validation, tiny_overrides

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
    policy.model.double()  # the loss is compared with a second (no-grad) forward: see the end
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
    # [B, L-1]: the model returns only the positions that score a token; column t predicts token t+1.
    grad_per_position = captured[0].grad.abs().sum(-1)
    assert tokens.item() == 3 + 2
    assert bool((grad_per_position[loss_mask == 0] == 0).all())
    assert bool((grad_per_position[loss_mask == 1] > 0).all())
    # The loss is exactly the masked response NLL, nothing from prompt or padding columns.
    with torch.no_grad():
        lp, _ = policy.token_log_probs(input_ids, attention_mask)
    # Float64 forwards agree to ~1e-15, so both round to the same fp32 log-probs; then 5-term fp32 sums:
    # <= 5 * eps32 = 6e-7 relative.
    assert nll.item() == pytest.approx(-(lp * loss_mask).sum().item(), rel=1e-6)


def test_micro_batched_step_has_the_full_batch_loss_and_gradient_in_float64() -> None:
    # Responses of 1..4 tokens: a per-micro-batch mean (instead of one global token count) would weight
    # the chunks differently and move the gradient by tens of percent.
    pairs = [(f"{c}=", LETTERS[i % 26] * (1 + i % 4)) for i, c in enumerate(LETTERS[:8])]
    torch.manual_seed(0)
    pol = Policy(tiny_qwen2(train_mode=True).double(), char_tokenizer())
    assert pol.tokenizer is not None
    batch = [encode_pair(pol.tokenizer, p, r) for p, r in pairs]
    params = pol.trainable_parameters()
    runs = []
    for micro in (None, 3):  # 3 + 3 + 2 rows: uneven chunks with different token counts
        stats: list[dict[str, float]] = []
        for loss in _batch_losses(pol, batch, 0, micro, stats):
            loss.backward()
        tokens = float(_response_tokens(batch))
        runs.append((sum(s["nll"] for s in stats) / tokens, tokens, [p.grad.clone() for p in params]))
        pol.model.zero_grad(set_to_none=True)
    (full_loss, full_tokens, full_grads), (micro_loss, micro_tokens, micro_grads) = runs
    ids, mask, loss_mask = collate_sft(batch, pad_id=0)
    with torch.no_grad():
        lp, _ = pol.token_log_probs(ids, mask)
    assert full_tokens == micro_tokens == loss_mask.sum().item() == sum(len(r) + 1 for _, r in pairs)
    # The reported loss sums ~30 fp32 log-probs (`Policy._score` works in fp32) in another order:
    # |error| <= 30 * 6e-8 = 2e-6 relative.
    assert full_loss == pytest.approx(-(lp * loss_mask).sum().item() / full_tokens, rel=1e-5)
    assert micro_loss == pytest.approx(full_loss, rel=1e-5)
    # Float64 weights: the passes differ only by float64 summation order (~1e-16); both round their
    # logits to the same fp32 values, so the gradients agree far inside these bounds (measured 1e-16 abs).
    for full, micro in zip(full_grads, micro_grads, strict=True):
        torch.testing.assert_close(micro, full, rtol=1e-9, atol=1e-12)


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


def test_the_deadline_is_checked_before_every_step_and_every_evaluation(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]  # a fake clock: a step (its one forward) takes 1 s, an evaluation 0.1 s
    monkeypatch.setattr(fit_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    evaluated: list[float] = []
    forward = policy.token_log_probs

    def timed_forward(*args: Any, **kwargs: Any) -> Any:
        now[0] += 1.0
        return forward(*args, **kwargs)

    monkeypatch.setattr(policy, "token_log_probs", timed_forward)

    def evaluate() -> float:
        evaluated.append(now[0])
        now[0] += 0.1
        return 0.0

    result = run_sft(policy, PAIRS, batch_size=4, max_steps=50, eval_fn=evaluate, eval_every=1, deadline=2.5)
    # Steps 1 and 2 end at 1.0 and 2.1 s and are evaluated; step 3 starts at 2.2 s (in time) and ends at
    # 3.2 s, past the deadline: no evaluation after it, no step 4.
    assert result["steps"] == 3 and result["out_of_time"] is True and not result["stopped_early"]
    assert evaluated == pytest.approx([1.0, 2.1])
    now[0] = 0.0
    assert run_sft(policy, PAIRS, batch_size=4, max_steps=50, deadline=-1.0)["steps"] == 0


def _sft_run(tmp_path: Path, model_dir: Path, name: str, **extra: object) -> HoneConfig:
    overrides = {
        "run.steps": 0,
        "sft.enabled": "true",
        "sft.examples": 32,
        "sft.batch_size": 8,
        "sft.val_size": 6,
        "sft.eval_every": 2,
        "sft.max_steps": 2,
        "rollout.max_new_tokens": 4,
        **extra,
    }
    return load_config(None, tiny_overrides(tmp_path, model_dir, name, **overrides))


def test_train_ends_sft_at_the_runs_time_limit(tmp_path: Path, micro_model_dir: Path) -> None:
    # The budget is spent by set-up already (it starts with `train`), so SFT takes no step at all.
    cfg = _sft_run(tmp_path, micro_model_dir, "late", **{"run.time_limit_s": 1e-3, "sft.max_steps": 40})
    result = train(cfg)
    assert (result.run_dir / "sft" / "sft_log.jsonl").read_text() == ""


def test_train_validates_sft_on_held_out_problems_in_micro_batches(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    validated: list[list[Sample]] = []
    rows_per_forward: list[int] = []

    def spy_evaluate(sampler: Any, tokenizer: Any, samples: list[Sample], *args: Any, **kw: Any) -> Any:
        validated.append(samples)
        return evaluate(sampler, tokenizer, samples, *args, **kw)

    def spy_loss(policy: Policy, input_ids: torch.Tensor, *args: Any) -> Any:
        rows_per_forward.append(input_ids.shape[0])
        return sft_loss(policy, input_ids, *args)

    monkeypatch.setattr(warmstart, "evaluate", spy_evaluate)
    monkeypatch.setattr(sft_module, "sft_loss", spy_loss)
    cfg = _sft_run(tmp_path, micro_model_dir, "held-out", **{"sft.micro_batch_size": 3})
    train(cfg)
    assert rows_per_forward == [3, 3, 2, 3, 3, 2]  # 2 steps of 8 rows, micro-batches of 3
    task, train_set, eval_set = run_splits(cfg)
    assert task is not None and len(validated) == 1 and len(validated[0]) == 6
    val = validated[0]
    assert all(task.is_eval(s) for s in val)  # the hash split: never an RL training prompt
    keys = {problem_key(s) for s in val}
    assert not keys & {problem_key(s) for s in train_set + eval_set}


def test_validation_for_games_and_datasets(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    game = {"data.task": "null", "env.name": "arithmetic_retry", "env.args": "{pad: true}"}
    cfg = load_config(None, [f"{k}={v}" for k, v in {**game, "data.eval_size": 20}.items()])
    task, train_set, eval_set = run_splits(cfg, make_env(cfg.env.name, cfg.env.args))
    val = run_validation(cfg, task, make_env(cfg.env.name, cfg.env.args), train_set, eval_set)
    assert len(val) == cfg.sft.val_size
    assert not {problem_key(s) for s in val} & {problem_key(s) for s in train_set + eval_set}
    # A dataset validates on the eval file's rows after the eval set's.
    rows = tmp_path / "eval.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(10)))
    dataset = {"data.task": "null", "data.source": str(rows), "data.eval_source": str(rows)}
    cfg = load_config(None, [f"{k}={v}" for k, v in {**dataset, "data.eval_size": 4}.items()])
    eval_set = held_out_samples(cfg.data, None, 4)
    val = run_validation(cfg, None, None, [], eval_set)
    assert [s.prompt for s in val] == ["q4", "q5", "q6", "q7", "q8", "q9"]
    # Guess-the-number's held-out split (a quarter of 1..8) is all in the eval set: say so, use it.
    game = {"data.task": "null", "env.name": "guess_number", "env.args": "{high: 8}"}
    cfg = load_config(None, [f"{k}={v}" for k, v in {**game, "data.eval_size": 16}.items()])
    env = make_env(cfg.env.name, cfg.env.args)
    _, train_set, eval_set = run_splits(cfg, env)
    with caplog.at_level(logging.WARNING, logger="hone"):
        val = run_validation(cfg, None, env, train_set, eval_set)
    assert "validating on eval problems" in caplog.text
    assert {s.answer for s in val} <= {s.answer for s in eval_set}


def test_validation_takes_what_a_small_task_split_has(caplog: pytest.LogCaptureFixture) -> None:
    # One-digit sums: 55 problems (a+b = b+a), 6 of them in the eval split. Validation asks for
    # eval_size + val_size of them and takes what there is; only a short eval set is an error.
    one_digit = ["data.task=arithmetic", "data.task_args={min_digits: 1, max_digits: 1}", "sft.val_size=50"]

    def held_out(eval_size: int) -> tuple[list[Sample], list[Sample]]:
        cfg = load_config(None, [*one_digit, f"data.eval_size={eval_size}"])
        task, train_set, eval_set = run_splits(cfg)
        with caplog.at_level(logging.WARNING, logger="hone"):
            return eval_set, run_validation(cfg, task, None, train_set, eval_set)

    eval_set, val = held_out(4)
    assert len(val) == 2 and not {problem_key(s) for s in val} & {problem_key(s) for s in eval_set}
    assert "only 2 problems beyond the eval set's 4" in caplog.text
    caplog.clear()
    eval_set, val = held_out(6)  # the whole split is the eval set: validate on it, as a game does
    assert "validating on eval problems" in caplog.text and val == eval_set
    with pytest.raises(ValueError, match="found only 6 distinct eval problems of 7"):
        held_out(7)


def test_token_mask_examples_train_only_where_the_mask_is_one() -> None:
    ids, mask = [5, 6, 7, 8, 9], [0, 1, 0, 1, 1]  # prompt, assistant, observation, assistant, eos
    _, _, loss_mask = collate_sft([(ids, mask)], pad_id=0)
    assert loss_mask.tolist() == [[1.0, 0.0, 1.0, 1.0]]  # column t scores token t+1
    with pytest.raises(ValueError, match="one 0/1 per token"):
        collate_sft([(ids, [1, 1, 1, 1, 1])], pad_id=0)
