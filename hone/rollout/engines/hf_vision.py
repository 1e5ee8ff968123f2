"""The HF engine's image prompts: what a vision-language model's prefill adds to a text one.

Three rules, each what the trainer's forward does too (`Policy.token_log_probs`), so sampler and
trainer log-probs agree (to 5e-7 on the tiny Qwen2.5-VL, `tests/test_vision.py`):
- positions are the model's multimodal RoPE ones over the whole prompt (`rope_positions`); a decoded token
  continues from the prompt's largest position, on all three rows (text after an image does);
- the pixel values fed are those of the images whose tokens are in the part of the prompt being
  prefilled (a prefix-cache hit already holds the others' keys and values);
- the prefix cache knows an image by its pixels: each image's run of placeholder tokens is keyed as a
  token of its own derived from the image's hash (`cache_tokens`), so a stored sequence is reused only by
  a prompt with the same images where its tokens say so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hone.models.vision import rope_positions
from hone.types import VisionInputs


def image_spans(ids: list[int], vision: VisionInputs, image_token_id: int) -> list[tuple[int, int]]:
    """Each image's (first, end) token indices in `ids`: its share of the placeholder tokens, in order."""
    at = [k for k, token in enumerate(ids) if token == image_token_id]
    if len(at) != sum(vision.tokens_per_image):
        raise ValueError(f"{len(at)} image tokens in the prompt for images of {sum(vision.tokens_per_image)}")
    spans, start = [], 0
    for count in vision.tokens_per_image:
        spans.append((at[start], at[start + count - 1] + 1))
        start += count
    return spans


def cache_tokens(ids: list[int], vision: VisionInputs | None, image_token_id: int | None) -> list[int]:
    """`ids` as the prefix cache keys them: each image's placeholder tokens replaced by a negative id
    derived from that image's hash (negative: never a real token)."""
    if vision is None or image_token_id is None:
        return ids
    out = list(ids)
    for (first, end), key in zip(image_spans(ids, vision, image_token_id), vision.image_keys, strict=True):
        out[first:end] = [-1 - int(key[:15], 16)] * (end - first)
    return out


@dataclass
class VisionPrefill:
    """The extra inputs of one prefill batch: `position_ids` [3, U, width] and the fed images' pixel
    values and grids (None when every image is inside a reused prefix); `next_positions` [U]."""

    position_ids: torch.Tensor
    next_positions: torch.Tensor
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None


def vision_prefill(
    model: nn.Module,
    prompts: list[list[int]],
    visions: list[VisionInputs | None],
    reused: list[int],
    width: int,
    pad: int,
    image_token_id: int,
    device: torch.device,
) -> VisionPrefill:
    """Positions and images for prefilling `prompts[i][reused[i]:]`, left-padded to `width` columns."""
    full_width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (full_width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (full_width - len(p)) + [1] * len(p) for p in prompts], device=device)
    grids = [v.image_grid_thw for v in visions if v is not None]
    grid = torch.cat(grids).to(device) if grids else None
    full = rope_positions(model, ids, mask, grid)  # [3, U, full_width]
    positions = torch.zeros((3, len(prompts), width), dtype=full.dtype, device=device)
    pixels: list[torch.Tensor] = []
    fed_grids: list[torch.Tensor] = []
    for row, (prompt, vision, n) in enumerate(zip(prompts, visions, reused, strict=True)):
        fresh = len(prompt) - n
        positions[:, row, width - fresh :] = full[:, row, full_width - fresh :]
        if vision is None:
            continue
        start = 0  # walk the images in order: those whose tokens start at or after `n` are fed
        patches = vision.image_grid_thw.prod(-1).tolist()
        for image, (first, end) in enumerate(image_spans(prompt, vision, image_token_id)):
            if first >= n:
                pixels.append(vision.pixel_values[start : start + patches[image]])
                fed_grids.append(vision.image_grid_thw[image : image + 1])
            elif end > n:
                raise RuntimeError("prefix cache: a reused prefix ends inside an image's tokens")
            start += patches[image]
    real = mask.bool()
    next_positions = torch.stack([full[:, row][:, real[row]].max() for row in range(len(prompts))]) + 1
    return VisionPrefill(
        position_ids=positions,
        next_positions=next_positions,
        pixel_values=torch.cat(pixels).to(device) if pixels else None,
        image_grid_thw=torch.cat(fed_grids).to(device) if fed_grids else None,
    )
