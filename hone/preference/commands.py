"""`hone dpo` and `hone rm`: preference training runs, set up and logged as RL runs are.

Everything that can fail on bad input (the preference file and its rows, the model path, a loss's
hyper-parameters) is checked before any model trains, with one line naming the file, row or key
(`--dry-run`: only that, nothing written; `hone.preference.dry_run`). A run is a `RunSession`'s: it
writes `runs/<name>/config.yaml`, `metrics.jsonl` (and TensorBoard), checkpoints every `run.save_every`
steps (and where it stops: the time limit, Ctrl-C, SIGTERM) that `--resume` goes on from exactly,
`summary.json`, and the trained model in `runs/<name>/model`, a plain HF directory: DPO's is a causal LM
(`model.path=runs/<name>/model` to go on with RL), the reward model's is what `reward.fn: reward_model`
with `reward.args.path` loads.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.algorithms import DEFAULT_BETA, REFERENCE_FREE
from hone.config import DPOConfig, HoneConfig, PreferenceDataConfig, RMConfig
from hone.data import HoneDataError, PreferencePair, load_preferences
from hone.models import resolve_model
from hone.rewards.model import encode_scored_text, load_tokenizer, resolve_device, resolve_dtype, scored_text
from hone.rl.components import setup_components, weight_channel
from hone.rl.evaluate import EvalSettings, eval_line, run_eval
from hone.rl.loop import step_callbacks
from hone.rl.ranks.learners import GatheredWeights
from hone.rollout.prompts import render_prompt
from hone.run.lifecycle import SetupError
from hone.run.session import RunSession
from hone.tracking import MetricsLogger, Progress
from hone.tracking.progress import PREFERENCE
from hone.training.distributed import ONE_RANK, Ranks, copy_from_rank0, full_state_dict, shard
from hone.training.dpo import DPOSettings, encode_preference, run_dpo
from hone.training.models import check_tokenizer, load_policy, load_reference
from hone.training.policy import disable_dropout, enable_checkpointing
from hone.training.reward_model import (
    EncodedComparison,
    RMSettings,
    ScoreModelPart,
    load_score_model,
    run_reward_model,
)

log = logging.getLogger("hone")

MODEL_DIR = "model"
CDPO_LABEL_SMOOTHING = 0.1  # Mitchell 2023's examples and TRL's docs use ε = 0.1
SIMPO_GAMMA = 0.5  # TRL CPOConfig's simpo_gamma default


@dataclass
class PreferenceRunResult:
    run_dir: Path
    steps: int
    metrics: dict[str, Any]  # the last step's (and, for `hone rm`, the last held-out figures)
    start_eval: dict[str, float] = field(default_factory=dict)  # DPO with dpo.eval: task accuracy before
    final_eval: dict[str, float] = field(default_factory=dict)  # ... and after


def load_pairs(section: PreferenceDataConfig, source: str | None, key: str) -> list[PreferencePair]:
    """The section's preference pairs from `source`; a missing setting or a bad row is a `SetupError`."""
    if source is None:
        raise SetupError(f"{key}: set the preference data, e.g. {key}=runs/pairs/pairs.jsonl")
    try:
        return load_preferences(
            source,
            prompt_field=section.prompt_field,
            chosen_field=section.chosen_field,
            rejected_field=section.rejected_field,
            split=section.split,
            subset=section.subset,
        )
    except HoneDataError as e:
        raise SetupError(str(e)) from e


def fit_plan(section: DPOConfig | RMConfig, cfg: HoneConfig) -> dict[str, Any]:
    """The offline loop's settings (`FitPlan`'s fields) from a preference section, the trainer's gradient
    clipping and non-finite-step limit, and the run's seed."""
    return {
        "batch_size": section.batch_size,
        "micro_batch_size": section.micro_batch_size,
        "lr": section.lr,
        "weight_decay": section.weight_decay,
        "warmup_steps": section.warmup_steps,
        "schedule": section.schedule,
        "steps": section.steps,
        "grad_clip": cfg.trainer.grad_clip,
        "max_nonfinite_steps": cfg.trainer.max_nonfinite_steps,
        "seed": cfg.run.seed,
    }


def dpo_settings(cfg: HoneConfig) -> DPOSettings:
    d = cfg.dpo
    return DPOSettings(
        **fit_plan(d, cfg),
        loss=d.loss,
        beta=d.beta if d.beta is not None else DEFAULT_BETA[d.loss],
        label_smoothing=d.label_smoothing or (CDPO_LABEL_SMOOTHING if d.loss == "cdpo" else 0.0),
        gamma=d.simpo_gamma if d.simpo_gamma is not None else SIMPO_GAMMA,
        cache_reference=d.cache_reference,
    )


def refuse_ranked_resume(command: str, resume: bool, ranks: Ranks) -> None:
    if resume and ranks.world > 1:
        raise SetupError(
            f"hone {command} --resume: one learner rank only (trainer.world_size={ranks.world}); N ranks "
            "save no offline checkpoints yet"
        )


def encode_dpo_pairs(cfg: HoneConfig, pairs: list[PreferencePair], tokenizer: Any) -> list[Any]:
    """Each pair's prompt rendered as the sampler sees it (chat template, system prompt), then encoded."""
    return [
        encode_preference(
            tokenizer,
            render_prompt(p.sample, tokenizer, cfg.data.chat_template, cfg.data.system_prompt),
            p.chosen,
            p.rejected,
        )
        for p in pairs
    ]


def rm_pairs(cfg: HoneConfig) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """`hone rm`'s (training, held-out) pairs; `model.lora` refused."""
    if cfg.model.lora is not None:
        raise SetupError(
            "model.lora: hone rm trains the whole model (and its new score head); unset model.lora"
        )
    pairs = load_pairs(cfg.rm, cfg.rm.data, "rm.data")
    if cfg.rm.eval_data is not None:
        return pairs, load_pairs(cfg.rm, cfg.rm.eval_data, "rm.eval_data")
    return split_held_out(pairs, cfg.rm.val_fraction, cfg.run.seed)


def rm_encoder(cfg: HoneConfig, tokenizer: Any) -> Callable[[PreferencePair], EncodedComparison]:
    def encode(pair: PreferencePair) -> EncodedComparison:
        chosen, rejected = (
            encode_scored_text(tokenizer, *scored_text(tokenizer, pair.sample, response), cfg.rm.max_length)
            for response in (pair.chosen, pair.rejected)
        )
        return EncodedComparison(chosen, rejected, pair.margin)

    return encode


def rm_tokenizer(model_path: str) -> Any:
    tokenizer = load_tokenizer(model_path, padding_side="right")
    tokenizer.truncation_side = "left"  # the score is read at the end: keep the end, as scoring does
    return tokenizer


def run_dpo_recipe(cfg: HoneConfig, ranks: Ranks = ONE_RANK, *, resume: bool = False) -> PreferenceRunResult:
    """`hone dpo`: DPO (or a variant) of `model.path` on `dpo.data`; with `dpo.eval`, held-out task
    accuracy (the RL eval: `data.task` or `data.eval_source`, `reward`) before and after.

    On N learner ranks every rank runs this (`trainer.world_size`: the policy and reference wrapped for
    `trainer.strategy`, each rank training its share of every batch); rank 0 alone evaluates, logs and
    writes the run directory, the model gathered to it. `resume`: go on from the run's last checkpoint."""
    lead = ranks.rank == 0
    refuse_ranked_resume("dpo", resume, ranks)
    session = RunSession(cfg.run, resume=resume, ranks=ranks, command="dpo")
    run_dir = session.dir
    pairs = load_pairs(cfg.dpo, cfg.dpo.data, "dpo.data")
    settings = dpo_settings(cfg)
    callbacks = step_callbacks(cfg.run.callbacks)
    parts = setup_components(cfg) if cfg.dpo.eval and lead else None
    try:
        model_path = resolve_model(cfg.model.path) if parts is None else parts.model_path
        policy = load_policy(cfg.model, model_path) if parts is None else parts.policy
        check_tokenizer(policy, model_path)
        encoded = encode_dpo_pairs(cfg, pairs, policy.tokenizer)
    except (ValueError, OSError) as e:
        raise SetupError(str(e)) from e
    if cfg.trainer.disable_dropout:  # as TRL's DPO: the policy's and reference's log-probs are comparable
        disable_dropout(policy.model)
    names = [] if parts is None else list(parts.weight_source())  # what the sampler takes of the policy
    saved = {} if session.latest is None else session.restore({"model/": policy})  # before any write
    start_eval: dict[str, float] = dict(saved.get("start_eval", {}))
    resumed_at = saved.get("step")

    with (
        session.open_log(cfg, resumed_at) if lead else contextlib.nullcontext() as metrics_log,
        session.interrupts(),
    ):
        final_eval: dict[str, float] = {}
        if parts is not None and resumed_at is None:  # rank 0's: it has the run log
            assert metrics_log is not None
            start_eval = run_eval(parts.evaluation, EvalSettings.of(cfg))
            metrics_log.log(0, start_eval)
            log.info("eval before DPO: %s", eval_line(start_eval))
        # The reference is passed on without a name here, so a frozen copy that `run_dpo` scores once up
        # front (cache_reference) is freed before training starts.
        reference = (
            None
            if settings.loss in REFERENCE_FREE
            else load_reference(cfg.model, policy, model_path, warm_started=False)[0]
        )
        if ranks.world > 1:
            for model in {id(m): m for m in (policy.model, reference and reference.model) if m}.values():
                copy_from_rank0(model, ranks)
                shard(model, cfg.trainer.strategy, ranks, bf16=cfg.trainer.autocast == "bfloat16")
        enabled = cfg.logging.progress and lead
        saves = session.fit_saves({"model/": policy}, extra={"start_eval": start_eval}, callbacks=callbacks)
        with Progress(
            total=settings.steps,
            initial=resumed_at or 0,
            description="dpo",
            enabled=enabled,
            fields=PREFERENCE,
        ) as progress:
            result = run_dpo(
                policy,
                encoded,
                settings,
                reference=reference,
                log=None if metrics_log is None else _logger(metrics_log, progress),
                deadline=session.deadline,
                ranks=ranks,
                saves=saves,
            )
        del reference
        gathered = GatheredWeights(names, policy, ranks)
        if ranks.world > 1:
            gathered.gather()  # every rank: the trained weights, whole on rank 0
        if parts is not None:
            assert metrics_log is not None
            weights = weight_channel(cfg, gathered, parts.sampler) if ranks.world > 1 else parts.weights
            weights.publish(1)  # the sampler evaluates the trained weights
            final_eval = run_eval(parts.evaluation, EvalSettings.of(cfg))
            metrics_log.log(result["steps"], final_eval)
            log.info("eval after DPO: %s", eval_line(final_eval))
    if result["out_of_time"]:
        log.warning("DPO stopped at run.time_limit_s after %d steps", result["steps"])
    if lead:
        policy.save_pretrained(run_dir / MODEL_DIR, state_dict=gathered.state if ranks.world > 1 else None)
        summary = {"family": "dpo", "steps": result["steps"], "model": str(run_dir / MODEL_DIR)}
        session.finish(summary | _last(result) | {"start_eval": start_eval, "final_eval": final_eval})
    return PreferenceRunResult(run_dir, result["steps"], result, start_eval, final_eval)


def run_rm_recipe(cfg: HoneConfig, ranks: Ranks = ONE_RANK, *, resume: bool = False) -> PreferenceRunResult:
    """`hone rm`: a one-logit reward model from `model.path` fitted to `rm.data`, checked on held-out pairs
    (`rm.eval_data`, or `rm.val_fraction` of `rm.data` set aside with `run.seed`). On N learner ranks
    every rank runs this, as `run_dpo_recipe` does; rank 0 logs and writes the gathered model."""
    lead = ranks.rank == 0
    refuse_ranked_resume("rm", resume, ranks)
    session = RunSession(cfg.run, resume=resume, ranks=ranks, command="rm")
    run_dir = session.dir
    train, held_out = rm_pairs(cfg)
    callbacks = step_callbacks(cfg.run.callbacks)
    try:
        model_path = resolve_model(cfg.model.path)
        tokenizer = rm_tokenizer(model_path)
        model = load_score_model(
            model_path, dtype=resolve_dtype(cfg.model.dtype), pad_token_id=tokenizer.pad_token_id
        )
        # transformers types `PreTrainedModel.to` as a bare functools.wraps wrapper (device reads as self).
        model.to(resolve_device(cfg.model.device))  # type: ignore[arg-type]
        if cfg.model.gradient_checkpointing:
            enable_checkpointing(model)
        encode = rm_encoder(cfg, tokenizer)
        train_encoded, held_out_encoded = [encode(p) for p in train], [encode(p) for p in held_out]
    except (ValueError, OSError) as e:
        raise SetupError(str(e)) from e
    if cfg.trainer.disable_dropout:  # TRL's RewardTrainer default too: both texts of a pair see one network
        disable_dropout(model)
    r = cfg.rm
    settings = RMSettings(**fit_plan(r, cfg), eval_every=r.eval_every, center_coef=r.center_rewards_coef)
    log.info("reward model: %d training pairs, %d held out", len(train_encoded), len(held_out_encoded))
    if ranks.world > 1:
        copy_from_rank0(model, ranks)
        shard(model, cfg.trainer.strategy, ranks, bf16=cfg.trainer.autocast == "bfloat16")
    part = {"model/": ScoreModelPart(model)}
    resumed_at = None if session.latest is None else session.restore(part)["step"]  # before any write
    enabled = cfg.logging.progress and lead
    progress_bar = Progress(
        total=settings.steps, initial=resumed_at or 0, description="rm", enabled=enabled, fields=PREFERENCE
    )
    with (
        session.open_log(cfg, resumed_at) if lead else contextlib.nullcontext() as metrics_log,
        session.interrupts(),
        progress_bar as progress,
    ):
        result = run_reward_model(
            model,
            tokenizer,
            train_encoded,
            held_out_encoded,
            settings,
            log=None if metrics_log is None else _logger(metrics_log, progress),
            deadline=session.deadline,
            ranks=ranks,
            saves=session.fit_saves(part, callbacks=callbacks),
        )
    if result["out_of_time"]:
        log.warning("reward-model training stopped at run.time_limit_s after %d steps", result["steps"])
    log.info("held-out pair accuracy %.3f", result["eval/pair_accuracy"])
    state = full_state_dict(model, ranks) if ranks.world > 1 else None  # every rank: whole on rank 0
    if lead:
        model.save_pretrained(run_dir / MODEL_DIR, state_dict=state)
        tokenizer.save_pretrained(run_dir / MODEL_DIR)
        summary = {"family": "rm", "steps": result["steps"], "model": str(run_dir / MODEL_DIR)}
        session.finish(summary | _last(result))
    return PreferenceRunResult(run_dir, result["steps"], result)


def _last(result: dict[str, Any]) -> dict[str, Any]:
    """The result's figures for summary.json (the last step's metrics, the last held-out ones)."""
    return {k: v for k, v in result.items() if k not in ("steps",)}


def _logger(metrics_log: MetricsLogger, progress: Progress) -> Callable[[dict[str, float]], None]:
    def record(row: dict[str, float]) -> None:
        step = int(row["step"])
        metrics = {k: v for k, v in row.items() if k != "step"}
        metrics_log.log(step, metrics)
        progress.update(step, metrics)

    return record


def split_held_out(
    pairs: list[PreferencePair], fraction: float, seed: int
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(training, held-out) pairs: `fraction` of them (at least one) drawn at random with `seed`."""
    if len(pairs) < 2:
        raise SetupError(
            f"rm.data has {len(pairs)} pair; need at least 2 to hold one out (or set rm.eval_data)"
        )
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n_held_out = max(1, round(fraction * len(pairs)))
    held_out = set(order[:n_held_out])
    return [p for i, p in enumerate(pairs) if i not in held_out], [pairs[i] for i in sorted(held_out)]
