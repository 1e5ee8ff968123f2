"""A learned reward model: a Hugging Face sequence-classification head scores prompt + response.

This is the scalar ("Bradley–Terry") reward model of RLHF (Ouyang et al. 2022, "InstructGPT", §3.5;
Stiennon et al. 2020): one logit read at the last token of the conversation, as in every model trained
with TRL's `RewardTrainer` or exported as `AutoModelForSequenceClassification` (Skywork-Reward,
ArmoRM's scalar head, ...). It is a `BatchRewardFn`, so the runner gives it many rollouts per forward.

Decisions the paper leaves open:
- Which token: transformers' own pooling (the last non-pad token by `config.pad_token_id`), because that
  is how these models were trained. It works with either padding side as long as the config's pad id is
  the tokenizer's, so the loader forces them to agree (and sets pad to eos when the tokenizer has none).
- Text: the tokenizer's chat template over `sample.messages` + the response as the assistant turn when
  both exist, else the prompt and the response concatenated as they are (the policy saw the same string).
- Truncation (`max_length`) keeps the *end* of the text: the score is read at the last token, so cutting
  the response's end would score a different response, while a lost prompt start costs little.
- Scores are the raw logits (no sigmoid, no normalisation): advantage estimators are invariant to a
  shift and GRPO to a scale, and a raw logit keeps the reward model's calibration visible in the logs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from hone.models import resolve_model
from hone.models.chat import chat_text
from hone.rewards.registry import register_reward
from hone.types import Rollout, Sample


def resolve_device(device: str) -> torch.device:
    """`auto` → cuda when available, else cpu; anything else as torch spells it (`cpu`, `cuda:1`)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype | str:
    if dtype == "auto":
        return "auto"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16, float16 or auto, got {dtype!r}")
    return getattr(torch, dtype)


def resolve_path(path: str, what: str) -> str:
    """`resolve_model`, with `what` ("reward model", "judge model") in the message of a missing path."""
    try:
        return resolve_model(path)
    except (FileNotFoundError, NotADirectoryError) as err:
        raise type(err)(f"{what}: {err}") from err


def load_tokenizer(path: str, padding_side: str) -> PreTrainedTokenizerBase:
    """The tokenizer at `path`, with a pad token (eos when it has none) and the given padding side."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer at {path!r} has neither a pad nor an eos token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def render_messages(messages: Sequence[dict[str, Any]]) -> str:
    """A chat as plain `role: content` lines, for tokenizers without a chat template."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages)


def batches(n: int, size: int) -> Iterator[range]:
    return (range(start, min(start + size, n)) for start in range(0, n, size))


def pad(
    sequences: Sequence[list[int]], tokenizer: PreTrainedTokenizerBase
) -> tuple[torch.Tensor, torch.Tensor]:
    """`input_ids` and `attention_mask` [B, L], padded with the tokenizer's pad id on its padding side."""
    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):
        span = slice(width - len(ids), width) if tokenizer.padding_side == "left" else slice(0, len(ids))
        input_ids[row, span] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, span] = 1
    return input_ids, attention_mask


def scored_text(tokenizer: PreTrainedTokenizerBase, sample: Sample, response: str) -> tuple[str, bool]:
    """The string a reward model scores for `response` to `sample`, and whether it is chat-templated (and so
    already has its special tokens). Reward-model training encodes its pairs with this too."""
    if sample.messages is not None and tokenizer.chat_template:
        turn = {"role": "assistant", "content": response}
        return chat_text(tokenizer, [*sample.messages, turn]), True
    prompt = sample.prompt if sample.prompt is not None else render_messages(sample.messages or [])
    return prompt + response, False


def encode_scored_text(
    tokenizer: PreTrainedTokenizerBase, text: str, templated: bool, max_length: int | None
) -> list[int]:
    """Token ids of a `scored_text`: special tokens added unless templated, the end kept under `max_length`
    (with the tokenizer's `truncation_side` "left", as `reward_model` sets it)."""
    return tokenizer(
        text, add_special_tokens=not templated, truncation=max_length is not None, max_length=max_length
    )["input_ids"]


class RewardModel:
    """Scores `(rollout, sample)` pairs with a sequence-classification model, `batch_size` at a time."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 16,
        max_length: int | None = None,
        label_index: int = 0,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.max_length, self.label_index = batch_size, max_length, label_index

    def text(self, rollout: Rollout, sample: Sample) -> tuple[str, bool]:
        return scored_text(self.tokenizer, sample, rollout.response_text)

    def score_batch(self, rollouts: Sequence[Rollout], samples: Sequence[Sample]) -> list[float]:
        if len(rollouts) != len(samples):
            raise ValueError(f"got {len(rollouts)} rollouts but {len(samples)} samples")
        texts = [self.text(r, s) for r, s in zip(rollouts, samples, strict=True)]
        # Length-sorted batches waste less compute on padding; scores go back in the callers' order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i][0]))
        scores = [0.0] * len(texts)
        for chunk in batches(len(order), self.batch_size):
            indices = [order[i] for i in chunk]
            for i, score in zip(indices, self._forward([texts[i] for i in indices]), strict=True):
                scores[i] = score
        return scores

    @torch.no_grad()
    def _forward(self, texts: list[tuple[str, bool]]) -> list[float]:
        # Templated and plain texts differ in whether the tokenizer should add bos/eos, so encode each
        # with its own flag and pad them together.
        encoded = [
            encode_scored_text(self.tokenizer, text, templated, self.max_length) for text, templated in texts
        ]
        input_ids, attention_mask = pad(encoded, self.tokenizer)
        device = next(self.model.parameters()).device
        logits = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
        return logits[:, self.label_index].float().tolist()


@register_reward("reward_model")
def reward_model(
    path: str,
    batch_size: int = 16,
    device: str = "cpu",
    max_length: int | None = None,
    label_index: int | None = None,
    dtype: str = "float32",
) -> RewardModel:
    """Load `AutoModelForSequenceClassification` + tokenizer from `path` (a directory or hub name).

    A single-label head's logit is the reward; a head with more labels needs `label_index` to say which
    logit to use. `max_length` truncates (from the left) texts longer than that many tokens.
    """
    if batch_size < 1:
        raise ValueError(f"reward_model: batch_size must be >= 1, got {batch_size}")
    if max_length is not None and max_length < 1:
        raise ValueError(f"reward_model: max_length must be >= 1, got {max_length}")
    resolved = resolve_path(path, "reward model")
    tokenizer = load_tokenizer(resolved, padding_side="right")
    tokenizer.truncation_side = "left"
    model, loading = AutoModelForSequenceClassification.from_pretrained(
        resolved, dtype=resolve_dtype(dtype), output_loading_info=True
    )
    _check_complete(model, sorted(loading["missing_keys"]), resolved)
    index = _label_index(model.config.num_labels, label_index, resolved)
    # transformers finds the scoring token by `config.pad_token_id`; it must be the id we pad with.
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.to(resolve_device(device)).eval()
    return RewardModel(model, tokenizer, batch_size=batch_size, max_length=max_length, label_index=index)


def _check_complete(model: PreTrainedModel, missing: list[str], path: str) -> None:
    """Refuse a checkpoint that lacks weights: transformers would fill them with random values and the
    reward would be noise, without a word. Missing head weights (outside the base model) mean a causal LM."""
    body = f"{model.base_model_prefix}."
    head = [key for key in missing if not key.startswith(body)]
    if head:
        raise ValueError(
            f"reward model at {path!r} has no trained score head (missing {', '.join(head[:3])}): it looks "
            "like a causal LM checkpoint; train a reward model on it with `hone rm`, or point at one"
        )
    if missing:
        raise ValueError(
            f"reward model at {path!r} lacks {len(missing)} weight tensors (e.g. {missing[0]}): "
            "a damaged checkpoint"
        )


def _label_index(num_labels: int, label_index: int | None, path: str | Path) -> int:
    if label_index is None:
        if num_labels != 1:
            raise ValueError(
                f"reward model at {path!r} has {num_labels} labels; a reward model has 1 "
                "(set label_index to choose one logit)"
            )
        return 0
    if not 0 <= label_index < num_labels:
        raise ValueError(f"label_index {label_index} out of range for {num_labels} labels")
    return label_index
