"""Supervised fine-tuning on (prompt, response) pairs, the warm start before RL.

The loss covers only response tokens (plus the final eos, so the model learns to stop); prompts are
context. Prompt and response are tokenised separately and their ids concatenated, so the boundary is
exactly where the prompt ends, as at sampling time when the sampler continues the prompt's ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from hone.models.tokens import pad_token_id
from hone.training.optim import adamw_stepper, epoch_batches
from hone.training.policy import Policy
from hone.training.trainer import build_scheduler


def encode_pair(tokenizer: PreTrainedTokenizerBase, prompt: str, response: str) -> tuple[list[int], int]:
    """Token ids of prompt + response + eos, and the prompt length.

    The prompt gets the tokenizer's usual special tokens (e.g. a BOS), as when it is sampled from; the
    response gets none except the closing eos.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("SFT needs a tokenizer with an eos token so the model learns to stop")
    prompt_ids = tokenizer(prompt).input_ids
    response_ids = tokenizer(response, add_special_tokens=False).input_ids
    return [*prompt_ids, *response_ids, tokenizer.eos_token_id], len(prompt_ids)


def collate_sft(
    examples: Sequence[tuple[list[int], int | list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad encoded examples into `input_ids`, `attention_mask` `[B, L]` and a loss mask `[B, L-1]`.

    An example is `(ids, prompt_len)` — train on every token from `prompt_len` on (response and eos) —
    or `(ids, token_mask)` with a 0/1 per token (multi-turn demonstrations: observations are 0).
    Loss-mask column `t` scores token `t+1` (the `Batch` convention).
    """
    length = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(examples), length, dtype=torch.long)
    loss_mask = torch.zeros(len(examples), length - 1)
    for row, (ids, trained) in enumerate(examples):
        if isinstance(trained, int):
            if not 0 < trained < len(ids):
                raise ValueError(
                    f"need a non-empty prompt and response, got prompt_len={trained}, len={len(ids)}"
                )
            trained = [0] * trained + [1] * (len(ids) - trained)
        if len(trained) != len(ids) or trained[0] or not any(trained):
            raise ValueError(
                "a token mask needs one 0/1 per token, a prompt first, and something to train on"
            )
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        loss_mask[row, : len(ids) - 1] = torch.tensor(trained[1:], dtype=torch.float32)
    return input_ids, attention_mask, loss_mask


def sft_loss(
    policy: Policy, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed response-token NLL and the number of response tokens (divide once per optimizer step)."""
    log_probs, _ = policy.token_log_probs(input_ids, attention_mask)
    loss_mask = loss_mask.to(log_probs.device)
    return -(log_probs * loss_mask).sum(), loss_mask.sum()


def run_sft(
    policy: Policy,
    pairs: Sequence[tuple[str, str]] = (),
    *,
    examples: Sequence[tuple[list[int], list[int]]] = (),
    batch_size: int = 8,
    micro_batch_size: int | None = None,
    lr: float = 1e-4,
    weight_decay: float = 0.0,
    warmup_steps: int = 0,
    schedule: str = "cosine",
    grad_clip: float | None = 1.0,
    max_steps: int = 100,
    eval_fn: Callable[[], float] | None = None,
    eval_every: int = 10,
    stop_at: float | None = None,
    log: Callable[[dict[str, float]], None] | None = None,
    seed: int = 0,
    deadline: float | None = None,
    max_nonfinite_steps: int = 3,
) -> dict[str, Any]:
    """Fine-tune `policy` in place on `pairs` (text) and/or `examples` (token ids with a 0/1 train mask
    per token, e.g. multi-turn demonstrations) for up to `max_steps` optimizer steps.

    The learning rate warms up linearly over `warmup_steps`, then follows `schedule` (the RL trainer's
    `build_scheduler`: "cosine", "linear" or "constant") over `max_steps`.

    Each step takes `batch_size` pairs (reshuffled every epoch with `seed`), accumulating gradients over
    `micro_batch_size` chunks; the loss is the mean NLL over all response tokens of the batch. The optimizer
    step is RL's (`hone.training.optim`): a step with a non-finite gradient norm is skipped (the LR schedule
    still advances) and `max_nonfinite_steps` of them in a row raise `NonFiniteGradientError`. Every
    `eval_every` steps and after the last, `eval_fn()` is called (the model in eval mode) and training
    stops once it reaches `stop_at`. `deadline` (a `time.perf_counter()` value) is checked before every
    step and every evaluation: past it, training stops at once (result `"out_of_time": True`), so it
    overruns the deadline by at most one step or one evaluation. `log` receives `{"step", "sft/loss",
    "sft/lr", "sft/grad_norm", "sft/tokens"}` per step and `{"step", "sft/eval"}` per evaluation.
    Returns `{"steps", "loss", "eval", "stopped_early", "out_of_time"}` (`eval`: the last score, or None).
    """
    if policy.tokenizer is None:
        raise ValueError("run_sft needs a policy with a tokenizer")
    if not pairs and not examples:
        raise ValueError("run_sft needs at least one (prompt, response) pair or tokenised example")
    tokenizer = policy.tokenizer
    pad_id = pad_token_id(tokenizer)
    encoded: list[tuple[list[int], int | list[int]]] = [encode_pair(tokenizer, p, r) for p, r in pairs]
    encoded += list(examples)
    params = policy.trainable_parameters()
    optimizer, stepper = adamw_stepper(
        params,
        lr=lr,
        weight_decay=weight_decay,
        grad_clip=grad_clip,
        max_nonfinite_steps=max_nonfinite_steps,
        advice="look for NaN/inf in the demonstrations, or lower sft.lr",
    )
    scheduler = build_scheduler(optimizer, schedule, warmup_steps, max_steps)
    batches = epoch_batches(len(encoded), batch_size, seed)
    was_training = policy.model.training
    result: dict[str, Any] = {
        "steps": 0,
        "loss": float("nan"),
        "eval": None,
        "stopped_early": False,
        "out_of_time": False,
    }

    def out_of_time() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    policy.model.train()
    try:
        for step in range(1, max_steps + 1):
            if out_of_time():
                result["out_of_time"] = True
                break
            batch = [encoded[i] for i in next(batches)]
            lr_now = scheduler.get_last_lr()[0]
            nlls: list[float] = []
            losses = _batch_losses(policy, batch, pad_id, micro_batch_size, nlls)
            grad_norm = stepper.step(losses, where=f"SFT step {step}")
            scheduler.step()  # a skipped step still counts: the schedule runs on steps taken, as RL's does
            tokens = float(_response_tokens(batch))
            loss = sum(nlls) / tokens
            result.update(steps=step, loss=loss)
            if log is not None:
                log(
                    {
                        "step": step,
                        "sft/loss": loss,
                        "sft/lr": lr_now,
                        "sft/grad_norm": grad_norm,
                        "sft/tokens": tokens,
                    }
                )
            if out_of_time():  # no validation either: it can cost as much as many steps
                result["out_of_time"] = True
                break
            if eval_fn is not None and (step % eval_every == 0 or step == max_steps):
                policy.model.eval()
                result["eval"] = score = float(eval_fn())
                policy.model.train()
                if log is not None:
                    log({"step": step, "sft/eval": score})
                if stop_at is not None and score >= stop_at:
                    result["stopped_early"] = step < max_steps
                    break
    finally:
        policy.model.train(was_training)
    return result


def _response_tokens(batch: Sequence[tuple[list[int], int | list[int]]]) -> int:
    """Trained tokens of the encoded examples (response and eos, or the 1s of a token mask but the first)."""
    return sum(len(ids) - trained if isinstance(trained, int) else sum(trained[1:]) for ids, trained in batch)


def _batch_losses(
    policy: Policy,
    batch: list[tuple[list[int], int | list[int]]],
    pad_id: int,
    micro_batch_size: int | None,
    nlls: list[float],
) -> Iterator[torch.Tensor]:
    """Each micro-batch's summed response-token NLL divided by the whole batch's token count, so the losses
    sum to the batch's token-mean NLL whatever the micro-batch size; one forward at a time (lazily, for
    `OptimizerStepper.step`). Each summed NLL is appended to `nlls`, for the logged loss."""
    chunk = micro_batch_size or len(batch)
    total_tokens = _response_tokens(batch)
    for start in range(0, len(batch), chunk):
        input_ids, attention_mask, loss_mask = collate_sft(batch[start : start + chunk], pad_id)
        nll, _ = sft_loss(policy, input_ids, attention_mask, loss_mask)
        nlls.append(nll.item())
        yield nll / total_tokens
