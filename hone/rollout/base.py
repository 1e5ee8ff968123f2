"""The one interface every generation engine implements.

The trainer and orchestrator talk only to `Sampler`, so swapping the transformers engine for vLLM (or a
remote server) changes a config string, not the training loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from hone.types import Rollout, SamplingParams, VisionInputs

if TYPE_CHECKING:  # annotations only: validating a recipe's `rollout.engine` imports this, not transformers
    import torch
    from torch import nn
    from transformers import PreTrainedTokenizerBase


@dataclass
class GenerationRequest:
    """One prompt to sample from, already tokenized.

    Tokenization (chat templates, truncation) happens upstream so that every engine sees exactly the
    same prompt tokens and the trainer can recompute log-probs over the very same ids.
    """

    sample_id: str
    group_id: int
    prompt_ids: list[int]
    # This request's own cap on new tokens (None: the `SamplingParams` value). Multi-turn episodes need it:
    # each has its own room left, and one shared cap would let the longest episode cut every other's turn.
    max_new_tokens: int | None = None
    # The prompt's images (their tokens already expanded in `prompt_ids`); every rollout carries them on.
    vision: VisionInputs | None = None


@runtime_checkable
class Sampler(Protocol):
    """A generation engine.

    `generate` returns `params.n` rollouts per request, grouped in request order (all rollouts of
    request 0, then of request 1, ...), each carrying its request's `sample_id` and `group_id` and the
    sampler's `policy_version` at the time of sampling. `load_weights` installs new policy weights and
    sets `policy_version`, so each rollout records which weights produced it (what an asynchronous
    mode's staleness bound will check; the synchronous loop is always on-policy).
    `eos_token_ids` are the ids a response stops on (see `eos_token_ids`): a multi-turn episode reads a
    turn as ended by the very same set. `close` stops what the sampler runs outside this process (a vLLM
    server); the run calls it once, at its end; a sampler with nothing outside has an empty one.
    """

    policy_version: int

    @property
    def eos_token_ids(self) -> frozenset[int]: ...  # read-only: an attribute or a property satisfies it

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]: ...

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None: ...

    def close(self) -> None: ...


class GenerationInterrupted(Exception):
    """A `generate` call ended early by `Interruptible.interrupt`: the run is stopping."""


@runtime_checkable
class Interruptible(Protocol):
    """A sampler whose running `generate` call can be stopped from another thread.

    An in-process engine samples on the batcher's generation thread; a run that stops (Ctrl-C, SIGTERM,
    an error) must not leave that thread inside the engine's native code when the interpreter exits (it
    aborts the process: "terminate called without an active exception"), nor wait minutes for a long
    call. `interrupt` makes the call running now raise `GenerationInterrupted` soon (the HF sampler:
    after the token it is on); a call started after it is not affected. An engine in another process
    (vLLM) needs none: its waiting thread holds no native frames.
    """

    def interrupt(self) -> None: ...


def eos_token_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """End-of-sequence ids, as `model.generate` picks them: the one set an engine stops on and a multi-turn
    episode reads a turn's end by.

    The generation config comes first because chat models list several terminators there (e.g. Qwen's
    <|im_end|> and <|endoftext|>); the tokenizer's single eos is the fallback.
    """
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)
