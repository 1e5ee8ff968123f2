"""The trainable policy: an HF causal LM (optionally with LoRA) plus its tokenizer.

Everything the RL and SFT loops need from the model goes through `token_log_probs`, so masking,
temperature and micro-batching are decided in exactly one place and the trainer, the reference model
and the sampler-mismatch check all score tokens the same way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.processing_utils import ProcessorMixin

from hone.models.compat import cache_kwarg, checkpointing, output_cache
from hone.models.vision import (
    freeze_vision_tower,
    is_vision_config,
    language_lora_targets,
    load_processor,
    rope_positions,
    save_processor,
    vision_token_ids,
)
from hone.training.logprobs import token_scores
from hone.training.lora_merge import merged_lora_weights
from hone.types import VisionBatch

if TYPE_CHECKING:
    from peft import PeftModel

DType = Literal["float32", "bfloat16", "auto"]
Device = str  # "auto" | "cpu" | "cuda[:N]" (`model.device` checks the spelling)

ADAPTER_DIR = "adapter"


@dataclass
class LoraSettings:
    """LoRA hyper-parameters, passed to `peft.LoraConfig` (`alpha` is `lora_alpha`)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = field(default="all-linear")


def _resolve_device(device: Device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def enable_checkpointing(model: PreTrainedModel) -> None:
    # Non-reentrant checkpointing works with frozen inputs (LoRA) without `enable_input_require_grads`.
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout probability in `model`, as TRL's `disable_dropout` does for RL, and more.

    RL compares the training forward's log-probs with the sampler's (or a recomputation's, or the
    reference's), which run in eval mode: with dropout on in training the on-policy ratio is not 1 and
    clipping fires on noise. `nn.Dropout` modules (LoRA's included) get `p = 0`; attention dropout is a
    float attribute read in train mode only (`attention_dropout` in HF attention modules), so every float
    attribute named `*dropout*` is zeroed too. The model's config (what a checkpoint saves) is untouched.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        names = [k for k, v in vars(module).items() if "dropout" in k and isinstance(v, float)]
        for name in names:
            setattr(module, name, 0.0)


def weights_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 of named tensors (names, dtypes, shapes and bytes, in name order): which weights a run used."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().reshape(-1).contiguous().cpu()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensors[name].shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().data)  # the buffer itself, no copy
    return digest.hexdigest()


def first_response_column(response_mask: torch.Tensor) -> int:
    """The first column any row trains on (`from_column` for `Policy.token_log_probs`); 0 if none does."""
    columns = response_mask.any(dim=0).nonzero()
    return int(columns[0]) if columns.numel() else 0


class Policy:
    """An HF causal LM (a peft model with LoRA) and its tokenizer, with the scoring, export and save
    operations training needs. The tokenizer is required: rendering, sampling and saving all need it.
    A vision-language model also has its `processor` (images to pixel values, placeholders expanded)."""

    def __init__(
        self,
        model: PreTrainedModel | PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        processor: ProcessorMixin | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.processor = processor
        # A VLM's vision tokens are never sampled (`hone.models.vision`): scored under the same mask.
        banned = vision_token_ids(model.config)
        self.banned_ids = torch.tensor(banned, dtype=torch.long) if banned else None

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: DType = "float32",
        lora: LoraSettings | None = None,
        gradient_checkpointing: bool = False,
        device: Device = "cpu",
        freeze_vision: bool = False,
    ) -> Policy:
        """Load a causal LM, or a vision-language model (its config has a `vision_config`: loaded by
        `AutoModelForImageTextToText`, with its processor). On a VLM, LoRA's `all-linear` adapts the
        language model only (the vision tower is trained whole, or frozen by `freeze_vision`)."""
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        vision = is_vision_config(AutoConfig.from_pretrained(str(path)))
        if freeze_vision and not vision:
            raise ValueError(f"model.freeze_vision: {path} is a text-only model (it has no vision_config)")
        loader = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        model = loader.from_pretrained(str(path), dtype=torch_dtype)
        # transformers types `PreTrainedModel.to` as a bare functools.wraps wrapper (device reads as self).
        model.to(_resolve_device(device))  # type: ignore[arg-type]
        model.config.use_cache = False  # training never reuses a KV cache; it only costs memory
        if freeze_vision:
            freeze_vision_tower(model)
        if gradient_checkpointing:
            enable_checkpointing(model)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        processor = load_processor(path) if vision else None
        if lora is not None:
            from peft import LoraConfig, get_peft_model

            targets = lora.target_modules
            if vision and targets == "all-linear":
                targets = language_lora_targets(model)
            config = LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=targets,
                task_type="CAUSAL_LM",
            )
            return cls(get_peft_model(model, config), tokenizer, processor)
        return cls(model, tokenizer, processor)

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")

    def peft_model(self) -> PeftModel:
        """The model as the peft wrapper it is when `is_lora`; a clear error on a plain model."""
        from peft import PeftModel

        if not isinstance(self.model, PeftModel):
            raise TypeError(f"this policy has no LoRA adapter (its model is a {type(self.model).__name__})")
        return self.model

    def base_model(self) -> PreTrainedModel:
        """The HF model under the LoRA wrapper (the model itself without LoRA)."""
        base = self.peft_model().get_base_model() if self.is_lora else self.model
        if not isinstance(base, PreTrainedModel):
            raise TypeError(f"the policy's base model is a {type(base).__name__}, not a transformers model")
        return base

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """A detached copy of the LoRA adapter's tensors (peft's names, as `adapter_model.safetensors`)."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    def load_adapter_state(self, state: dict[str, torch.Tensor], origin: str | Path) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, state)
        # peft annotates the result as a bare `namedtuple`; it is torch's `_IncompatibleKeys`.
        unexpected: list[str] = result.unexpected_keys  # type: ignore[attr-defined]
        if unexpected:
            raise ValueError(f"adapter in {origin} does not fit this policy: {unexpected}")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def token_log_probs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        micro_batch_size: int | None = None,
        with_entropy: bool = False,
        entropy_grad: bool = False,
        from_column: int = 0,
        prompt_lens: torch.Tensor | None = None,
        vision: VisionBatch | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs (and optionally entropies) of `input_ids` under the model, `[B, L-1]` float32.

        Column `t` is `log p(input_ids[:, t+1] | input_ids[:, :t+1])` from `logits / temperature`, matching
        `Batch`. Columns whose target is padding are 0. Positions come from the attention mask, so right
        padding never touches a real token and left padding also scores correctly. Differentiable when
        called under grad; with `micro_batch_size` the rows are scored in chunks (under grad the graphs of
        all chunks are still kept, so the trainer should call this per micro-batch instead). Entropy carries a
        gradient only with `entropy_grad=True` (an entropy bonus); otherwise it is a detached metric.
        Columns before `from_column` (the prompt: see `first_response_column`) are returned as 0
        and skip the LM head and the vocabulary softmax, a fifth of a small model's compute.

        With `prompt_lens` ([B], right-padded rows of prompt then response), rows that share a prompt (a
        GRPO group) run it through the model once: its keys and values are copied to each row, which then
        forwards only its response (`_score_shared`). Exact up to float reassociation; the prompt's share
        of the compute (most of it for short answers to long prompts) drops by the group size.

        `vision`: the rows' images (a VLM's batch): positions are then the model's multimodal RoPE ones
        (`rope_positions`), and no prompt is shared (the same ids may hold other images; text-only for now).
        """
        if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
            raise ValueError(
                f"expected matching [B, L] tensors, got {input_ids.shape} / {attention_mask.shape}"
            )
        chunk = micro_batch_size or input_ids.shape[0]
        device = self.device
        log_probs: list[torch.Tensor] = []
        entropies: list[torch.Tensor] = []
        for start in range(0, input_ids.shape[0], chunk):
            ids = input_ids[start : start + chunk].to(device)
            mask = attention_mask[start : start + chunk].to(device)
            shared = None
            if prompt_lens is not None and vision is None:
                lens = prompt_lens[start : start + chunk]
                shared = self._score_shared(ids, mask, lens, temperature, with_entropy, entropy_grad)
            if shared is None:
                rows = None if vision is None else vision.select(slice(start, start + chunk)).to(device)
                shared = self._score(ids, mask, temperature, with_entropy, entropy_grad, from_column, rows)
            lp, ent = shared
            log_probs.append(lp)
            if ent is not None:
                entropies.append(ent)
        return torch.cat(log_probs), (torch.cat(entropies) if with_entropy else None)

    def _score(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool,
        from_column: int,
        vision: VisionBatch | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        full_len = ids.shape[1]
        # Trailing columns that are padding in every row need no forward pass.
        real_cols = mask.any(dim=0).nonzero()
        keep = int(real_cols[-1]) + 1 if real_cols.numel() else 1
        ids, mask = ids[:, :keep], mask[:, :keep]
        first = min(max(from_column, 0), keep - 1)
        images: dict[str, torch.Tensor] = {}
        if vision is not None and vision.image_grid_thw.numel():
            position_ids = rope_positions(self.model, ids, mask, vision.image_grid_thw)
            images = {"pixel_values": vision.pixel_values, "image_grid_thw": vision.image_grid_thw}
        else:
            position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
        # Column t is scored by position t's logits: only positions first .. keep-2 go through the LM head.
        logits = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=False,
            # Positions (not a count and a slice after): no [B, T, V] copy in the slice's backward.
            logits_to_keep=torch.arange(first, keep - 1, device=ids.device),
            **images,
        ).logits
        lp, ent = token_scores(
            logits,
            ids[:, first + 1 :],
            mask[:, first + 1 :],
            temperature,
            with_entropy,
            entropy_grad,
            self.banned_ids,
        )
        pad = (first, full_len - keep)
        if any(pad):
            lp = torch.nn.functional.pad(lp, pad)
            ent = None if ent is None else torch.nn.functional.pad(ent, pad)
        return lp, ent

    def _score_shared(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        prompt_lens: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """`_score` with each distinct prompt forwarded once (see `token_log_probs`); None when no two rows
        share one, or the model cannot return its cache (gradient checkpointing turns it off)."""
        rows, full_len = ids.shape
        lens = [int(n) for n in prompt_lens]
        owner: list[int] = []  # row -> its prompt's index among the distinct ones
        heads: list[int] = []  # distinct prompt -> the first row that has it
        seen: dict[tuple[int, bytes], int] = {}
        for i, n in enumerate(lens):
            key = (n, ids[i, :n].cpu().numpy().tobytes())
            if key not in seen:
                seen[key] = len(heads)
                heads.append(i)
            owner.append(seen[key])
        if len(heads) == rows or checkpointing(self.model):
            return None
        device = ids.device
        width = max(lens)
        # Distinct prompts, left-padded so every one ends at the same column.
        prompt_ids = torch.zeros((len(heads), width), dtype=ids.dtype, device=device)
        prompt_mask = torch.zeros((len(heads), width), dtype=mask.dtype, device=device)
        for g, i in enumerate(heads):
            prompt_ids[g, width - lens[i] :] = ids[i, : lens[i]]
            prompt_mask[g, width - lens[i] :] = 1
        # Responses, right-padded: row i's tokens after its prompt.
        totals = [int(t) for t in mask.sum(dim=1)]
        answer = max(1, max(t - n for t, n in zip(totals, lens, strict=True)))
        answer_ids = torch.zeros((rows, answer), dtype=ids.dtype, device=device)
        answer_mask = torch.zeros((rows, answer), dtype=mask.dtype, device=device)
        for i, (t, n) in enumerate(zip(totals, lens, strict=True)):
            answer_ids[i, : t - n] = ids[i, n:t]
            answer_mask[i, : t - n] = 1
        out = self.model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=(prompt_mask.long().cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
        )
        cache = output_cache(out)
        if cache is None:
            return None
        index = torch.tensor(owner, device=device)
        cache.reorder_cache(index)  # each row gets its prompt's keys and values (index_select: autograd)
        first_logits = out.logits[:, -1:][index]  # the prompt's last position scores answer token 0
        positions = torch.tensor(lens, device=device).unsqueeze(1) + torch.arange(answer, device=device)
        rest = self.model(
            input_ids=answer_ids,
            attention_mask=torch.cat([prompt_mask[index], answer_mask], dim=1),
            position_ids=positions,
            use_cache=True,
            logits_to_keep=torch.arange(answer - 1, device=device),  # as `_score`: positions, no slice
            **{cache_kwarg(self.model): cache},
        ).logits
        args = (temperature, with_entropy, entropy_grad, self.banned_ids)  # two parts: no [B, answer, V] cat
        lp, ent = token_scores(first_logits, answer_ids[:, :1], answer_mask[:, :1], *args)
        lp_rest, ent_rest = token_scores(rest, answer_ids[:, 1:], answer_mask[:, 1:], *args)
        lp = torch.cat([lp, lp_rest], dim=1)
        ent = None if ent is None or ent_rest is None else torch.cat([ent, ent_rest], dim=1)
        # Back to `_score`'s layout: answer token j of row i is column lens[i] - 1 + j of [B, L-1].
        columns = torch.tensor(lens, device=device).unsqueeze(1) - 1 + torch.arange(answer, device=device)
        columns = columns.clamp(max=full_len - 2)  # padding past the row's end is masked to 0 anyway
        placed = torch.zeros((rows, full_len - 1), dtype=lp.dtype, device=device)
        placed = placed.scatter_add(1, columns, lp)
        if ent is not None:
            ent = torch.zeros_like(placed).scatter_add(1, columns, ent)
        return placed, ent

    def state_dict_for_sampler(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Plain HF-named weights a sampler can load: LoRA deltas merged in, adapter tensors dropped.

        Merging is computed out of place, so the trainable model is never merged/unmerged (which would
        drift the frozen base weights by rounding every sync). Tensors are detached and may alias live
        parameters: copy them (as `load_state_dict` does) before the next optimizer step if kept.
        `state`: the whole model's state gathered from N learner ranks (named as `self.model.state_dict()`),
        read instead of the model's own (sharded) tensors.
        """
        if not self.is_lora:
            return {k: v.detach() for k, v in (self.model.state_dict() if state is None else state).items()}
        base = self.base_model()
        prefix = "base_model.model."  # peft's names of the base model's tensors
        if state is None:
            return merged_lora_weights(base, base.state_dict(), gathered=False)
        return merged_lora_weights(base, {k.removeprefix(prefix): v for k, v in state.items()}, gathered=True)

    def save_pretrained(
        self, directory: str | Path, state_dict: dict[str, torch.Tensor] | None = None
    ) -> Path:
        """Write a loadable HF model directory (safetensors + tokenizer).

        With LoRA the top-level weights are the merged model (so samplers and `from_pretrained` need no
        peft) and the adapter alone goes to `adapter/` (what `load_weights` restores when resuming).
        `state_dict`: the model's whole state gathered from N learner ranks, written instead of the model's
        own (sharded) tensors.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.is_lora:
            self.base_model().save_pretrained(directory, state_dict=self.state_dict_for_sampler(state_dict))
            self.peft_model().save_pretrained(str(directory / ADAPTER_DIR), state_dict=state_dict)
        elif state_dict is not None:
            self.base_model().save_pretrained(directory, state_dict=state_dict)
        else:
            self.base_model().save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        if self.processor is not None:
            save_processor(self.processor, directory)
        return directory

    def load_weights(self, directory: str | Path) -> None:
        """Restore the trainable weights from a `save_pretrained` directory into this (same-shaped) policy."""
        directory = Path(directory)
        if self.is_lora:
            adapter_file = directory / ADAPTER_DIR / "adapter_model.safetensors"
            adapter = load_file(adapter_file, device=str(self.device))
            self.load_adapter_state(adapter, directory)
            return
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(directory.glob("*.safetensors")):
            state.update(load_file(shard, device=str(self.device)))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # Tied weights (e.g. lm_head ↔ embed_tokens) are saved once; a missing key is fine only if it
        # shares storage with a tensor that was loaded.
        current = self.model.state_dict()
        loaded_ptrs = {current[k].data_ptr() for k in state if k in current}
        untied = [k for k in missing if current[k].data_ptr() not in loaded_ptrs]
        if unexpected or untied:
            raise ValueError(f"weights in {directory} do not fit: missing {untied}, unexpected {unexpected}")
