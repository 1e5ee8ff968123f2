"""Tiny randomly initialised causal LMs with a byte-level tokenizer that has no merges, built offline.

Why: tests, CI and examples need a real Hugging Face model directory (so every loader path is the one
used for real models) that builds in about a second without network access. One token per byte (so one
per character for ASCII) makes arithmetic-style tasks learnable by a ~1M-parameter model and token counts
predictable, and `decode(encode(text)) == text` for any text: no character is unknown or dropped.

Why byte-level BPE rather than WordLevel over characters: transformers 5 loads the tokenizer of a
`qwen2` model directory as `Qwen2Tokenizer`, which rebuilds the pipeline as byte-level BPE from the saved
vocab whatever `tokenizer.json` says. A byte-level BPE vocabulary with no merges means exactly the same
thing under that loader and under the generic one (used for `llama`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN)  # ids 0 and 1; byte b has id b + len(SPECIAL_TOKENS)

# Plain "role: content" lines. The eos after each assistant turn is what teaches a model to stop; the
# newline is emitted as an expression because the template loader trims newlines after block tags.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

_CONFIGS: dict[str, type[Qwen2Config] | type[LlamaConfig]] = {"qwen2": Qwen2Config, "llama": LlamaConfig}


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte value 0..255, the symbols byte-level BPE works on."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    remapped = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(remapped)) for b in range(256)]


def build_byte_tokenizer(max_length: int = 1024) -> PreTrainedTokenizerFast:
    """One token per byte: byte-level BPE with an all-bytes vocabulary and no merges, as Qwen2 loads it."""
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *_byte_symbols()])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.normalizer = normalizers.NFC()  # what Qwen2Tokenizer applies, so both loaders agree
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,  # never prepended (no post-processor); set for code that needs a bos id
        unk_token=None,
        clean_up_tokenization_spaces=False,  # the default clean-up would eat spaces before "," and "."
        model_max_length=max_length,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    *,
    arch: str = "qwen2",
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    head_dim: int = 32,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 1024,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised fp32 causal LM and its byte tokenizer to `out_dir`; return the path.

    The same arguments always give the same weights (`seed` drives a forked RNG, so the caller's global
    RNG state is untouched). `intermediate_size` defaults to 4 * hidden_size.
    """
    if arch not in _CONFIGS:
        raise ValueError(f"unknown tiny model arch {arch!r}; choose one of {sorted(_CONFIGS)}")
    tokenizer = build_byte_tokenizer(max_position_embeddings)
    # `head_dim` is a declared field of LlamaConfig only; Qwen2Config takes it through its **kwargs (its
    # attention reads `config.head_dim` when set), which its typed dataclass signature does not show.
    extra: dict[str, Any] = {"head_dim": head_dim}
    config = _CONFIGS[arch](
        **extra,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)  # safetensors is the default format
    tokenizer.save_pretrained(out)
    return out
