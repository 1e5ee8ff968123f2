"""Supervised fine-tuning on (prompt, response) pairs, the warm start before RL.

The loss covers only response tokens (plus the final eos, so the model learns to stop); prompts are
context. Prompt and response are tokenised separately and their ids concatenated, so the boundary is
exactly where the prompt ends, as at sampling time when the sampler continues the prompt's ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from hone.models.tokens import pad_token_id
from hone.training.distributed import ONE_RANK, Ranks
from hone.training.fit import FitPlan, FitSaves, Stats, fit
from hone.training.policy import Policy
from hone.types import VisionBatch, VisionInputs

Encoded = tuple[list[int], int | list[int]]  # (ids, prompt length) or (ids, a 0/1 train mask per token)


@dataclass(frozen=True)
class ImageExample:
    """A demonstration whose prompt has images: `ids` (image placeholders expanded), what is trained
    (the prompt length, or a mask as `collate_sft`'s), and the images' `vision` inputs."""

    ids: list[int]
    trained: int | list[int]
    vision: VisionInputs

    def encoded(self) -> Encoded:
        return self.ids, self.trained


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
    policy: Policy,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    vision: VisionBatch | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed response-token NLL and the number of response tokens (divide once per optimizer step)."""
    log_probs, _ = policy.token_log_probs(input_ids, attention_mask, vision=vision)
    loss_mask = loss_mask.to(log_probs.device)
    return -(log_probs * loss_mask).sum(), loss_mask.sum()


def run_sft(
    policy: Policy,
    pairs: Sequence[tuple[str, str]] = (),
    *,
    examples: Sequence[tuple[list[int], list[int]] | ImageExample] = (),
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
    ranks: Ranks = ONE_RANK,
    saves: FitSaves | None = None,
) -> dict[str, Any]:
    """Fine-tune `policy` in place on `pairs` (text) and/or `examples` (token ids with a 0/1 train mask
    per token, e.g. multi-turn demonstrations; or `ImageExample`s, prompts with images) for up to
    `max_steps` optimizer steps of the offline loop (`hone.training.fit`).

    The learning rate warms up linearly over `warmup_steps`, then follows `schedule` ("cosine", "linear"
    or "constant") over `max_steps`. Each step takes `batch_size` pairs (reshuffled every epoch with
    `seed`), accumulating gradients over `micro_batch_size` chunks; the loss is the mean NLL over all
    response tokens of the batch. A step with a non-finite gradient norm is skipped and
    `max_nonfinite_steps` of them in a row raise `NonFiniteGradientError`. Every `eval_every` steps and
    after the last, `eval_fn()` is called (the model in eval mode) and training stops once it reaches
    `stop_at`. Past `deadline` (a `time.perf_counter()` value) training stops at once (result
    `"out_of_time": True`). `log` receives `{"step", "sft/loss", "sft/lr", "sft/grad_norm", "sft/tokens"}`
    per step and `{"step", "sft/eval"}` per evaluation.
    Returns `{"steps", "loss", "eval", "stopped_early", "out_of_time"}` (`eval`: the last score, or None).
    On N learner `ranks` every rank calls this on the same examples, `policy` sharded: each trains its share
    of every batch, and `eval_fn` must return the same score on every rank. `saves`: checkpoints and a
    resume (`FitSaves`).
    """
    if policy.tokenizer is None:
        raise ValueError("run_sft needs a policy with a tokenizer")
    if not pairs and not examples:
        raise ValueError("run_sft needs at least one (prompt, response) pair or tokenised example")
    tokenizer = policy.tokenizer
    pad_id = pad_token_id(tokenizer)
    encoded: list[Encoded] = [encode_pair(tokenizer, p, r) for p, r in pairs]
    encoded += [e.encoded() if isinstance(e, ImageExample) else e for e in examples]
    visions = [None] * len(pairs) + [e.vision if isinstance(e, ImageExample) else None for e in examples]
    scores: list[float] = []

    def losses(indices: list[int], stats: Stats) -> Iterator[torch.Tensor]:
        batch, images = [encoded[i] for i in indices], [visions[i] for i in indices]
        return _batch_losses(policy, batch, pad_id, micro_batch_size, stats, ranks, images)

    def metrics(indices: list[int], stats: Stats, lr_now: float, grad_norm: float) -> dict[str, float]:
        tokens = float(_response_tokens([encoded[i] for i in indices]))
        loss = sum(s["nll"] for s in stats) / tokens
        return {"sft/loss": loss, "sft/lr": lr_now, "sft/grad_norm": grad_norm, "sft/tokens": tokens}

    def evaluate(step: int, row: dict[str, float]) -> tuple[dict[str, float], bool]:
        if eval_fn is None or not (step % eval_every == 0 or step == max_steps):
            return {}, False
        scores.append(float(eval_fn()))
        return {"sft/eval": scores[-1]}, stop_at is not None and scores[-1] >= stop_at

    def log_rows(row: dict[str, float]) -> None:  # an evaluation is its own row, after its step's
        assert log is not None
        score = row.pop("sft/eval", None)
        log(row)
        if score is not None:
            log({"step": row["step"], "sft/eval": score})

    plan = FitPlan(
        steps=max_steps,
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        schedule=schedule,
        grad_clip=grad_clip,
        max_nonfinite_steps=max_nonfinite_steps,
        seed=seed,
    )
    done = fit(
        policy.model,
        policy.trainable_parameters(),
        len(encoded),
        plan,
        losses,
        name="SFT",
        advice="look for NaN/inf in the demonstrations, or lower sft.lr",
        metrics=metrics,
        after_step=evaluate,
        log=None if log is None else log_rows,
        deadline=deadline,
        ranks=ranks,
        saves=saves,
    )
    return {
        "steps": done.steps,
        "loss": done.metrics.get("sft/loss", float("nan")),
        "eval": scores[-1] if scores else None,
        "stopped_early": done.stopped and done.steps < max_steps,
        "out_of_time": done.out_of_time,
    }


def _response_tokens(batch: Sequence[tuple[list[int], int | list[int]]]) -> int:
    """Trained tokens of the encoded examples (response and eos, or the 1s of a token mask but the first)."""
    return sum(len(ids) - trained if isinstance(trained, int) else sum(trained[1:]) for ids, trained in batch)


def _batch_losses(
    policy: Policy,
    batch: list[tuple[list[int], int | list[int]]],
    pad_id: int,
    micro_batch_size: int | None,
    stats: Stats,
    ranks: Ranks = ONE_RANK,
    visions: Sequence[VisionInputs | None] = (),
) -> Iterator[torch.Tensor]:
    """Each micro-batch's summed response-token NLL divided by the whole batch's token count, so the losses
    sum to the batch's token-mean NLL whatever the micro-batch size; one forward at a time (lazily, for
    `OptimizerStepper.step`). Each summed NLL goes to `stats` (as `nll`), for the logged loss. On N ranks,
    this rank's share of the batch, padded to as many micro-batches as any rank runs."""
    chunk = micro_batch_size or len(batch)
    total_tokens = _response_tokens(batch)
    for rows, padding in ranks.micro_batches(torch.arange(len(batch)), chunk):
        input_ids, attention_mask, loss_mask = collate_sft([batch[i] for i in rows.tolist()], pad_id)
        vision = VisionBatch.of([visions[i] for i in rows.tolist()]) if visions else None
        nll, _ = sft_loss(policy, input_ids, attention_mask, loss_mask, vision)
        if not padding:
            stats.append({"nll": nll.item()})
        yield ranks.weigh(nll / total_tokens, padding)
