"""SFT warm-start before RL: give the policy the answer format, stop on validation accuracy.

Stopping on accuracy rather than a step count matters: on the tiny model SFT accuracy jumps within a
few dozen steps, and the point of the demo is that RL, not SFT, does most of the work.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hone.config import HoneConfig
from hone.data import Task, load_samples
from hone.orchestration.evaluate import evaluate
from hone.orchestration.prompts import render_prompt
from hone.rewards import RewardFn, RewardScorer
from hone.rollout import Sampler
from hone.training.policy import Policy
from hone.training.sft import run_sft
from hone.types import Sample, SamplingParams

log = logging.getLogger("hone")


def sft_pairs(cfg: HoneConfig, task: Task | None) -> list[tuple[Sample, str]]:
    """(prompt sample, response text) pairs: from `sft.data` (prompt/response rows) or task demonstrations."""
    if cfg.sft.data is not None:
        rows = load_samples(cfg.sft.data, prompt_field="prompt", answer_field="response")
        return [(s, s.answer or "") for s in rows]
    if task is None:
        raise ValueError("sft.enabled with a dataset source needs sft.data (a prompt/response jsonl)")
    demos = task.train_samples(cfg.sft.examples, seed=cfg.run.seed + 7)
    return [(s, task.demonstration(s)) for s in demos]


def warm_start_sft(
    cfg: HoneConfig,
    policy: Policy,
    sampler: Sampler,
    pairs: list[tuple[Sample, str]],
    train_samples: list[Sample],
    reward: RewardScorer | RewardFn,
    out_dir: Path,
) -> dict[str, float]:
    val = train_samples[: cfg.sft.val_size]
    greedy = SamplingParams(
        n=1, temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens, stop=cfg.rollout.stop
    )

    def val_accuracy() -> float:
        return evaluate(sampler, policy.tokenizer, val, reward, greedy, chat_template=cfg.data.chat_template)[
            "eval/accuracy"
        ]

    history: list[dict[str, float]] = []

    def record(row: dict[str, float]) -> None:
        history.append(row)
        if "sft/eval" in row:
            log.info("SFT step %d: validation accuracy %.3f", row["step"], row["sft/eval"])

    texts = [(render_prompt(s, policy.tokenizer, cfg.data.chat_template), r) for s, r in pairs]
    result = run_sft(
        policy,
        texts,
        batch_size=cfg.sft.batch_size,
        lr=cfg.sft.lr,
        schedule="constant",
        max_steps=cfg.sft.max_steps,
        eval_fn=val_accuracy,
        eval_every=cfg.sft.eval_every,
        stop_at=cfg.sft.stop_at_accuracy,
        log=record,
        seed=cfg.run.seed,
    )
    policy.save_pretrained(out_dir)
    (out_dir / "sft_log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in history))
    log.info("SFT warm-start: %s", result)
    return result
