"""tinker-cookbook's RL training loop (`tinker_cookbook.rl.train.main`, 0.6.1) run against `hone serve tinker`
on the tiny model, with a small environment of its own kind (`Env`, `EnvGroupBuilder`, `RLDataset`).

Skipped where tinker-cookbook is not installed: it needs `tml-renderers>=0.4.1`, which the package index
this project installs from does not hold, so it goes in by hand (`pip install --no-deps
tinker-cookbook==0.6.1 blobfile chz pyrage termcolor`; docs/how-to/tinker.md). Its RL loop never imports
tml-renderers for a model that is not one of Thinking Machines' own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

tinker = pytest.importorskip("tinker")
pytest.importorskip("tinker_cookbook")
import chz  # noqa: E402
from tinker_cookbook import tokenizer_utils  # noqa: E402
from tinker_cookbook.rl import train  # noqa: E402
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult  # noqa: E402

from hone.models import resolve_model  # noqa: E402
from hone.tinker.server import TinkerServer  # noqa: E402

PROMPTS = ["a:", "b:", "c:", "d:"]
VOWELS = "aeiou"  # the reward: the share of a completion's tokens that are vowels
STEPS = 8


def tiny_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model("tiny", what="base_model"))


class VowelEnv(Env):
    """One episode: the prompt, one completion, its reward."""

    def __init__(self, prompt: list[int], vowels: frozenset[int]) -> None:
        self.prompt, self.vowels = prompt, vowels

    async def initial_observation(self) -> tuple[tinker.ModelInput, list[int]]:
        return tinker.ModelInput.from_ints(self.prompt), []  # no stop token: max_tokens each

    async def step(self, action: list[int], *, extra: Any = None) -> StepResult:
        reward = sum(t in self.vowels for t in action) / max(len(action), 1)
        empty = tinker.ModelInput.from_ints([])
        return StepResult(reward=reward, episode_done=True, next_observation=empty, next_stop_condition=[])


@dataclass(frozen=True)
class VowelGroup(EnvGroupBuilder):
    prompt: tuple[int, ...]
    vowels: frozenset[int]

    async def make_envs(self) -> Sequence[Env]:
        return [VowelEnv(list(self.prompt), self.vowels) for _ in range(8)]


class VowelDataset(RLDataset):
    def __init__(self, groups: list[VowelGroup]) -> None:
        self.groups = groups

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return self.groups  # the same four prompts every step

    def __len__(self) -> int:
        return STEPS


@chz.chz
class VowelDatasetBuilder(RLDatasetBuilder):
    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        tokenizer = tiny_tokenizer()
        vowels = frozenset(tokenizer.encode(VOWELS, add_special_tokens=False))
        prompts = [tuple(tokenizer.encode(p, add_special_tokens=False)) for p in PROMPTS]
        return VowelDataset([VowelGroup(p, vowels) for p in prompts]), None


def test_cookbook_rl_loop_trains_on_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-local")
    # The cookbook loads a tokenizer by model name: `tiny` is Hone's, not a hub name.
    tokenizer_utils.register_tokenizer("tiny", tiny_tokenizer)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with TinkerServer(
            tmp_path / "server", base_models=["tiny"], port=0, device="cpu", preload=True
        ) as srv:
            config = train.Config(
                learning_rate=5e-2,
                dataset_builder=VowelDatasetBuilder(),
                model_name="tiny",
                recipe_name="hone_tiny_vowels",
                max_tokens=6,
                log_path=str(tmp_path / "log"),
                eval_every=0,
                save_every=0,
                lora_rank=8,
                base_url=srv.url,
            )
            asyncio.run(train.main(config))
            rest = tinker.RestClient(base_url=srv.url, api_key="tml-local")
            (run,) = rest.list_training_runs().result().training_runs
            saved = rest.list_checkpoints(run.training_run_id).result().checkpoints
    finally:
        torch.set_num_threads(threads)
    metrics = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    rewards = [m["env/all/reward/total"] for m in metrics if "env/all/reward/total" in m]
    print(f"cookbook rl mean reward per step: {[round(r, 3) for r in rewards]}")
    assert len(rewards) == STEPS
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    # The cookbook's final save: its training state and sampler weights, both listed by the RestClient.
    assert sorted(c.checkpoint_id for c in saved) == ["sampler_weights/final", "weights/final"]
