"""Generation engines behind one `Sampler` interface (the trainer never knows which one runs); the
engines themselves live in `hone.rollout.engines`, registered by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hone.rollout.base import GenerationRequest, Sampler, eos_token_ids

if TYPE_CHECKING:
    from hone.rollout.engines.hf import HFSampler

__all__ = ["GenerationRequest", "HFSampler", "Sampler", "eos_token_ids"]


def __getattr__(name: str) -> Any:
    """`HFSampler` on first use: it imports transformers (seconds), which checking a recipe's
    `rollout.engine` against the engine registry must not wait for."""
    if name == "HFSampler":
        from hone.rollout.engines.hf import HFSampler

        return HFSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
