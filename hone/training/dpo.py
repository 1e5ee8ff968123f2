"""Direct preference optimisation (DPO and its variants) of a policy on (prompt, chosen, rejected) pairs.

The loop is the offline one (`hone.training.fit`, SFT's too): seeded epochs of batches, micro-batched
gradient accumulation, RL's optimizer step and LR schedule, a wall-clock deadline. A pair is encoded as
SFT encodes a demonstration (prompt with the tokenizer's special tokens, response + eos), so DPO raises or
lowers the probability of exactly the tokens the sampler would emit. Chosen and rejected rows of a micro-batch
go through one forward (TRL's "concatenated forward"). The loss is any `PREFERENCE_LOSSES` entry.

The reference is scored without a graph: once for every pair before training (`cache_reference`, the
default; the reference can then be dropped) or per batch. The metrics are TRL's, so runs compare.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from hone.algorithms.preference import PREFERENCE_LOSSES, REFERENCE_FREE, PreferenceLossFn
from hone.models.tokens import pad_token_id
from hone.training.distributed import ONE_RANK, Ranks
from hone.training.fit import FitPlan, FitSaves, Stats, fit
from hone.training.policy import Policy, first_response_column
from hone.training.sft import collate_sft, encode_pair

Encoded = tuple[list[int], int]  # token ids and prompt length, as `encode_pair` returns


@dataclass(frozen=True)
class EncodedPair:
    chosen: Encoded
    rejected: Encoded


@dataclass(frozen=True)
class DPOSettings(FitPlan):
    """The preference loss and its reference, on top of the offline loop's `FitPlan`."""

    lr: float = 1e-6
    loss: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0  # cdpo's ε
    gamma: float = 0.5  # simpo's target margin
    cache_reference: bool = True


def encode_preference(
    tokenizer: PreTrainedTokenizerBase, prompt: str, chosen: str, rejected: str
) -> EncodedPair:
    return EncodedPair(encode_pair(tokenizer, prompt, chosen), encode_pair(tokenizer, prompt, rejected))


def sequence_log_probs(
    policy: Policy, examples: Sequence[Encoded], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each example's summed response log-prob (differentiable under grad) and its response length `[N]`."""
    input_ids, attention_mask, loss_mask = collate_sft(examples, pad_id)
    token_log_probs, _ = policy.token_log_probs(
        input_ids, attention_mask, from_column=first_response_column(loss_mask)
    )
    loss_mask = loss_mask.to(token_log_probs.device)
    return (token_log_probs * loss_mask).sum(-1), loss_mask.sum(-1)


@torch.no_grad()
def reference_log_probs(
    reference: Policy, pairs: Sequence[EncodedPair], pad_id: int, micro_batch_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's summed log-probs of every pair's chosen and rejected response, `[N]` each."""
    chunk = micro_batch_size or len(pairs)
    chosen, rejected = [], []
    for start in range(0, len(pairs), chunk):
        part = pairs[start : start + chunk]
        logps, _ = sequence_log_probs(
            reference, [p.chosen for p in part] + [p.rejected for p in part], pad_id
        )
        chosen.append(logps[: len(part)])
        rejected.append(logps[len(part) :])
    return torch.cat(chosen), torch.cat(rejected)


def run_dpo(
    policy: Policy,
    pairs: Sequence[EncodedPair],
    settings: DPOSettings,
    *,
    reference: Policy | None = None,
    log: Callable[[dict[str, float]], None] | None = None,
    deadline: float | None = None,
    ranks: Ranks = ONE_RANK,
    saves: FitSaves | None = None,
) -> dict[str, Any]:
    """Train `policy` in place on `pairs` for `settings.steps` optimizer steps (or until `deadline`, a
    `time.perf_counter()` value checked before each step). `reference` is needed unless the loss is
    reference-free; with `cache_reference` it is scored once up front and not kept.

    `log` receives, per step, TRL's metrics averaged over the batch: `loss`, `rewards/chosen`,
    `rewards/rejected`, `rewards/accuracies` (share of pairs whose chosen reward is higher),
    `rewards/margins`, `logps/chosen`, `logps/rejected` (summed response log-probs of the policy), and
    `learning_rate`, `grad_norm`. Returns `{"steps", "out_of_time"}` and the last step's metrics.
    `saves`: checkpoints and a resume (`FitSaves`; the reference is scored again on resume).
    """
    if not pairs:
        raise ValueError("run_dpo needs at least one preference pair")
    if policy.tokenizer is None:
        raise ValueError("run_dpo needs a policy with a tokenizer")
    loss_fn = PREFERENCE_LOSSES[settings.loss]
    needs_reference = settings.loss not in REFERENCE_FREE
    if needs_reference and reference is None:
        raise ValueError(f"preference loss {settings.loss!r} needs a reference policy")
    tokenizer = policy.tokenizer
    pad_id = pad_token_id(tokenizer)
    cached = None
    if needs_reference and settings.cache_reference:
        assert reference is not None
        cached = reference_log_probs(reference, pairs, pad_id, settings.micro_batch_size)
        reference = None  # dropped: a frozen copy the caller did not keep is freed before training

    done = fit(
        policy.model,
        policy.trainable_parameters(),
        len(pairs),
        settings,
        lambda batch, stats: _batch_losses(
            policy, pairs, batch, settings, loss_fn, pad_id, reference, cached, stats, ranks
        ),
        name="DPO",
        advice="look for NaN/inf in the preference data, or lower dpo.lr",
        log=log,
        deadline=deadline,
        ranks=ranks,
        saves=saves,
    )
    return {"steps": done.steps, "out_of_time": done.out_of_time, **done.metrics}


def _batch_losses(
    policy: Policy,
    pairs: Sequence[EncodedPair],
    batch: list[int],
    settings: DPOSettings,
    loss_fn: PreferenceLossFn,
    pad_id: int,
    reference: Policy | None,
    cached: tuple[torch.Tensor, torch.Tensor] | None,
    stats: Stats,
    ranks: Ranks = ONE_RANK,
) -> Iterator[torch.Tensor]:
    """Each micro-batch's summed pair losses over the batch size (so they add up to the batch mean), one
    forward of its chosen and rejected rows at a time; each micro-batch's per-pair metrics go to `stats`.
    On N ranks, this rank's share of the batch, padded to as many micro-batches as any rank runs."""
    chunk = settings.micro_batch_size or len(batch)
    for rows, padding in ranks.micro_batches(torch.tensor(batch), chunk):
        indices = rows.tolist()
        part = [pairs[i] for i in indices]
        examples = [p.chosen for p in part] + [p.rejected for p in part]
        logps, lengths = sequence_log_probs(policy, examples, pad_id)
        n = len(part)
        ref_chosen = ref_rejected = None
        if cached is not None:
            ref_chosen, ref_rejected = (c[indices].to(logps.device) for c in cached)
        elif reference is not None:
            with torch.no_grad():
                ref_logps, _ = sequence_log_probs(reference, examples, pad_id)
            ref_chosen, ref_rejected = ref_logps[:n].to(logps.device), ref_logps[n:].to(logps.device)
        out = loss_fn(
            policy_chosen=logps[:n],
            policy_rejected=logps[n:],
            ref_chosen=ref_chosen,
            ref_rejected=ref_rejected,
            chosen_lengths=lengths[:n],
            rejected_lengths=lengths[n:],
            beta=settings.beta,
            label_smoothing=settings.label_smoothing,
            gamma=settings.gamma,
        )
        if padding:  # the collectives of a forward and backward, nothing learnt or counted
            yield ranks.weigh(out.losses.sum(), padding)
            continue
        stats.append(
            {
                "loss": out.losses.detach(),
                "rewards/chosen": out.chosen_rewards,
                "rewards/rejected": out.rejected_rewards,
                "rewards/accuracies": (out.chosen_rewards > out.rejected_rewards).float(),
                "rewards/margins": out.chosen_rewards - out.rejected_rewards,
                "logps/chosen": logps[:n].detach(),
                "logps/rejected": logps[n:].detach(),
            }
        )
        yield ranks.weigh(out.losses.sum() / len(batch), padding)
