"""Shared fixtures and builders: tiny models built locally (no hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from hone.models import build_tiny_model
from hone.verifiers import sandbox

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def sandbox_unavailable(isolation: sandbox.Isolation = "auto") -> str | None:
    """Why the code sandbox cannot run here in `isolation` mode (what to install), or None."""
    try:
        sandbox._interpreter(None, sandbox.resolve_isolation(isolation))
    except RuntimeError as e:
        return str(e)
    return None


# For tests that run programs in the sandbox: skipped, with what to install, on a machine without one.
needs_sandbox = pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable()))


def tiny_qwen2(*, train_mode: bool = False, **config: Any) -> transformers.Qwen2ForCausalLM:
    """A random 2-layer Qwen2 over a 32-token vocabulary; `config` overrides Qwen2Config fields.

    Weights come from torch's global RNG, so seed it first. In eval mode unless `train_mode`.
    """
    defaults: dict[str, Any] = {
        "vocab_size": 32,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "tie_word_embeddings": True,
    }
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**(defaults | config)))
    return model if train_mode else model.eval()


def char_tokenizer(
    chars: str = LETTERS + "=>", unk_token: str | None = "<unk>"
) -> transformers.PreTrainedTokenizerFast:
    """One token per character: <pad>=0, <eos>=1, then `unk_token` (if any), then `chars` in order."""
    specials = ["<pad>", "<eos>"] + ([unk_token] if unk_token is not None else [])
    vocab = {s: i for i, s in enumerate(specials)} | {c: i + len(specials) for i, c in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk_token))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    unk = {"unk_token": unk_token} if unk_token is not None else {}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", **unk
    )


@pytest.fixture(scope="session")
def micro_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~100k-parameter Qwen2 with the byte-level tokenizer, saved as an ordinary HF directory."""
    return build_tiny_model(
        tmp_path_factory.mktemp("micro-model"), hidden_size=64, num_layers=2, num_heads=2, head_dim=32
    )
