"""Sampling for `hone serve tinker`: Hone's HF sampler (`hone.rollout.engines.hf.HFSampler`) over a base model
with a sampler's adapter switched in.

A sampling session samples one set of weights: a base model alone, or a base model with a LoRA adapter
(a snapshot of a training client's, taken when it was saved, or a saved sampler checkpoint, read on first
use). Adapters of the last few sessions sampled stay loaded beside the training clients' (`cache_size`).

The SDK's sampling parameters map onto Hone's: `max_tokens` (default: the rest of the context), `temperature`
(0: greedy), `top_k` (-1: off), `top_p`, `seed`, and `stop`: None stops at the model's end-of-sequence
tokens, a list of token ids stops at those instead, `[]` at nothing, and stop strings end a sample where its
text contains one (beside end-of-sequence). The stop token or the tokens that spell the stop string are the
sample's last tokens, with `stop_reason` "stop"; a sample cut by `max_tokens` ends with "length".
Sampled log-probs are log softmax(logits / temperature) of the drawn token (raw logits at temperature 0),
before top-k/top-p truncation. Prompt log-probs are the model's (temperature 1), NaN for the first token.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from hone.rollout.base import GenerationRequest
from hone.rollout.engines.hf import HFSampler
from hone.tinker.engine import Base, Engine, LoraSpec
from hone.tinker.store import read_adapter
from hone.tinker.wire import Sequence, WireError, sample_response
from hone.training.logprobs import token_scores
from hone.types import SamplingParams

if TYPE_CHECKING:
    from tinker.types import SamplingParams as TinkerSamplingParams


@dataclass
class SamplerWeights:
    """What a sampling session samples: `base` alone (`lora` None), or with an adapter whose tensors are
    `state` (a snapshot) or are read by `load` (a saved sampler checkpoint) on first use."""

    key: str
    base: str
    lora: LoraSpec | None = None
    state: dict[str, torch.Tensor] | None = None
    path: str | None = None  # the tinker:// path it came from, if saved
    directory: Path | None = None  # where that checkpoint lies (its adapter is read from there)


class _StopSampler(HFSampler):
    """`HFSampler` whose stop tokens can be set per call (the SDK's `stop` as token ids, or `[]`)."""

    stop_ids: frozenset[int] | None = None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return super().eos_token_ids if self.stop_ids is None else self.stop_ids


class Sampling:
    """Samples for sampling sessions on the engine's base models (called on the worker thread)."""

    def __init__(self, engine: Engine, *, cache_size: int = 4, max_batch_size: int = 64) -> None:
        self.engine = engine
        self.cache_size, self.max_batch_size = cache_size, max_batch_size
        self._loaded: OrderedDict[tuple[str, str], str] = OrderedDict()  # (base, key) -> adapter name
        self._names = itertools.count()

    def sample(
        self,
        weights: SamplerWeights,
        prompt: list[int],
        params: TinkerSamplingParams,
        num_samples: int,
        *,
        prompt_logprobs: bool,
        prompt_logprobs_last_n: int | None = None,
    ) -> bytes:
        """`num_samples` samples continuing `prompt`, as the SDK's protobuf `SampleResponse`."""
        if not prompt:
            raise WireError("sample: the prompt has no tokens")
        if num_samples < 1:
            raise WireError(f"sample: num_samples must be >= 1, got {num_samples}")
        base = self.engine.base(weights.base)
        room = base.max_length - len(prompt)
        max_tokens = room if params.max_tokens is None else params.max_tokens
        if max_tokens < 1 or max_tokens > room:
            raise WireError(
                f"sample: max_tokens {max_tokens} does not fit the context: the prompt has {len(prompt)} "
                f"of the model's {base.max_length} tokens"
            )
        strings, ids = _stops(params.stop)
        hone_params = SamplingParams(
            n=num_samples,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=max(params.top_k, 0),
            max_new_tokens=max_tokens,
            stop=strings,
            seed=params.seed,
        )
        with self._weights(base, weights):
            sampler = _StopSampler(
                base.model, base.tokenizer, max_batch_size=self.max_batch_size, prefix_cache=False
            )
            sampler.stop_ids = ids
            try:
                rollouts = sampler.generate([GenerationRequest("s", 0, list(prompt))], hone_params)
            except ValueError as e:  # a sampling parameter out of range (`check_params`)
                raise WireError(f"sample: {e}") from e
            scored = _prompt_logprobs(base, prompt) if prompt_logprobs else None
        if scored is not None and prompt_logprobs_last_n is not None:
            scored[: len(prompt) - prompt_logprobs_last_n] = np.nan  # only the last N are asked for
        sequences = [
            Sequence(
                r.token_ids[r.prompt_len :],
                r.sampler_logprobs,
                "stop" if r.finish_reason == "stop" else "length",
            )
            for r in rollouts
        ]
        return sample_response(sequences, scored)

    @contextlib.contextmanager
    def _weights(self, base: Base, weights: SamplerWeights) -> Iterator[None]:
        """Switch `weights`' adapter in (loading it if it is not), or every adapter off for the base alone."""
        if weights.lora is None:
            context = base.peft.disable_adapter() if base.peft is not None else contextlib.nullcontext()
            with context:
                yield
            return
        key = (base.name, weights.key)
        name = self._loaded.get(key)
        if name is None:
            if weights.state is None:
                if weights.directory is None:
                    raise WireError(f"sampler {weights.key}: it has no weights to load")
                weights.state = read_adapter(weights.directory)
            name = f"s{next(self._names)}"
            base.add_adapter(name, weights.lora, seed=0)
            base.load_adapter_state(name, weights.state, weights.path or weights.key)
            self._loaded[key] = name
            while len(self._loaded) > self.cache_size:
                (_, _), old = self._loaded.popitem(last=False)
                assert base.peft is not None
                base.peft.delete_adapter(old)
        self._loaded.move_to_end(key)
        base.activate(name)
        yield


def _stops(stop: str | list[str] | list[int] | object | None) -> tuple[list[str], frozenset[int] | None]:
    """The SDK's `stop` as (stop strings, stop token ids or None for the model's own)."""
    if stop is None:
        return [], None
    if isinstance(stop, str):
        return [stop], None
    items = list(stop)  # type: ignore[call-overload]
    if all(isinstance(s, str) for s in items) and items:
        return items, None
    if all(isinstance(s, int) and not isinstance(s, bool) for s in items):
        return [], frozenset(items)
    raise WireError(f"sample: stop must be a string, a list of strings or a list of token ids, got {stop!r}")


def _prompt_logprobs(base: Base, prompt: list[int]) -> np.ndarray:
    """log p(prompt[t] | prompt[:t]) for t >= 1, NaN at 0: the SDK's `prompt_logprobs`."""
    device = next(base.hf_model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    out = np.full(len(prompt), np.nan, dtype=np.float32)
    if len(prompt) < 2:
        return out
    with torch.inference_mode():
        logits = base.model(input_ids=ids, use_cache=False).logits[:, :-1]
        lp, _ = token_scores(logits, ids[:, 1:], torch.ones_like(ids[:, 1:]), 1.0, False, False)
    out[1:] = lp[0].float().cpu().numpy()
    return out
