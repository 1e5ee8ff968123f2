"""The engine registry: `rollout.engine` names a registered engine, and a new one (an SGLang-shaped test
double, tests/sglang_engine_for_tests.py) is one module plus one registry line, through a whole run; what
an engine declares (`EngineCapabilities`), not its name, decides the keys only some engines honour."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from safetensors.torch import load_file

from hone.config import ConfigError, load_config
from hone.rl.components import build_components, close_samplers
from hone.rl.loop import train
from hone.rollout import GenerationRequest, Sampler
from hone.rollout.engines import ENGINES, EngineCapabilities, get_engine
from hone.rollout.engines.hf import HFSampler
from hone.rollout.engines.hf_engine import HFEngine
from hone.types import SamplingParams
from tests.helpers import tiny_overrides
from tests.sglang_engine_for_tests import SGLANG, SGLangEngine, SGLangSampler


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


def test_each_engine_class_declares_what_its_registry_line_does() -> None:
    assert get_engine("hf").capabilities == ENGINES["hf"].capabilities
    from hone.rollout.engines.vllm import VLLMEngine  # the client side only: no vLLM is started

    assert VLLMEngine.capabilities == ENGINES["vllm"].capabilities


def test_a_registry_line_that_disagrees_with_its_class_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENGINES, "sglang", replace(SGLANG, capabilities=EngineCapabilities(fingerprint=True)))
    with pytest.raises(
        ValueError, match=r"^rollout\.engine 'sglang': .* declares capabilities .* registered "
    ):
        get_engine("sglang")


ASYNC_INTERRUPTIBLE = ["cluster.mode=async", "rollout.interruptible=true"]


def test_rollout_interruptible_follows_what_the_engine_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the name `hf`: an engine declaring `interruptible` is accepted, one without it refused."""
    monkeypatch.setitem(ENGINES, "sglang", SGLANG)
    with pytest.raises(ConfigError, match=r"rollout\.interruptible needs .*rollout\.engine: hf and"):
        load_config(None, [*ASYNC_INTERRUPTIBLE, "rollout.engine=sglang"])
    takes_mid_generation = replace(SGLANG, capabilities=EngineCapabilities(interruptible=True))
    monkeypatch.setitem(ENGINES, "sglang", takes_mid_generation)
    assert load_config(None, [*ASYNC_INTERRUPTIBLE, "rollout.engine=sglang"]).rollout.interruptible
    with pytest.raises(ConfigError, match=r"rollout\.engine: hf \| sglang and cluster\.backend: local"):
        load_config(None, [*ASYNC_INTERRUPTIBLE, "rollout.engine=sglang", "cluster.backend=ray"])


def test_rollout_dtype_needs_an_engine_that_declares_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENGINES, "sglang", SGLANG)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.engine=sglang", "rollout.dtype=bfloat16"])
    message = str(err.value)
    assert "\n" not in message
    assert message.endswith(
        "rollout.dtype: bfloat16 needs an engine that casts its weights (hf); the sglang "
        "engine samples in model.dtype"
    )
    monkeypatch.setitem(
        ENGINES, "sglang", replace(SGLANG, capabilities=EngineCapabilities(dtype_override=True))
    )
    assert load_config(None, ["rollout.engine=sglang", "rollout.dtype=bfloat16"]).rollout.dtype == "bfloat16"


@pytest.mark.system  # a fresh interpreter in a subprocess
def test_validating_a_recipe_loads_no_engine_and_no_placement() -> None:
    """`hone.config` reads the registries' declarations only: no transformers, vLLM client, ray, run code."""
    loaded = ["transformers", "ray", "hone.rollout.engines.hf_engine", "hone.rollout.engines.vllm"]
    loaded += ["hone.rl.placement.build", "hone.rl.components"]
    code = (
        "import sys; from hone.config import load_config; "
        "load_config(None, ['rollout.engine=vllm', 'cluster.backend=ray']); "
        f"print([m for m in {loaded!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


UNVERIFIED = "only the version number of each weight load is checked"


@pytest.mark.parametrize(
    ("engine", "verify", "warned"), [("sglang", True, 1), ("sglang", False, 0), ("hf", True, 0)]
)
def test_verify_weights_without_a_fingerprint_says_so_once_at_start(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    micro_model_dir: Path,
    engine: str,
    verify: bool,
    warned: int,
) -> None:
    """An engine that reports no fingerprint: `trainer.verify_weights` checks only each load's version,
    and the run says so in one line as it builds its sampler, not silently."""
    monkeypatch.setitem(ENGINES, "sglang", SGLANG)
    monkeypatch.setattr(SGLangEngine, "built", [])
    extra = {"rollout.engine": engine, "trainer.verify_weights": verify}
    cfg = load_config(None, tiny_overrides(tmp_path, micro_model_dir, "parts", **extra))
    with caplog.at_level(logging.WARNING):
        parts = build_components(cfg)
    try:
        parts.weights.publish(1)  # a verified load: no further line
    finally:
        close_samplers(parts)
    lines = [r.getMessage() for r in caplog.records if UNVERIFIED in r.getMessage()]
    assert len(lines) == warned
    if warned:
        assert lines[0].startswith(
            "trainer.verify_weights: the 'sglang' engine reports no weight fingerprint"
        )
