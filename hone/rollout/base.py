"""The one interface every generation engine implements.

The trainer and orchestrator talk only to `Sampler`, so swapping the transformers engine for vLLM (or a
remote server) changes a config string, not the training loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from hone.types import Rollout, SamplingParams


@dataclass
class GenerationRequest:
    """One prompt to sample from, already tokenized.

    Tokenization (chat templates, truncation) happens upstream so that every engine sees exactly the
    same prompt tokens and the trainer can recompute log-probs over the very same ids.
    """

    sample_id: str
    group_id: int
    prompt_ids: list[int]


@runtime_checkable
class Sampler(Protocol):
    """A generation engine.

    `generate` returns `params.n` rollouts per request, grouped in request order (all rollouts of
    request 0, then of request 1, ...), each carrying its request's `sample_id` and `group_id` and the
    sampler's `policy_version` at the time of sampling. `load_weights` installs new policy weights and
    sets `policy_version`, so each rollout records which weights produced it (what an asynchronous
    mode's staleness bound will check; the synchronous loop is always on-policy).
    """

    policy_version: int

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]: ...

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None: ...
