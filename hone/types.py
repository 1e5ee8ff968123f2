"""Core data types that flow between the stages (see docs/architecture.md).

Every arrow of the loop carries one of these plain dataclasses, never a back-channel:
`data` makes `Sample`s, `rollout` turns them into `Rollout`s, `rewards` fills in `reward`,
and `training.collate` collates scored rollouts into a training `Batch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch


@dataclass
class Sample:
    """One prompt record.

    `prompt` is plain text fed to the model as is; `messages` is a chat to be rendered through the
    tokenizer's chat template. Exactly one of them is set. `answer` is the reference a verifier checks
    against; `meta` carries anything else a reward or environment needs (tests, numbers, target, ...).
    `images` are the prompt's images in the order of its `{"type": "image"}` content parts (a plain-text
    prompt's go before its text): PIL images, or paths / bytes that `hone.data.images.load_image` opens
    when the prompt is encoded, not when the data is read.
    """

    id: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    answer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    images: list[Any] | None = None


@dataclass(frozen=True, eq=False)
class VisionInputs:
    """One prompt's images as the model's processor made them (Qwen2-VL layout): `pixel_values` [patches,
    D] holds every image's patches in order, `image_grid_thw` [images, 3] each image's (t, h, w) patch
    grid. `image_keys` (sha256 of each image's grid and pixel rows) are the images' identities: two prompts
    with the same token ids but other images must never share a KV cache or a log-prob pass. The prompt's
    token ids hold each image's placeholder already expanded to its `t*h*w / merge**2` image tokens."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    image_keys: tuple[str, ...]
    tokens_per_image: tuple[int, ...]  # each image's placeholder tokens in the prompt's ids
    images: tuple[bytes, ...] = ()  # the original images as PNG bytes, in order (the vLLM engine's input)

    @property
    def key(self) -> tuple[str, ...]:
        return self.image_keys

    @property
    def num_images(self) -> int:
        return int(self.image_grid_thw.shape[0])

    @staticmethod
    def join(first: VisionInputs | None, then: VisionInputs | None) -> VisionInputs | None:
        """The images of a sequence that holds `first`'s placeholders, then `then`'s (a multi-turn episode's
        images as its turns add them): every field concatenated in order. None when neither has any."""
        if first is None or then is None:
            return first if then is None else then
        return VisionInputs(
            pixel_values=torch.cat([first.pixel_values, then.pixel_values]),
            image_grid_thw=torch.cat([first.image_grid_thw, then.image_grid_thw]),
            image_keys=first.image_keys + then.image_keys,
            tokens_per_image=first.tokens_per_image + then.tokens_per_image,
        )


def _spans(starts: torch.Tensor, lengths: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """The indices of the picked spans (`starts[k]`, `lengths[k]` long), concatenated in pick order."""
    pieces = [
        torch.arange(s, s + n) for s, n in zip(starts[picked].tolist(), lengths[picked].tolist(), strict=True)
    ]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)


@dataclass(frozen=True, kw_only=True)
class VisionBatch:
    """The vision inputs of a batch's rows, concatenated in row order: `pixel_values` [P, D], `image_grid_thw`
    [I, 3], and `images_per_row` [B] (0 for a text-only row), so any subset of rows can be cut out."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    images_per_row: torch.Tensor

    @classmethod
    def of(cls, rows: Sequence[VisionInputs | None]) -> VisionBatch | None:
        """The batch of `rows`' inputs; None when no row has an image."""
        present = [v for v in rows if v is not None]
        if not present:
            return None
        return cls(
            pixel_values=torch.cat([v.pixel_values for v in present]),
            image_grid_thw=torch.cat([v.image_grid_thw for v in present]),
            images_per_row=torch.tensor([0 if v is None else v.num_images for v in rows]),
        )

    def select(self, rows: torch.Tensor | slice) -> VisionBatch:
        """The inputs of `rows` (an index tensor, boolean mask or slice over the rows), in that order."""
        per_row = self.images_per_row.cpu()
        picked = torch.arange(len(per_row))[rows.cpu() if isinstance(rows, torch.Tensor) else rows]
        patches = self.image_grid_thw.cpu().prod(-1)
        image_index = _spans(torch.cumsum(per_row, 0) - per_row, per_row, picked)
        patch_index = _spans(torch.cumsum(patches, 0) - patches, patches, image_index)
        return VisionBatch(
            pixel_values=self.pixel_values[patch_index.to(self.pixel_values.device)],
            image_grid_thw=self.image_grid_thw[image_index.to(self.image_grid_thw.device)],
            images_per_row=self.images_per_row[picked.to(self.images_per_row.device)],
        )

    def to(self, device: torch.device | str) -> VisionBatch:
        return VisionBatch(**{name: t.to(device) for name, t in vars(self).items()})


@dataclass(kw_only=True)
class SamplingParams:
    """How to sample. `seed` makes a `generate` call reproducible on the same engine. Built by keyword
    (or `dataclasses.replace`), so a new field cannot shift the others."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class Rollout:
    """One trajectory, exactly as sampled.

    `token_ids` holds prompt + response; `loss_mask`, `sampler_logprobs` are per *response* token
    (length `len(token_ids) - prompt_len`). `loss_mask` is 1 on tokens the policy produced and is
    trained on, 0 on tool/environment tokens spliced into a multi-turn response. `turns` lists
    `(start, end)` response-token spans of each assistant turn (one span for single-turn).
    """

    sample_id: str
    group_id: int
    token_ids: list[int]
    prompt_len: int
    loss_mask: list[int]
    sampler_logprobs: list[float]
    response_text: str = ""
    finish_reason: str = "stop"  # "stop" (eos or stop string) | "length"
    policy_version: int = 0
    turns: list[tuple[int, int]] = field(default_factory=list)
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None  # multi-turn: the conversation, observations included
    turn_rewards: list[float] = field(default_factory=list)  # multi-turn: the environment's reward per turn
    # Per response token, the weight version that sampled it, where a publish landed mid-generation
    # (`rollout.interruptible`); empty: every token is `policy_version`'s, the oldest version in it.
    token_versions: list[int] = field(default_factory=list)
    vision: VisionInputs | None = None  # the prompt's images (shared by a group's rollouts, never copied)
    extra: dict[str, Any] = field(default_factory=dict)  # TRL rewards' `log_extra` columns (samples.jsonl)
    # The episode's `Environment.reward_state()` (a TRL environment's instance), which TRL-contract rewards
    # get as `environments=`: set when its episode ends, dropped once it is scored, so it neither travels
    # with a scored rollout (to the learner, a replay buffer) nor outlives the step.
    env_state: Any = field(default=None, repr=False, compare=False)

    @property
    def response_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def newest_version(self) -> int:
        """The newest weight version among its tokens (`policy_version` is the oldest)."""
        return max(self.token_versions, default=self.policy_version)

    @property
    def response_len(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def assistant_text(self, which: Literal["final", "all"] = "final") -> str:
        """What a text reward scores: `response_text` (a multi-turn episode's final assistant message), or
        with "all" every assistant message the episode sampled, joined by newlines; never observations.
        Sampled replies are the conversation's last `len(turns)` assistant messages (the prompt's own,
        e.g. few-shot turns, come before them; environments answer as user or tool)."""
        if which not in ("final", "all"):
            raise ValueError(f"which must be 'final' or 'all', got {which!r}")
        if which == "final" or self.messages is None:  # single-turn: the response is the one message
            return self.response_text
        replies = [m["content"] for m in self.messages if m["role"] == "assistant"]
        return "\n".join(replies[len(replies) - len(self.turns) :])


@dataclass(frozen=True, kw_only=True)
class Batch:
    """Collated sequences, as `hone.training.collate.collate` builds them from rollouts: the columns
    everything after it (log-prob passes, advantages, the `TrainBatch`) reads.

    Sequences are right-padded to `L` total tokens; the response tensors have `T = L - 1` columns aligned
    with next-token predictions, i.e. column `t` scores token `input_ids[:, t + 1]`.
    """

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    response_mask: torch.Tensor  # [B, T] float, 1 on sampled response tokens
    sampler_log_probs: torch.Tensor  # [B, T] the sampler's own log-probs (π_behav)
    group_ids: torch.Tensor  # [B]
    prompt_lens: torch.Tensor  # [B] long: each row's prompt tokens (the rest is response)
    vision: VisionBatch | None = None  # the rows' images, when any row has one

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with every tensor on `device` (collate builds on CPU; training may be on GPU)."""
        tensors = {name: t.to(device) for name, t in vars(self).items() if isinstance(t, torch.Tensor)}
        return replace(self, **tensors, vision=None if self.vision is None else self.vision.to(device))


@dataclass(frozen=True, kw_only=True)
class TrainBatch:
    """Everything one RL update reads, built once by the learner (never swapped or zeroed afterwards).

    Columns as `Batch`'s: `T = L - 1`, column `t` scores token `input_ids[:, t + 1]`. Three log-prob
    tensors, each with one meaning: `behaviour_logp` is what the sampler that produced the tokens gave
    them (π_behav); `old_logp` is the update's anchor π_old (the trainer's recomputation under
    `algorithm.old_log_probs: recompute`, else the behaviour's own tensor); `ref_logp` the KL
    reference's. `loss_mask` is the response mask less the rows the loss leaves out (DAPO's truncated
    responses), while `advantages`/`returns` were computed on the whole response mask.
    """

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor  # [B, T] float, 1 on trained response tokens
    behaviour_logp: torch.Tensor  # [B, T] the sampler's log-probs
    old_logp: torch.Tensor  # [B, T] π_old, the anchor of the ratio
    advantages: torch.Tensor  # [B, T]
    returns: torch.Tensor  # [B, T]
    ref_logp: torch.Tensor | None = None  # [B, T], when there is a KL reference
    values: torch.Tensor | None = None  # [B, T] the critic's V(s_t) before its update (gae only)
    group_ids: torch.Tensor | None = None  # [B]
    prompt_lens: torch.Tensor | None = None  # [B] long: each row's prompt tokens (the rest is response)
    # [B] bool: rows sampled with the weights the learner holds now (the log-prob canary compares them)
    fresh: torch.Tensor | None = None
    vision: VisionBatch | None = None  # the rows' images, when any row has one

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])
