"""Reward-model training: a one-logit sequence classifier fitted to preference pairs with the
Bradley–Terry loss, as TRL's `RewardTrainer`.

The model is `AutoModelForSequenceClassification` with one label loaded from a causal LM's directory: the
body is the LM's, the `score` head is new. transformers reads the logit at the last non-pad token (by
`config.pad_token_id`), which is how the `reward_model` reward scores, so the saved directory is a reward
model as it stands. The loop is the offline one (`hone.training.fit`, SFT's too: seeded epochs,
micro-batches, RL's optimizer step and LR schedule); held-out pair accuracy (the share of pairs whose
chosen text scores higher) is measured every `eval_every` steps and after the last.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from hone.algorithms.preference import bradley_terry_loss
from hone.training.distributed import ONE_RANK, Ranks
from hone.training.fit import FitPlan, FitSaves, Stats, fit


@dataclass(frozen=True)
class EncodedComparison:
    """Token ids of the whole chosen and rejected texts (prompt + response), and the pair's margin."""

    chosen: list[int]
    rejected: list[int]
    margin: float | None = None


@dataclass(frozen=True)
class RMSettings(FitPlan):
    """The held-out cadence and the centring term, on top of the offline loop's `FitPlan`."""

    eval_every: int = 25
    center_coef: float = 0.0


def load_score_model(path: str | Path, *, dtype: torch.dtype | str, pad_token_id: int) -> PreTrainedModel:
    """A one-label sequence classifier from `path` (a causal LM: its `score` head starts random). The
    config's pad id is the tokenizer's, so the logit is read at the last real token."""
    # The new head is expected: transformers' load report (a table calling `score.weight` MISSING) would
    # read as a fault, so it is silenced and the report checked here instead.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            str(path), num_labels=1, dtype=dtype, output_loading_info=True
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    body_missing = [k for k in info["missing_keys"] if not k.startswith("score.")]
    if body_missing:
        raise ValueError(
            f"{path}: the checkpoint lacks {len(body_missing)} weights of the model, e.g. {body_missing[0]}"
        )
    model.config.pad_token_id = pad_token_id
    model.config.get_text_config().pad_token_id = pad_token_id
    return model


class ScoreModelPart:
    """A score model as a checkpoint's `name/` part: `save_pretrained` writes it, `load_weights` reads
    its weights back into the same-shaped model (every tensor: a missing one is an error)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model

    def save_pretrained(self, directory: Path) -> None:
        self.model.save_pretrained(directory)

    def load_weights(self, directory: Path) -> None:
        device = str(next(self.model.parameters()).device)
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(Path(directory).glob("*.safetensors")):
            state.update(load_file(shard, device=device))
        self.model.load_state_dict(state, strict=True)


def sequence_rewards(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sequences: Sequence[list[int]]
) -> torch.Tensor:
    """The model's scalar score of each token sequence `[N]` (padded by the tokenizer's own `pad`)."""
    batch = tokenizer.pad({"input_ids": list(sequences)}, return_tensors="pt")
    device = next(model.parameters()).device
    logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    return logits.logits[:, 0].float()


@torch.no_grad()
def pair_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[EncodedComparison],
    micro_batch_size: int | None = None,
    center_coef: float = 0.0,
) -> dict[str, float]:
    """`accuracy` (share of pairs scored chosen > rejected) and the mean BT `loss` over `pairs`."""
    was_training = model.training
    model.eval()
    try:
        chunk = micro_batch_size or len(pairs)
        correct, total_loss = 0.0, 0.0
        for start in range(0, len(pairs), chunk):
            chosen, rejected, losses = _pair_losses(
                model, tokenizer, pairs[start : start + chunk], center_coef
            )
            correct += float((chosen > rejected).sum())
            total_loss += float(losses.sum())
    finally:
        model.train(was_training)
    return {"accuracy": correct / len(pairs), "loss": total_loss / len(pairs)}


def run_reward_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_pairs: Sequence[EncodedComparison],
    val_pairs: Sequence[EncodedComparison],
    settings: RMSettings,
    *,
    log: Callable[[dict[str, float]], None] | None = None,
    deadline: float | None = None,
    ranks: Ranks = ONE_RANK,
    saves: FitSaves | None = None,
) -> dict[str, Any]:
    """Fit `model` in place for `settings.steps` optimizer steps (or until `deadline`, a
    `time.perf_counter()` value checked before each step).

    `log` receives per step `loss`, `accuracy` and `margin` (mean chosen − rejected score) over the batch,
    `rewards/chosen`, `rewards/rejected`, `learning_rate`, `grad_norm`; and, every `eval_every` steps and
    after the last, `eval/pair_accuracy` and `eval/loss` on `val_pairs`. Returns `{"steps", "out_of_time",
    "eval/pair_accuracy", "eval/loss"}` (the last held-out figures). On N `ranks` (every rank calls this,
    `model` sharded) each trains its share of every batch and every rank scores the held-out pairs.
    `saves`: checkpoints and a resume (`FitSaves`, its model part a `ScoreModelPart`).
    """
    if not train_pairs or not val_pairs:
        raise ValueError("reward-model training needs training pairs and held-out pairs")

    def held_out() -> dict[str, float]:
        out = pair_accuracy(model, tokenizer, val_pairs, settings.micro_batch_size, settings.center_coef)
        return {"eval/pair_accuracy": out["accuracy"], "eval/loss": out["loss"]}

    def after_step(step: int, row: dict[str, float]) -> tuple[dict[str, float], bool]:
        return (held_out() if step % settings.eval_every == 0 or step == settings.steps else {}), False

    done = fit(
        model,
        [p for p in model.parameters() if p.requires_grad],
        len(train_pairs),
        settings,
        lambda batch, stats: _batch_losses(
            model, tokenizer, [train_pairs[i] for i in batch], settings, stats, ranks
        ),
        name="reward-model",
        advice="look for NaN/inf in the preference data, or lower rm.lr",
        log=log,
        deadline=deadline,
        after_step=after_step,
        ranks=ranks,
        saves=saves,
    )
    result = {"steps": done.steps, "out_of_time": done.out_of_time, **done.metrics}
    if "eval/pair_accuracy" not in result:  # stopped by the deadline before any held-out measurement
        result |= held_out()
    return result


def _pair_losses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[EncodedComparison],
    center_coef: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chosen and rejected scores `[B]` from one forward of both, and the per-pair BT losses."""
    scores = sequence_rewards(model, tokenizer, [p.chosen for p in pairs] + [p.rejected for p in pairs])
    chosen, rejected = scores[: len(pairs)], scores[len(pairs) :]
    margins = [p.margin for p in pairs]
    margin = None
    if any(m is not None for m in margins):
        margin = torch.tensor([m or 0.0 for m in margins], device=scores.device)
    return chosen, rejected, bradley_terry_loss(chosen, rejected, margin=margin, center_coef=center_coef)


def _batch_losses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batch: list[EncodedComparison],
    settings: RMSettings,
    stats: Stats,
    ranks: Ranks = ONE_RANK,
) -> Iterator[torch.Tensor]:
    """Each micro-batch's summed pair losses over the batch size (adding up to the batch mean), lazily. On
    N ranks, this rank's share of the batch, padded to as many micro-batches as any rank runs."""
    chunk = settings.micro_batch_size or len(batch)
    for rows, padding in ranks.micro_batches(torch.arange(len(batch)), chunk):
        part = [batch[i] for i in rows.tolist()]
        chosen, rejected, losses = _pair_losses(model, tokenizer, part, settings.center_coef)
        if padding:  # the collectives of a forward and backward, nothing learnt or counted
            yield ranks.weigh(losses.sum(), padding)
            continue
        stats.append(
            {
                "loss": losses.detach(),
                "accuracy": (chosen > rejected).float().detach(),
                "margin": (chosen - rejected).detach(),
                "rewards/chosen": chosen.detach(),
                "rewards/rejected": rejected.detach(),
            }
        )
        yield ranks.weigh(losses.sum() / len(batch), padding)
