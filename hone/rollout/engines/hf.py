"""Batched generation for transformers causal LMs with a hand-written KV-cache decode loop.

Why not `model.generate`: it keeps decoding finished rows until the longest response ends and carries
generic per-step machinery (logits processors, stopping criteria), and getting per-token log-probs out of
it takes extra passes over the scores. This loop does only what RL needs: prefill the left-padded prompts
once, feed one token per row per step, record each token's log-prob as it is drawn, and drop finished rows
from the batch and the KV cache. On a ~1M-parameter model on CPU (transformers 5.24) it matches `generate`
(1.0-1.2x) when rows run to the budget and is 2x on 64 prompts x 64 tokens when rows stop early
(bench/sampler_bench.py): the forward pass is the same, so the gain is from the dropped rows.

Multi-turn episodes send each turn's whole context again (the last turn's prompt, its sampled reply, the
environment's observation). With `prefix_cache` the sampler keeps the KV cache of every sequence its
last `generate` call fed through the model and, when a new prompt starts with one of them, prefills only
the new tokens (what vLLM's automatic prefix caching does for the same traffic). Reused rows sit in
the batch as [padding][cached tokens][padding][new tokens]; the attention mask hides both paddings and
positions count real tokens only, so the model sees exactly the sequence it would see unpadded. The
store is keyed by the weight version: `load_weights` (every weight publish) drops it, so nothing computed
with old weights is reused after a publish. A model object shared with a trainer (tests do that; a run's
sampler owns a copy) changes without telling the sampler, so the key also holds each parameter's
storage, dtype and in-place version counter, and an optimizer step on a shared model drops it too.
Measured (bench/sampler_bench.py): 1.8x the tokens/s of re-encoding on 3-turn `agent-retry`-shaped
traffic, 2.2x over 6 turns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedConfig, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from hone.models.compat import cache_kwarg
from hone.models.tokens import pad_token_id
from hone.models.vision import vision_token_ids
from hone.rollout.base import GenerationInterrupted, GenerationRequest, eos_token_ids
from hone.rollout.engines.hf_vision import cache_tokens, vision_prefill
from hone.rollout.engines.prefix_cache import PrefixStore
from hone.rollout.engines.token_sampling import check_params, sample_next
from hone.rollout.fingerprint import Fingerprint, fingerprint
from hone.types import Rollout, SamplingParams, VisionInputs

# A stop string of m characters is at most 4m UTF-8 bytes and every non-special token carries at least one
# byte, so it lies within the last 4m tokens; a few more tokens of left context keep decoders that strip a
# leading space or emit a partial character at the start of the window from hiding it.
_STOP_CONTEXT_TOKENS = 4
# Dropping finished rows copies the whole KV cache, so it only pays once a good share of the batch is dead:
# measured, compacting at every finish was slower than never on 256 x 8 tokens; a quarter was at or near
# the best on every workload tried (bench/sampler_bench.py shapes and 256 x 64).
_COMPACT_FRACTION = 0.25


@dataclass
class _Sequence:
    """One sampled response as it grows."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the weight version each token was sampled with
    finish_reason: str = "length"


class HFSampler:
    """`Sampler` over an in-process transformers model. In a run it owns its model (a copy of the
    policy's, `hf_engine.sampler_model`) and takes new weights only through
    `load_weights` (`hone.rl.placement.weights`); sharing a trainer's model object works too (see the prefix
    cache in the module docstring).

    `sampler_logprobs` are log softmax(logits / temperature) of the chosen token over the *full*
    vocabulary (raw logits at temperature 0), taken before top-k/top-p truncation: that is the quantity
    the trainer recomputes, so the two differ only by numerics and their gap measures the train/inference
    mismatch rather than the truncation.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int = 256,
        prefix_cache: bool = True,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.prefix_cache = prefix_cache
        self.policy_version = 0
        self._prefixes: PrefixStore | None = None  # what the last call fed, valid for `_prefixes_for`
        self._prefixes_for: tuple[int, tuple[object, ...]] | None = None  # (version, weights fingerprint)
        self._cache_kwarg = cache_kwarg(model)
        # A vision-language model: its vision tokens are never sampled, and it takes mRoPE positions.
        config = _config(model)
        banned = vision_token_ids(config)
        self._banned = torch.tensor(banned, dtype=torch.long) if banned else None
        self._image_token_id: int | None = getattr(config, "image_token_id", None) if banned else None
        # `interrupt` marks the call running when it is made; `_decode` checks the mark at every token.
        self._call = self._interrupted_call = 0
        # Interruptible rollouts (`rollout.interruptible`): called before every token; True when it has
        # just loaded newer weights (`load_weights`), so the live rows are re-prefilled with them.
        self.between_tokens: Callable[[], bool] | None = None

    def close(self) -> None:
        """Nothing to stop: the model lives in this process and goes with the sampler."""

    def interrupt(self) -> None:
        """Make the running `generate` call raise `GenerationInterrupted` after its current token
        (`rollout.base.Interruptible`)."""
        self._interrupted_call = self._call

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]:
        check_params(params)
        self._call += 1
        if any(not r.prompt_ids for r in requests):
            raise ValueError("every request needs at least one prompt token")
        if any(r.max_new_tokens is not None and r.max_new_tokens < 1 for r in requests):
            raise ValueError("a request's max_new_tokens must be >= 1 (or None for the params' value)")
        prompts = [r.prompt_ids for r in requests for _ in range(params.n)]
        visions = [r.vision for r in requests for _ in range(params.n)]
        if self._image_token_id is None and any(v is not None for v in visions):
            raise ValueError("a request has images but the sampler's model is text-only")
        budgets = [params.max_new_tokens if r.max_new_tokens is None else r.max_new_tokens for r in requests]
        budgets = [b for b in budgets for _ in range(params.n)]
        device = next(self.model.parameters()).device
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=device).manual_seed(params.seed)
        if self.between_tokens is not None:  # a version published since the last call, before any prefill
            self.between_tokens()
        key = (self.policy_version, self._cache_key_weights()) if self.prefix_cache else None
        previous = self._prefixes if key is not None and self._prefixes_for == key else None
        self._prefixes = None  # a stale store is freed before this call's cache is built
        store = PrefixStore() if self.prefix_cache else None
        sequences: list[_Sequence] = []
        started_at = self.policy_version
        with torch.inference_mode(), _eval_mode(self.model):
            # Chunks hold whole groups where they can, so every copy of a prompt shares one prefill.
            size = self.max_batch_size // params.n * params.n or self.max_batch_size
            for start in range(0, len(prompts), size):
                chunk, limits = prompts[start : start + size], budgets[start : start + size]
                images = visions[start : start + size]
                if self.policy_version != started_at:  # weights changed in an earlier chunk: nothing stored
                    previous = store = None
                sequences += self._decode(chunk, images, limits, params, generator, device, previous, store)
        if self.policy_version == started_at:  # KV of one version only: reusable by the next call
            self._prefixes, self._prefixes_for = store, key
        texts = self.tokenizer.batch_decode([s.tokens for s in sequences], skip_special_tokens=True)
        rollouts = []
        for i, (seq, text) in enumerate(zip(sequences, texts, strict=True)):
            request = requests[i // params.n]
            rollouts.append(
                Rollout(
                    sample_id=request.sample_id,
                    group_id=request.group_id,
                    token_ids=list(request.prompt_ids) + seq.tokens,
                    prompt_len=len(request.prompt_ids),
                    loss_mask=[1] * len(seq.tokens),
                    sampler_logprobs=seq.logprobs,
                    response_text=text,
                    finish_reason=seq.finish_reason,
                    policy_version=min(seq.versions, default=started_at),
                    turns=[(0, len(seq.tokens))],
                    token_versions=seq.versions if len(set(seq.versions)) > 1 else [],
                    vision=request.vision,
                )
            )
        return rollouts

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return eos_token_ids(self.model, self.tokenizer)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Copy `state_dict` into the model in place (a partial dict updates only those tensors) and make
        it weight version `version`; the prefix cache is dropped, whatever the version.

        Tensors that already are the model's own storage (a model shared with the trainer) are not
        copied. Shapes are checked because `copy_` would silently broadcast a wrong one.
        """
        self._prefixes = None  # whatever changes below, cached KV of the old weights must not be reused
        own = self.model.state_dict()
        unknown = state_dict.keys() - own.keys()
        if unknown:
            raise KeyError(f"not in the sampler's model: {sorted(unknown)[:5]}")
        with torch.no_grad():
            for name, src in state_dict.items():
                dst = own[name]
                if src.shape != dst.shape:
                    raise ValueError(f"{name}: shape {tuple(src.shape)} != model's {tuple(dst.shape)}")
                if src.data_ptr() != dst.data_ptr():
                    dst.copy_(src)
        self.policy_version = version

    def weights_fingerprint(self, names: Collection[str]) -> Fingerprint:
        """The fingerprint of the tensors named `names` as this sampler's model holds them (its dtype, its
        LoRA wrapper's names): what a verified publish compares (`rollout.fingerprint`)."""
        own = self.model.state_dict()
        return fingerprint({name: own[name] for name in names if name in own})

    def _cache_key_weights(self) -> tuple[object, ...]:
        """Beside the version, what decides whether the last call's KV caches still hold when the model is
        shared with a trainer: the model, and each parameter's storage, dtype and in-place version counter
        (bumped by autograd-visible writes: `copy_`, the multi-tensor AdamW). Writes that bypass the counter
        (`p.data.copy_`, the fused AdamW that `trainer.fused_adamw` makes the default) are not seen: change
        weights through `load_weights`, as a run's publish does."""
        params = self.model.parameters()
        return (id(self.model), *((p.data_ptr(), p.dtype, p._version) for p in params))

    def _prefill(
        self,
        prompts: list[list[int]],
        visions: list[VisionInputs | None],
        previous: PrefixStore | None,
        pad: int,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor, DynamicCache, torch.Tensor]:
        """Run `prompts` through the model into a new cache, reusing `previous` KV where a prompt extends a
        stored sequence; return the last position's logits, the attention mask, the cache and each row's
        next position. Image prompts: see `hone.rollout.engines.hf_vision`."""
        # At least the last prompt token is always fed: its logits pick the first new token.
        keys = [cache_tokens(p, v, self._image_token_id) for p, v in zip(prompts, visions, strict=True)]
        hits = [previous.longest(k[:-1]) if previous else None for k in keys]
        reused = [len(h.columns) if h else 0 for h in hits]
        suffixes = [p[n:] for p, n in zip(prompts, reused, strict=True)]
        cached_width, width = max(reused), max(len(s) for s in suffixes)
        input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in suffixes], device=device)
        new_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in suffixes], device=device)
        old_mask = torch.tensor([[0] * (cached_width - n) + [1] * n for n in reused], device=device)
        cache = DynamicCache(PrefixStore.stack(hits, cached_width) or None, config=_config(self.model))
        mask = torch.cat([old_mask, new_mask], dim=1)
        images: dict[str, torch.Tensor] = {}
        if self._image_token_id is not None:
            fed = vision_prefill(
                self.model, prompts, visions, reused, width, pad, self._image_token_id, device
            )
            position_ids, next_positions = fed.position_ids, fed.next_positions
            if fed.pixel_values is not None and fed.image_grid_thw is not None:
                images = {"pixel_values": fed.pixel_values, "image_grid_thw": fed.image_grid_thw}
        else:
            # Left padding shifts every prompt right; positions must count from 0 at its first real token.
            position_ids = torch.tensor(reused, device=device)[:, None] + (new_mask.cumsum(-1) - 1).clamp(
                min=0
            )
            next_positions = mask.sum(-1)
        logits = self._forward(input_ids, mask, position_ids, cache, logits_to_keep=1, **images)
        return logits, mask, cache, next_positions

    def _decode(
        self,
        prompts: list[list[int]],
        visions: list[VisionInputs | None],
        budgets: list[int],
        params: SamplingParams,
        generator: torch.Generator | None,
        device: torch.device,
        previous: PrefixStore | None = None,
        store: PrefixStore | None = None,
    ) -> list[_Sequence]:
        """Generate for one batch of prompts (at most `max_batch_size` rows), each up to its own budget of
        new tokens; reuse KV from `previous` and add every finished sequence's KV to `store` (when given)."""
        eos = self.eos_token_ids
        pad = pad_token_id(self.tokenizer)
        # A group's n rows repeat one prompt back to back: prefill each distinct prompt once, then copy its
        # KV cache to its rows (prefix sharing, as vLLM's prefix cache does; prefill is n times cheaper).
        # Images count: two rows are one prompt only if their images are the same (by pixels) too.
        distinct = [
            i
            for i, p in enumerate(prompts)
            if i == 0 or p != prompts[i - 1] or _image_keys(visions[i]) != _image_keys(visions[i - 1])
        ]
        unique = [prompts[i] for i in distinct]
        logits, mask, cache, next_positions = self._prefill(
            unique, [visions[i] for i in distinct], previous, pad, device
        )
        # Only plain full-attention caches hold every token (a sliding-window layer drops old ones).
        if store is not None and not all(type(layer) is DynamicLayer for layer in cache.layers):
            store = None
        if len(unique) < len(prompts):
            copies = [end - start for start, end in zip(distinct, [*distinct[1:], len(prompts)], strict=True)]
            rows = torch.repeat_interleave(
                torch.arange(len(unique), device=device), torch.tensor(copies, device=device)
            )
            cache.batch_select_indices(rows)
            logits, mask, next_positions = logits[rows], mask[rows], next_positions[rows]

        sequences = [_Sequence() for _ in prompts]
        # Batch row -> index into `sequences`; None once that row has finished. A finished row stays in
        # the batch, its output ignored, until enough have piled up to be worth compacting the cache.
        owner: list[int | None] = list(range(len(prompts)))
        for _ in range(max(budgets)):
            if self._interrupted_call == self._call:
                raise GenerationInterrupted("generation interrupted: the run is stopping")
            if self.between_tokens is not None and self.between_tokens():
                # New weights mid-generation: the cache holds keys and values of the old ones, so every
                # live row's prompt and tokens so far go through the new weights again (AReaL's
                # interruptible generation re-prefills too), and what ends from here on is not stored.
                live = [i for i in owner if i is not None]
                owner = list(live)
                logits, mask, cache, next_positions = self._prefill(
                    [prompts[i] + sequences[i].tokens for i in live],
                    [visions[i] for i in live],
                    None,
                    pad,
                    device,
                )
                store = None
            was = list(owner) if store is not None else []  # who was live, to store the rows that end
            tokens, logprobs = sample_next(logits, params, generator, self._banned)
            for row, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
                if (i := owner[row]) is not None:
                    sequences[i].tokens.append(token)
                    sequences[i].logprobs.append(logprob)
                    sequences[i].versions.append(self.policy_version)
                    if token in eos:
                        sequences[i].finish_reason = "stop"
                        owner[row] = None
            if params.stop:
                pending = [(row, i) for row, i in enumerate(owner) if i is not None]
                hits = self._hit_stop([sequences[i] for _, i in pending], params.stop)
                for (row, i), hit in zip(pending, hits, strict=True):
                    if hit:
                        sequences[i].finish_reason = "stop"
                        owner[row] = None
            for row, i in enumerate(owner):
                if i is not None and len(sequences[i].tokens) == budgets[i]:
                    owner[row] = None  # out of budget: finish_reason stays "length"
            ended = [(row, i) for row, i in enumerate(was) if i is not None and owner[row] is None]
            if store is not None and ended:
                # An ending row has fed its prompt and all its tokens but the last (sampled, never fed).
                fed = [
                    cache_tokens(prompts[i], visions[i], self._image_token_id) + sequences[i].tokens[:-1]
                    for _, i in ended
                ]
                store.keep(fed, [row for row, _ in ended], cache, mask)
            keep = [row for row, i in enumerate(owner) if i is not None]
            if not keep:
                break
            if len(owner) - len(keep) >= _COMPACT_FRACTION * len(owner):
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, next_positions, tokens = mask[index], next_positions[index], tokens[index]
                owner = [owner[row] for row in keep]
            mask = torch.cat([mask, mask.new_ones(len(owner), 1)], dim=1)
            positions = next_positions[:, None]
            if self._image_token_id is not None:  # mRoPE: a text token's three position rows are equal
                positions = positions[None].expand(3, -1, -1)
            logits = self._forward(tokens[:, None], mask, positions, cache)
            next_positions = next_positions + 1
        return sequences

    def _forward(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
        **kwargs: int | torch.Tensor,
    ) -> torch.Tensor:
        """Run the model, extending `cache` in place; return the last position's logits [B, V]."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_kwarg: cache},
            **kwargs,
        )
        return out.logits[:, -1]

    def _hit_stop(self, sequences: list[_Sequence], stop: list[str]) -> list[bool]:
        """Whether each response's text now contains a stop string.

        Checked every step, so a hit is always new and only the tail that can hold it is decoded: the
        check stays O(1) per token instead of re-decoding the whole response.
        """
        window = 4 * max(len(s) for s in stop) + _STOP_CONTEXT_TOKENS
        texts = self.tokenizer.batch_decode([s.tokens[-window:] for s in sequences], skip_special_tokens=True)
        return [any(s in text for s in stop) for text in texts]


def _image_keys(vision: VisionInputs | None) -> tuple[str, ...]:
    return () if vision is None else vision.image_keys


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Switch off dropout while sampling, then restore each submodule's own train/eval flag.

    Per-module restore matters when the sampler shares the trainer's model, which may keep some parts
    (a frozen reference, a value head) deliberately in a different mode.
    """
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _config(model: nn.Module) -> PreTrainedConfig:
    """A causal LM's config (a PEFT wrapper forwards it); `nn.Module` types attributes as tensors."""
    config = model.config
    if not isinstance(config, PreTrainedConfig):
        raise TypeError(f"the sampler's model {type(model).__name__} has no transformers config")
    return config
