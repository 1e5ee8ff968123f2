"""The engine registry: `rollout.engine` names a registered engine, and a new one (an SGLang-shaped test
double, tests/sglang_engine_for_tests.py) is one module plus one registry line, through a whole run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from hone.config import ConfigError, load_config
from hone.rl.components import build_components, close_samplers
from hone.rl.loop import train
from hone.rollout import GenerationRequest, Sampler
from hone.rollout.engines import ENGINES, get_engine
from hone.rollout.engines.hf import HFEngine, HFSampler
from hone.types import SamplingParams
from tests.helpers import tiny_overrides
from tests.sglang_engine_for_tests import SGLangEngine, SGLangSampler

SGLANG = "tests.sglang_engine_for_tests:SGLangEngine"


def test_an_unknown_engine_is_one_line_naming_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.engine: unknown engine 'sglang'; registered: hf, vllm$"):
        load_config(None, ["rollout.engine=sglang"])
    assert isinstance(get_engine("hf"), HFEngine)


def test_a_registered_engine_builds_the_runs_sampler_and_takes_its_publishes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, micro_model_dir: Path
) -> None:
    monkeypatch.setitem(ENGINES, "sglang", SGLANG)  # the one registry line
    monkeypatch.setattr(SGLangEngine, "built", [])
    cfg = load_config(
        None, tiny_overrides(tmp_path, micro_model_dir, "parts", **{"rollout.engine": "sglang"})
    )
    parts = build_components(cfg)
    try:
        sampler = parts.sampler
        assert isinstance(sampler, SGLangSampler) and isinstance(sampler, Sampler)
        tokenizer = parts.policy.tokenizer
        assert tokenizer is not None
        request = GenerationRequest("s0", 0, tokenizer("1+2=")["input_ids"])
        rollouts = sampler.generate([request], SamplingParams(n=2, max_new_tokens=4, seed=0))
        assert [r.policy_version for r in rollouts] == [0, 0] and all(r.token_ids for r in rollouts)
        parts.weights.publish(1)  # the engine's own weight source: the whole state dict, LoRA merged
        every_tensor = frozenset(parts.policy.state_dict_for_sampler())
        assert sampler.loads == [(1, every_tensor)] and sampler.policy_version == 1
    finally:
        close_samplers(parts)
    assert sampler.closed


def test_a_run_on_a_registered_engine_trains_as_the_hf_engine_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, micro_model_dir: Path
) -> None:
    """The double samples with the HF sampler over weights it loads itself, so a run on it must end on
    the very weights a run on `hf` does: every publish reached it, whole, in order."""
    monkeypatch.setitem(ENGINES, "sglang", SGLANG)
    monkeypatch.setattr(SGLangEngine, "built", [])
    finals = {}
    for engine in ("hf", "sglang"):
        extra = {"rollout.engine": engine, "run.steps": 2, "run.save_every": 2, "run.eval_every": 0}
        train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, engine, **extra)))
        model_dir = tmp_path / engine / "checkpoints" / "step-2" / "model"
        finals[engine] = {
            f"{f.name}/{k}": v for f in model_dir.rglob("*.safetensors") for k, v in load_file(f).items()
        }
        rows = [json.loads(line) for line in (tmp_path / engine / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    (sampler,) = SGLangEngine.built
    assert [version for version, _ in sampler.loads] == [1, 2] and sampler.closed
    assert finals["hf"] and finals["hf"].keys() == finals["sglang"].keys()
    assert all(finals["hf"][k].equal(finals["sglang"][k]) for k in finals["hf"])


def test_the_hf_sampler_is_a_sampler(micro_model_dir: Path) -> None:
    """`Sampler.eos_token_ids` is read-only: `HFSampler`'s property satisfies it (what mypy checks)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(micro_model_dir)
    sampler: Sampler = HFSampler(model, AutoTokenizer.from_pretrained(micro_model_dir))
    assert isinstance(sampler, Sampler) and sampler.eos_token_ids
