"""Vision-language models (the Qwen2-VL family first): the processor, prompt encoding and mRoPE positions.

Where the pieces come from, so every engine and the trainer agree: a prompt's images go through the
model's own processor once (`encode_images`), which resizes them by the processor's rules and expands
each image placeholder into its `t*h*w / merge**2` image tokens; the resulting ids are the prompt's ids
everywhere (sampler, trainer, checkpoints). Positions are the model's multimodal RoPE ones
(`rope_positions`, the model's own `get_rope_index`): plain 1-D positions changed log-probs by 2e-3 on
image prompts even on a random tiny model, the peers' most reported VLM bug (ROLL #104).

The vision special tokens (image/video pads, vision start/end) are never sampled: a policy that emits
`<|image_pad|>` in its response makes the next forward count an image the batch does not have ("Image
features and image tokens do not match", verl #1640). `vision_token_ids` lists them; the sampler masks
them out and the trainer scores with the same mask, so the two log-probs stay comparable.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, PreTrainedConfig
from transformers.processing_utils import ProcessorMixin

from hone.types import VisionInputs

# The config keys of the token ids a VLM reserves for its vision inputs (Qwen2-VL family names).
_VISION_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def is_vision_config(config: Any) -> bool:
    """Whether a model config (object or `config.json` dict) is a vision-language model's."""
    if isinstance(config, dict):
        return "vision_config" in config
    return getattr(config, "vision_config", None) is not None


def is_vision_model_dir(path: str | Path) -> bool:
    """Whether the model directory `path` holds a vision-language model (by its `config.json`)."""
    config = Path(path) / "config.json"
    return config.is_file() and is_vision_config(json.loads(config.read_text()))


def vision_token_ids(config: Any) -> list[int]:
    """The ids a vision-language model reserves for image and video inputs (none for a text model)."""
    if not is_vision_config(config):
        return []
    values = (getattr(config, key, None) for key in _VISION_TOKEN_KEYS)
    return sorted({int(v) for v in values if v is not None})


@contextmanager
def _without_video_processor() -> Iterator[None]:
    """Let a processor be built with no video processor: transformers checks each part's class, and the
    Qwen2-VL video processor needs torchvision, which Hone does not require (images only)."""
    check = ProcessorMixin.check_argument_for_proper_class

    def lenient(self: ProcessorMixin, name: str, arg: Any) -> Any:
        return None if arg is None else check(self, name, arg)

    ProcessorMixin.check_argument_for_proper_class = lenient  # type: ignore[method-assign]
    try:
        yield
    finally:
        ProcessorMixin.check_argument_for_proper_class = check  # type: ignore[method-assign]


def load_processor(path: str | Path) -> ProcessorMixin:
    """The model's processor (`AutoProcessor.from_pretrained`). Without torchvision, the Qwen2-VL family's
    video processor cannot load and `AutoProcessor` raises: the processor is then assembled from its
    image processor and tokenizer alone, which is all image prompts need."""
    try:
        processor = AutoProcessor.from_pretrained(str(path))
    except ImportError as e:
        if "torchvision" not in str(e).lower():
            raise
        processor = _assemble_processor(_local_dir(path))
    if not isinstance(processor, ProcessorMixin):
        raise TypeError(
            f"{path}: AutoProcessor gave a {type(processor).__name__}, not a multimodal processor"
        )
    return processor


def _local_dir(path: str | Path) -> Path:
    """A model directory, or a hub name's snapshot of the processor's files (the hub cache offline)."""
    if Path(path).is_dir():
        return Path(path)
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.jinja", "*.txt", "*.model"]
    return Path(snapshot_download(str(path), allow_patterns=patterns))


def _assemble_processor(path: Path) -> ProcessorMixin:
    import transformers

    settings_file = path / "processor_config.json"
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    name = settings.get("processor_class") or json.loads((path / "preprocessor_config.json").read_text()).get(
        "processor_class"
    )
    processor_class = getattr(transformers, str(name), None)
    if processor_class is None:
        raise ValueError(f"{path}: no processor class named {name!r} in transformers")
    template_file = path / "chat_template.jinja"
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    template = template_file.read_text() if template_file.is_file() else tokenizer.chat_template
    with _without_video_processor():
        built = processor_class(
            image_processor=AutoImageProcessor.from_pretrained(str(path)),
            tokenizer=tokenizer,
            video_processor=None,
            chat_template=template,
        )
    return built


def save_processor(processor: ProcessorMixin, directory: str | Path) -> None:
    """Write `processor` beside a model's weights so `load_processor` reads it back: whole when it can
    be saved, else (no video processor, as `load_processor` builds it) its image processor, tokenizer,
    chat template and class name."""
    directory = Path(directory)
    try:
        processor.save_pretrained(str(directory))
        return
    except (AttributeError, ImportError):
        pass
    processor.image_processor.save_pretrained(str(directory))
    processor.tokenizer.save_pretrained(str(directory))
    (directory / "processor_config.json").write_text(
        json.dumps({"processor_class": type(processor).__name__}, indent=2) + "\n"
    )
    if processor.chat_template:
        (directory / "chat_template.jinja").write_text(str(processor.chat_template))


def encode_images(
    processor: ProcessorMixin, text: str, images: Sequence[Any], *, add_special_tokens: bool = True
) -> tuple[list[int], VisionInputs]:
    """The ids of the rendered prompt `text` (each image placeholder expanded to the image's tokens) and
    its images' `VisionInputs`. Raises ValueError when `text`'s placeholders and `images` disagree.
    `add_special_tokens=False` for a piece in the middle of a sequence (a multi-turn observation): no BOS."""
    out = processor(
        text=[text], images=list(images), return_tensors="pt", add_special_tokens=add_special_tokens
    )
    pixel_values = out["pixel_values"]
    grid = out["image_grid_thw"].long()
    keys, start = [], 0
    for thw in grid.tolist():
        patches = thw[0] * thw[1] * thw[2]
        digest = hashlib.sha256(str(thw).encode())
        digest.update(pixel_values[start : start + patches].float().contiguous().numpy().tobytes())
        keys.append(digest.hexdigest())
        start += patches
    ids = [int(i) for i in out["input_ids"][0]]
    merge = int(getattr(processor.image_processor, "merge_size", 1))
    counts = tuple(int(t * h * w) // merge**2 for t, h, w in grid.tolist())
    pngs = []
    for image in images:  # the originals, for an engine that runs its own processor (vLLM)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        pngs.append(buffer.getvalue())
    vision = VisionInputs(
        pixel_values=pixel_values,
        image_grid_thw=grid,
        image_keys=tuple(keys),
        tokens_per_image=counts,
        images=tuple(pngs),
    )
    return ids, vision


def image_placeholders(processor: ProcessorMixin, text: str) -> int:
    """How many image placeholders the rendered prompt `text` holds (each takes one image)."""
    token = getattr(processor, "image_token", None)
    return text.count(str(token)) if token else 0


def _rope_owner(model: nn.Module) -> nn.Module:
    """The submodule with the model's `get_rope_index` (under a LoRA or FSDP wrapper too)."""
    for module in model.modules():
        if callable(getattr(module, "get_rope_index", None)):
            return module
    raise TypeError(f"{type(model).__name__} has no get_rope_index: not a Qwen2-VL-family model")


def rope_positions(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
) -> torch.Tensor:
    """The multimodal RoPE positions [3, B, L] of `input_ids` [B, L] (padding on either side, images as
    their expanded tokens, `image_grid_thw` the rows' images in order), by the model's own rule."""
    owner = _rope_owner(model)
    config = owner.config
    mm_types = torch.zeros_like(input_ids, dtype=torch.int)
    image_id = getattr(config, "image_token_id", None)
    if image_id is not None:
        mm_types[input_ids == image_id] = 1
    positions, _ = owner.get_rope_index(  # type: ignore[operator]
        input_ids, mm_types, image_grid_thw=image_grid_thw, attention_mask=attention_mask
    )
    return positions


def language_lora_targets(model: nn.Module) -> str:
    """LoRA's `target_modules` for the language model of a VLM only (a regex peft matches whole names):
    every linear layer outside the vision tower, as `all-linear` would pick them, the LM head excepted."""
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and "visual" not in name and not name.endswith("lm_head")
    }
    return rf"^(?!.*visual).*\.({'|'.join(sorted(names))})$"


def freeze_vision_tower(model: nn.Module) -> int:
    """Stop training the vision tower (`model.freeze_vision`); returns how many parameters it froze."""
    frozen = 0
    for name, param in model.named_parameters():
        if ".visual." in f".{name}" and param.requires_grad:
            param.requires_grad_(False)
            frozen += param.numel()
    if not frozen:
        raise ValueError(
            f"model.freeze_vision: {type(model).__name__} has no vision tower ('visual') to freeze"
        )
    return frozen


def ban_tokens(logits: torch.Tensor, banned_ids: torch.Tensor) -> torch.Tensor:
    """`logits` with the `banned_ids` columns at the dtype's lowest value (in place without a graph): their
    probability is exactly 0, and unlike -inf, `p * z` in an entropy stays 0 rather than NaN. The sampler
    bans with this very function."""
    low = torch.finfo(logits.dtype).min
    banned = banned_ids.to(logits.device)
    return logits.index_fill(-1, banned, low) if logits.requires_grad else logits.index_fill_(-1, banned, low)


def text_config(config: PreTrainedConfig) -> PreTrainedConfig:
    """The language model's config of a VLM (its `text_config`), or `config` itself for a text model."""
    inner = getattr(config, "text_config", None)
    return inner if isinstance(inner, PreTrainedConfig) else config
