"""Does scoring overlap sampling? One producer step of environment episodes of 1-4 turns whose reward is
a slow async judge. With scoring inside the episode (issue 29) an episode that ends early is graded while
the others still sample; before, every rollout was scored after the last one was sampled.

Stand-ins keep it about scheduling, not compute: a sampler whose every generate call sleeps 100 ms (one
call a turn, all live episodes batched), a judge of 150 ms per rollout, 16 at a time; 16 prompts x 4
episodes. Run it on each tree with PYTHONPATH (it prints the producer's median step and its sample and
reward times):

    PYTHONPATH=/tmp/hone-old .venv/bin/python bench/scoring_overlap.py before
    .venv/bin/python bench/scoring_overlap.py after
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from hone.config import load_config
from hone.envs.base import Environment, StepResult
from hone.models.tiny import build_byte_tokenizer
from hone.rewards import RewardScorer
from hone.rl.components import ProducerParts
from hone.rl.producer import Producer, ProducerSettings, PromptBatch
from hone.rollout.multiturn import EpisodeLimits, Episodes
from hone.types import Rollout, Sample

TOKENIZER = build_byte_tokenizer()


class SleepySampler:
    """Every call takes 100 ms, whatever its batch; each response is one token and the eos."""

    policy_version = 0
    eos_token_ids = frozenset({TOKENIZER.eos_token_id})

    def generate(self, requests: list[Any], params: Any) -> list[Rollout]:
        time.sleep(0.1)
        ids = [65, TOKENIZER.eos_token_id]
        return [
            Rollout(
                r.sample_id, r.group_id, [*r.prompt_ids, *ids], len(r.prompt_ids), [1, 1], [-0.1, -0.1], "A"
            )
            for r in requests
            for _ in range(params.n)
        ]

    def load_weights(self, *args: Any) -> None:
        pass


class Turns(Environment):
    """An episode of 1-4 turns (by the sample's number), no reward of its own."""

    def reset(self, sample: Sample) -> list[dict[str, Any]]:
        self.left = int(sample.id.split("-")[1]) % 4 + 1
        return [{"role": "user", "content": "go"}]

    def step(self, assistant_message: str) -> StepResult:
        self.left -= 1
        return StepResult([{"role": "user", "content": "again"}], done=self.left == 0)


async def judge(rollout: Rollout, sample: Sample) -> float:
    await asyncio.sleep(0.15)
    return 1.0


def main() -> None:
    samples = [Sample(f"s-{i}", prompt="go") for i in range(16)]
    cfg = load_config(None, ["rollout.n=4", "env.max_turns=4"])
    parts = ProducerParts(
        sampler=SleepySampler(),  # type: ignore[arg-type]
        tokenizer=TOKENIZER,
        processor=None,
        reward=RewardScorer(judge, max_concurrency=16),
        train_samples=samples,
        episodes=Episodes(Turns, EpisodeLimits(4, 8, 512)),
    )
    producer = Producer(parts, ProducerSettings.of(cfg))
    times, metrics = [], {}
    for step in range(5):
        t0 = time.perf_counter()
        metrics = producer.produce(PromptBatch(step=step, samples=samples)).metrics
        times.append(time.perf_counter() - t0)
    label = sys.argv[1] if len(sys.argv) > 1 else "this tree"
    print(
        f"{label}: produce {statistics.median(times):.3f} s/step (min {min(times):.3f}); "
        f"time/sample_s {metrics['time/sample_s']:.3f}, time/reward_s {metrics['time/reward_s']:.3f}"
    )


if __name__ == "__main__":
    main()
