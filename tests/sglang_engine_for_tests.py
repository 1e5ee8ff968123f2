"""An SGLang-shaped engine, as a test double. What a new engine adds to Hone is a module like this one
(an `Engine`: `build` a `Sampler`, name its `weight_source`, declare its `capabilities`) and one
`register_engine` line (`hone.rollout.engines`); tests/test_engines.py adds that line (`SGLANG`) with
`monkeypatch.setitem`.

Shaped like an out-of-process engine (SGLang, vLLM): it starts from the model *directory*, not from the
trainer's model object, and a publish sends it the whole HF-named state dict with LoRA merged
(`Policy.state_dict_for_sampler`), which it loads in place. Hone's HF sampler over its own model stands
in for the server.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from transformers import AutoModelForCausalLM

from hone.config import RolloutConfig
from hone.rollout import GenerationRequest, HFSampler
from hone.rollout.engines import EngineCapabilities, ModelFiles, RegisteredEngine, TrainedModel, WeightSource
from hone.types import Rollout, SamplingParams


class SGLangSampler:
    """A `Sampler` holding its own model loaded from `model_dir`; it records every weight load."""

    def __init__(self, model_dir: str, tokenizer: Any, dtype: str) -> None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self._server = HFSampler(model, tokenizer)
        self.policy_version = 0
        self.loads: list[tuple[int, frozenset[str]]] = []  # (version, the tensor names it was sent)
        self.closed = False

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._server.eos_token_ids

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]:
        return self._server.generate(requests, params)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.loads.append((version, frozenset(state_dict)))
        self._server.load_weights(state_dict, version)
        self.policy_version = version

    def close(self) -> None:  # an engine process of its own would stop here
        self.closed = True


class SGLangEngine:
    """`rollout.engine: sglang` (once registered). It declares nothing beyond the core: it samples in
    `model.dtype`, takes weights only between calls and reports no fingerprint (only the version of a
    load can be verified)."""

    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities()
    built: ClassVar[list[SGLangSampler]] = []

    def build(self, rollout: RolloutConfig, policy: TrainedModel, files: ModelFiles) -> SGLangSampler:
        sampler = SGLangSampler(files.path, policy.tokenizer, files.dtype)
        SGLangEngine.built.append(sampler)
        return sampler

    def weight_source(self, policy: TrainedModel) -> WeightSource:
        return policy.state_dict_for_sampler


# Its registry line, as `register_engine("sglang", ...)` would add it: tests put it in `ENGINES` with
# `monkeypatch.setitem`, so it goes again after each test.
SGLANG = RegisteredEngine("tests.sglang_engine_for_tests:SGLangEngine", SGLangEngine.capabilities)
