"""Shared fixtures: a tiny model built locally (no hub), once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from hone.models import build_tiny_model


@pytest.fixture(scope="session")
def micro_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~100k-parameter Qwen2 with the byte-level tokenizer, saved as an ordinary HF directory."""
    return build_tiny_model(
        tmp_path_factory.mktemp("micro-model"), hidden_size=64, num_layers=2, num_heads=2, head_dim=32
    )
