"""Generation engines behind one `Sampler` interface (the trainer never knows which one runs)."""

from hone.rollout.base import GenerationRequest, Sampler, eos_token_ids
from hone.rollout.hf import HFSampler

__all__ = ["GenerationRequest", "HFSampler", "Sampler", "eos_token_ids"]
