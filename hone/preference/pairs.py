"""`hone pairs`: on-policy preference pairs from a verifiable task, with no human label.

The recipe's model samples `rollout.n` responses to each of `pairs.prompts` training prompts; the recipe's
reward scores them; within each group the best responses are paired with the worst, `(chosen, rejected)`,
when their rewards differ by more than `pairs.min_margin`. This is the "self-rewarding"/RLAIF shortcut to
preference data (e.g. Pang et al. 2024, "Iterative Reasoning Preference Optimization", which pairs a
correct with an incorrect sampled chain of thought): DPO or a reward model then learns from pairs whose
labels came from the verifier.

Decisions:
- Pairing: a group's distinct responses sorted by reward; the k-th best goes with the k-th worst, each
  response used at most once, up to `pairs.per_prompt` pairs, a pair only when the rewards differ by more
  than `min_margin` (so two equally wrong answers never make a pair) and the texts differ; an empty
  response (eos at once) takes no part.
- Rows are TRL's preference format: `prompt`/`chosen`/`rejected`, conversational (`[{role, content}]`)
  when the recipe renders prompts through the chat template, plain strings otherwise, plus `answer` and
  the two rewards for inspection. `hone dpo` and `hone rm` read them as they are.
- A rollout whose reward failed (a verifier error or timeout) is left out: a failure is not a wrong answer.
- The file is written whole: to `<out>.partial`, renamed at the end, so an interrupted run never leaves a
  file that looks complete.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hone.config import HoneConfig
from hone.rewards import score_rollouts
from hone.rl.components import close_samplers
from hone.rl.producer import collect_rollouts, drop_failed_rewards, sampling_params
from hone.rollout.prompts import chat_messages
from hone.types import Rollout, Sample

log = logging.getLogger(__name__)


@dataclass
class PairsResult:
    path: Path
    prompts: int  # prompts sampled
    pairs: int  # pairs written
    groups_with_pair: int  # prompts that gave at least one pair
    mean_reward: float  # over every scored response


def pairs_from_group(
    rollouts: list[Rollout], per_prompt: int, min_margin: float
) -> list[tuple[Rollout, Rollout]]:
    """Up to `per_prompt` (chosen, rejected) pairs from one prompt's scored responses: the k-th best
    distinct response with the k-th worst, while their rewards differ by more than `min_margin`."""
    distinct: dict[str, Rollout] = {}
    for r in sorted(rollouts, key=lambda r: -r.reward):  # the best-scored copy of each text
        if r.response_text.strip():  # an empty response is no preference row (`hone dpo` refuses it)
            distinct.setdefault(r.response_text, r)
    ranked = list(distinct.values())
    pairs = []
    for k in range(min(per_prompt, len(ranked) // 2)):
        best, worst = ranked[k], ranked[-1 - k]
        if best.reward - worst.reward <= min_margin:
            break  # ranked: every later pair is closer still
        pairs.append((best, worst))
    return pairs


def pair_row(
    sample: Sample, chosen: Rollout, rejected: Rollout, conversational: bool, system_prompt: str | None = None
) -> dict[str, Any]:
    """A TRL-format preference row; a conversational one holds the chat the policy was prompted with."""
    row: dict[str, Any]
    if conversational:
        prompt = chat_messages(sample, True, system_prompt)
        row = {
            "prompt": prompt,
            "chosen": [{"role": "assistant", "content": chosen.response_text}],
            "rejected": [{"role": "assistant", "content": rejected.response_text}],
        }
    else:
        if sample.prompt is None:
            raise ValueError(f"sample {sample.id}: a chat prompt needs data.chat_template: true")
        row = {"prompt": sample.prompt, "chosen": chosen.response_text, "rejected": rejected.response_text}
    return row | {"answer": sample.answer, "chosen_reward": chosen.reward, "rejected_reward": rejected.reward}


def default_out(cfg: HoneConfig) -> Path:
    return Path(cfg.run.dir) / cfg.run.name / "pairs.jsonl"


def make_pairs(cfg: HoneConfig) -> PairsResult:
    """Sample, score and pair `cfg.pairs.prompts` training prompts (`cfg.data.prompts_per_step` a batch)."""
    import torch

    from hone.rl.components import setup_components

    if cfg.run.threads is not None:
        torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)
    if cfg.env.name is not None:
        raise ValueError("hone pairs: single-turn tasks only (env.name is set)")
    out = Path(cfg.pairs.out) if cfg.pairs.out else default_out(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = setup_components(cfg, reuse_model=True)  # nothing trains the policy: no copy for the sampler
    producer = parts.producer
    samples = producer.train_samples[: cfg.pairs.prompts]
    if len(samples) < cfg.pairs.prompts:
        log.warning("pairs: the training split has %d prompts, fewer than pairs.prompts", len(samples))
    partial = out.with_name(out.name + ".partial")
    written = groups_with_pair = 0
    reward_sum = scored = 0.0
    try:
        with partial.open("w") as f:
            size = cfg.data.prompts_per_step
            for step, start in enumerate(range(0, len(samples), size)):
                chunk = samples[start : start + size]
                rollouts = collect_rollouts(
                    producer, cfg.data, chunk, sampling_params(cfg.rollout, cfg.run.seed, step)
                )
                score_rollouts(rollouts, {s.id: s for s in chunk}, producer.reward)
                reward_sum += sum(r.reward for r in rollouts)
                scored += len(rollouts)
                rollouts, _ = drop_failed_rewards(rollouts)
                by_sample: dict[str, list[Rollout]] = defaultdict(list)
                for r in rollouts:
                    by_sample[r.sample_id].append(r)
                for sample in chunk:
                    pairs = pairs_from_group(by_sample[sample.id], cfg.pairs.per_prompt, cfg.pairs.min_margin)
                    groups_with_pair += bool(pairs)
                    for chosen, rejected in pairs:
                        row = pair_row(
                            sample, chosen, rejected, cfg.data.chat_template, cfg.data.system_prompt
                        )
                        f.write(json.dumps(row) + "\n")
                        written += 1
                log.info("pairs: %d/%d prompts, %d pairs", start + len(chunk), len(samples), written)
        if written == 0:
            raise ValueError(
                f"hone pairs: no pairs from {len(samples)} prompts (every group's rewards were within "
                f"pairs.min_margin={cfg.pairs.min_margin}); sample more (rollout.n) or hotter (temperature)"
            )
        os.replace(partial, out)
    finally:
        close_samplers(parts)
        partial.unlink(missing_ok=True)
    return PairsResult(out, len(samples), written, groups_with_pair, reward_sum / max(1.0, scored))
