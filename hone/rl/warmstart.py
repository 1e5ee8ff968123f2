"""SFT warm-start before RL: give the policy the answer format, stop on validation accuracy.

Stopping on accuracy rather than a step count matters: on the tiny model SFT accuracy jumps within a
few dozen steps, and the point of the demo is that RL, not SFT, does most of the work.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from hone.config import HoneConfig
from hone.data import Task, load_samples
from hone.data.splits import answer_needed_by_recipe, validation_samples
from hone.envs import env_reads_answer
from hone.rewards import RewardFn, RewardScorer
from hone.rl.components import RunComponents
from hone.rl.evaluate import evaluate
from hone.rl.placement.weights import WeightChannel
from hone.rollout import Sampler
from hone.rollout.multiturn import Episodes, demonstration_tokens
from hone.rollout.prompts import encode_prompt, render_prompt
from hone.training.distributed import ONE_RANK, Ranks
from hone.training.fit import FitSaves
from hone.training.policy import Policy
from hone.training.sft import ImageExample, run_sft
from hone.types import Sample, SamplingParams

log = logging.getLogger("hone")


@dataclass
class SFTData:
    """What SFT trains on: (prompt sample, response text) pairs, or tokenised multi-turn examples; and
    the held-out problems it validates on."""

    pairs: list[tuple[Sample, str]] = field(default_factory=list)
    examples: list[tuple[list[int], list[int]] | ImageExample] = field(default_factory=list)
    val: list[Sample] = field(default_factory=list)


def sft_data(cfg: HoneConfig, parts: RunComponents) -> SFTData:
    """Multi-turn runs without `sft.data` use the environment's scripted demonstrations, laid out token
    by token as episodes are (observations masked); everything else uses `sft_pairs`. Validation takes
    held-out problems that are neither RL training prompts nor eval problems (`validation_samples`)."""
    episodes = parts.episodes
    val = validation_samples(
        cfg.data,
        parts.task,
        parts.train_samples,
        parts.eval_samples,
        val_size=cfg.sft.val_size,
        make_env=None if episodes is None else episodes.make_env,
        env_args=cfg.env.args,
        answer_needed_by=answer_needed_by_recipe(
            cfg, env_reads_answer=env_reads_answer(cfg.env.name, cfg.env.args)
        ),
    )
    if episodes is None or cfg.sft.data is not None:
        return SFTData(pairs=sft_pairs(cfg, parts.task), val=val)
    env = episodes.make_env()
    demos = type(env).make_samples(cfg.sft.examples, cfg.run.seed + 7, "train", **cfg.env.args)
    examples: list[tuple[list[int], list[int]] | ImageExample] = []
    for sample in demos:
        player = episodes.make_env()
        examples.append(
            demonstration_tokens(
                parts.policy.tokenizer,
                player.demonstration(sample),
                player.tools,
                parts.sampler.eos_token_ids,
            )
        )
    return SFTData(examples=examples, val=val)


def sft_pairs(cfg: HoneConfig, task: Task | None) -> list[tuple[Sample, str]]:
    """(prompt sample, response text) pairs: from `sft.data` (prompt/response rows) or task demonstrations."""
    if cfg.sft.data is not None:
        rows = load_samples(cfg.sft.data, prompt_field="prompt", answer_field="response")
        return [(s, s.answer or "") for s in rows]
    if task is None:
        raise ValueError("sft.enabled with a dataset source needs sft.data (a prompt/response jsonl)")
    demos = task.train_samples(cfg.sft.examples, seed=cfg.run.seed + 7)
    return [(s, task.demonstration(s)) for s in demos]


@dataclass(frozen=True)
class SFTSettings:
    """What the SFT warm start reads from a recipe (`SFTSettings.of`)."""

    greedy: SamplingParams  # how validation samples
    chat_template: bool
    system_prompt: str | None
    batch_size: int
    micro_batch_size: int | None
    lr: float
    max_steps: int
    eval_every: int
    stop_at: float | None
    seed: int
    max_nonfinite_steps: int

    @classmethod
    def of(cls, cfg: HoneConfig) -> SFTSettings:
        return cls(
            greedy=SamplingParams(
                n=1, temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens, stop=cfg.rollout.stop
            ),
            chat_template=cfg.data.chat_template,
            system_prompt=cfg.data.system_prompt,
            batch_size=cfg.sft.batch_size,
            micro_batch_size=cfg.sft.micro_batch_size or cfg.trainer.micro_batch_size,
            lr=cfg.sft.lr,
            max_steps=cfg.sft.max_steps,
            eval_every=cfg.sft.eval_every,
            stop_at=cfg.sft.stop_at_accuracy,
            seed=cfg.run.seed,
            max_nonfinite_steps=cfg.trainer.max_nonfinite_steps,
        )


class SFTRanks(Protocol):
    """Rank 0's side of an SFT warm start on N learner ranks (`learner_ranks.LeadRanks`)."""

    ranks: Ranks

    def begin_sft(self, texts: list[tuple[str, str]], data: SFTData, settings: SFTSettings) -> WeightChannel:
        """Tell the other ranks to train; shard the policy; the channel that publishes gathered weights."""
        ...

    def gathered_state(self) -> AbstractContextManager[dict[str, torch.Tensor]]:
        """Every rank gathers (the others as their `train_sft` reaches the same point): the whole state."""
        ...

    def share_score(self, score: float) -> float:
        """Rank 0's validation score, sent to the other ranks (their `eval_fn` returns it)."""
        ...


def train_sft(
    settings: SFTSettings,
    policy: Policy,
    texts: list[tuple[str, str]],
    data: SFTData,
    eval_fn: Callable[[], float],
    *,
    log: Callable[[dict[str, float]], None] | None = None,
    deadline: float | None = None,
    ranks: Ranks = ONE_RANK,
    saves: FitSaves | None = None,
) -> dict[str, Any]:
    """`run_sft` with the warm start's settings: what every learner rank runs."""
    return run_sft(
        policy,
        texts,
        examples=data.examples,
        batch_size=settings.batch_size,
        micro_batch_size=settings.micro_batch_size,
        lr=settings.lr,
        schedule="constant",
        max_steps=settings.max_steps,
        eval_fn=eval_fn,
        eval_every=settings.eval_every,
        stop_at=settings.stop_at,
        log=log,
        seed=settings.seed,
        deadline=deadline,
        max_nonfinite_steps=settings.max_nonfinite_steps,
        ranks=ranks,
        saves=saves,
    )


def image_example(sample: Sample, response: str, policy: Policy, settings: SFTSettings) -> ImageExample:
    """A demonstration with images: the prompt as sampling encodes it (images expanded), the response's
    tokens and the eos after it trained on."""
    ids, vision = encode_prompt(
        sample, policy.tokenizer, settings.chat_template, settings.system_prompt, policy.processor
    )
    assert vision is not None  # the sample has images
    eos = policy.tokenizer.eos_token_id
    if eos is None:
        raise ValueError("SFT needs a tokenizer with an eos token so the model learns to stop")
    answer = policy.tokenizer(response, add_special_tokens=False).input_ids
    return ImageExample([*ids, *answer, eos], len(ids), vision)


def warm_start_sft(
    settings: SFTSettings,
    policy: Policy,
    sampler: Sampler,
    data: SFTData,
    reward: RewardScorer | RewardFn,
    out_dir: Path,
    episodes: Episodes | None = None,
    *,
    deadline: float | None = None,
    weights: WeightChannel,
    on_ranks: SFTRanks | None = None,
    saves: FitSaves | None = None,
    on_row: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """SFT on `data` until validation accuracy on `data.val` reaches `settings.stop_at`, `max_steps` or
    `deadline` (a `time.perf_counter()` value: the run's wall-time budget); saves to `out_dir`.
    `sampler` validates: `weights` publishes the policy's SFT weights to it, as version 0 (RL has not
    started), before each validation and once SFT ends. `on_ranks`: rank 0 of N learner ranks, which
    train together (each its share of every batch); rank 0 validates and saves the gathered weights.
    `saves`: SFT's own checkpoints and resume (`hone sft`); `on_row` receives every logged row too."""
    texts = [
        (render_prompt(s, policy.tokenizer, settings.chat_template, settings.system_prompt), r)
        for s, r in data.pairs
        if not s.images
    ]
    images = [image_example(s, r, policy, settings) for s, r in data.pairs if s.images]
    if images:  # prompts with images are encoded with the processor here, and travel as examples
        data = SFTData(pairs=data.pairs, examples=[*data.examples, *images], val=data.val)
    if on_ranks is not None:
        weights = on_ranks.begin_sft(texts, data, settings)

    def val_accuracy() -> float:
        with on_ranks.gathered_state() if on_ranks is not None else contextlib.nullcontext():
            weights.publish(0)
        score = evaluate(
            sampler,
            policy.tokenizer,
            data.val,
            reward,
            settings.greedy,
            chat_template=settings.chat_template,
            system_prompt=settings.system_prompt,
            episodes=episodes,
            processor=policy.processor,
        )["eval/accuracy"]
        return score if on_ranks is None else on_ranks.share_score(score)

    history: list[dict[str, float]] = []

    def record(row: dict[str, float]) -> None:
        history.append(row)
        if on_row is not None:
            on_row(row)
        if "sft/eval" in row:
            log.info("SFT step %d: validation accuracy %.3f", row["step"], row["sft/eval"])

    ranks = ONE_RANK if on_ranks is None else on_ranks.ranks
    result = train_sft(
        settings, policy, texts, data, val_accuracy, log=record, deadline=deadline, ranks=ranks, saves=saves
    )
    if result["out_of_time"]:
        log.warning("SFT stopped at the run's time limit after %d steps", result["steps"])
    with on_ranks.gathered_state() if on_ranks is not None else contextlib.nullcontext() as state:
        weights.publish(0)
        policy.save_pretrained(out_dir, state_dict=state)
    (out_dir / "sft_log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in history))
    log.info("SFT warm-start: %s", result)
    return result
