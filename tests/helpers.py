"""Shared test doubles (add to this file; other helpers live here too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hone.rollout.base import GenerationRequest
from hone.types import Rollout, SamplingParams


class FixedSampler:
    """A `Sampler` whose rollouts are a function of each request (`respond(request, params)` gives that
    request's `params.n` rollouts): the producer's episodes, batcher and scoring run for real around it."""

    policy_version = 0
    eos_token_ids: frozenset[int] = frozenset()

    def __init__(self, respond: Callable[[GenerationRequest, SamplingParams], list[Rollout]]) -> None:
        self.respond = respond
        self.calls: list[tuple[list[GenerationRequest], SamplingParams]] = []

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]:
        self.calls.append((requests, params))
        return [r for request in requests for r in self.respond(request, params)]

    def load_weights(self, state_dict: Any, version: int) -> None:
        self.policy_version = version


class PlainTokenizer:
    """Encodes every plain-text prompt as [1, 2]: enough for single-turn producers over fixed rollouts."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [1, 2]}
