"""Where RL begins: a fresh start (SFT warm start, KL reference, trainers, the eval before RL) or a
checkpoint's step, weights, optimizers, curriculum and weight version; and what a checkpoint holds.
Nothing here writes the run directory but the SFT warm start: a resume that does not fit its checkpoint
fails before any file is touched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hone.config import HoneConfig
from hone.data.curriculum import Curriculum
from hone.orchestration.components import RunComponents
from hone.orchestration.evaluate import EvalSettings, run_eval
from hone.orchestration.lifecycle import SetupError, deadline
from hone.orchestration.replay import ReplayBuffer
from hone.orchestration.warmstart import SFTData, SFTSettings, warm_start_sft
from hone.rollout.multiturn import Episodes
from hone.tracking import MetricsLogger
from hone.training.checkpoint import RNG, RNG_FILE, Checkpointer, Part
from hone.training.critic import CriticTrainer
from hone.training.models import load_critic, load_reference
from hone.training.policy import Policy
from hone.training.trainer import RLTrainer

log = logging.getLogger("hone")


def response_budget(cfg: HoneConfig, episodes: Episodes | None) -> int:
    """The most loss tokens one response can have: Dr.GRPO's constant normaliser (`norm_len` of
    `seq-mean-token-sum-norm`, Liu et al. 2025). Single-turn: `rollout.max_new_tokens`. Multi-turn,
    the episode's budget: each turn is at most `max_tokens_per_turn` and the whole sequence at most
    `max_total_tokens`, of which the prompt takes at least one token (observations count toward the
    total but not the loss, so they only lower it). An agent's episode: its completions, each at most
    `rollout.max_new_tokens`."""
    if cfg.rollout.agent:
        return cfg.rollout.agent_max_completions * cfg.rollout.max_new_tokens
    if episodes is None:
        return cfg.rollout.max_new_tokens
    limits = episodes.limits
    return min(limits.max_turns * limits.max_tokens_per_turn, limits.max_total_tokens - 1)


def rl_trainer(cfg: HoneConfig, parts: RunComponents) -> RLTrainer:
    """The run's trainer; Dr.GRPO's `norm_len` is the most loss tokens a response (or episode) can have."""
    return RLTrainer(
        parts.policy,
        cfg.algorithm,
        cfg.trainer,
        total_rl_steps=cfg.run.steps,
        temperature=cfg.rollout.temperature,
        norm_len=response_budget(cfg, parts.episodes),
        seed=cfg.run.seed,
    )


def rl_start_dir(parts: RunComponents, run_dir: Path) -> tuple[str, bool]:
    """Where RL starts from, and whether that is a warm start: the SFT result, else the model."""
    sft_dir = run_dir / "sft"
    return (str(sft_dir), True) if sft_dir.is_dir() else (parts.model_path, False)


def critic_trainer(cfg: HoneConfig, parts: RunComponents, run_dir: Path) -> CriticTrainer | None:
    """PPO's critic and its trainer (`algorithm.advantage: gae`), initialised where the policy starts RL."""
    if cfg.critic is None:
        return None
    model = load_critic(cfg.critic, parts.policy, rl_start_dir(parts, run_dir)[0], dtype=cfg.model.dtype)
    return CriticTrainer(model, cfg.critic, cfg.trainer, total_rl_steps=cfg.run.steps, seed=cfg.run.seed)


def reference_policy(cfg: HoneConfig, parts: RunComponents, run_dir: Path) -> dict[str, str] | None:
    """Load the KL reference into `parts` (the SFT result after a warm start); its checkpoint record."""
    if cfg.algorithm.kl.coef <= 0:
        return None
    start, warm = rl_start_dir(parts, run_dir)
    parts.ref_policy, reference = load_reference(cfg.model, parts.policy, start, warm_started=warm)
    return reference


@dataclass
class RLStart:
    """Where RL begins: at step 0 after the start eval, or at a checkpoint's step and weight version (the
    publishes before it: fewer than its steps when a step's groups were all filtered out)."""

    trainer: RLTrainer
    reference: dict[str, str] | None
    step: int
    start_eval: dict[str, float]
    version: int = 0
    critic: CriticTrainer | None = None
    replay: list[dict[str, Any]] | None = None  # the replay buffer's checkpointed entries


def resume_rl(
    cfg: HoneConfig,
    parts: RunComponents,
    run_dir: Path,
    checkpointer: Checkpointer,
    latest: Path,
    curriculum: Curriculum,
) -> RLStart:
    """Reference, trainer, curriculum and checkpoint `latest` loaded into memory; nothing written."""
    reference = reference_policy(cfg, parts, run_dir)
    trainer = rl_trainer(cfg, parts)
    critic = critic_trainer(cfg, parts, run_dir)
    state = restore(checkpointer, latest, parts.policy, trainer, critic)
    check_reference(state.get("reference"), reference, latest)
    if "curriculum" in state:  # absent from checkpoints written before the curriculum: uniform needs none
        try:
            curriculum.load_state_dict(state["curriculum"])
        except (KeyError, TypeError, ValueError) as e:  # e.g. data.difficulty_filter or the scheduler changed
            raise SetupError(f"cannot resume from {latest}: its curriculum state does not fit: {e!r}") from e
    step = int(state["step"])
    # A checkpoint written before versions were counted apart from steps: every step published then.
    version = int(state.get("version", step))
    start_eval = dict(state.get("start_eval", {}))
    return RLStart(trainer, reference, step, start_eval, version, critic, state.get("replay"))


def restore(
    checkpointer: Checkpointer, path: Path, policy: Policy, trainer: RLTrainer, critic: CriticTrainer | None
) -> dict[str, Any]:
    """Load checkpoint `path` into the policy and trainer; one-line `SetupError` when it does not fit
    (an override changed the model, LoRA or optimizer) or is damaged past what `damage` catches."""
    if (path / "scheduler.pt").exists():
        # Written before the LR schedule counted RL steps: its warm-up counted optimizer steps, so going
        # on would silently change the LR curve mid-run.
        raise SetupError(
            f"cannot resume from {path}: it was written by an older hone whose LR schedule counted "
            "optimizer steps (scheduler.pt); this one counts RL steps. Start a new run, or delete "
            "scheduler.pt to resume with the new schedule"
        )
    try:  # the LR schedules are trainer state; the RNG last
        parts = {"model/": policy, "optimizer.pt": trainer.optimizer, "trainer": trainer}
        state = checkpointer.load(path, parts | (critic_parts(critic) if critic else {}) | {RNG_FILE: RNG})
    except Exception as e:
        detail = " ".join(str(e).split())[:300]  # state-dict mismatches list every tensor
        raise SetupError(f"cannot resume from {path}: {type(e).__name__}: {detail}") from e
    return state


def critic_parts(critic: CriticTrainer) -> dict[str, Any]:
    """PPO's critic as checkpoint parts: its value model, optimizer and trainer state."""
    return {"critic/": critic.model, "critic_optimizer.pt": critic.optimizer, "critic": critic}


def check_reference(saved: dict[str, str] | None, current: dict[str, str] | None, path: Path) -> None:
    """A resumed run keeps the KL reference it was trained against (compared by content, not path)."""
    if saved and current and saved["sha256"] != current["sha256"]:
        raise SetupError(
            f"cannot resume from {path}: it was trained against the reference {saved['path']} "
            f"(sha256 {saved['sha256'][:12]}), but this run's reference is {current['path']} "
            f"(sha256 {current['sha256'][:12]}); resume with the same model.path and warm start"
        )


def start_rl(
    cfg: HoneConfig,
    parts: RunComponents,
    run_dir: Path,
    sft_data: SFTData | None,
    metrics_log: MetricsLogger,
    started: float,
) -> RLStart:
    """A fresh run's start: SFT warm start (if on), reference, trainer, and the eval before RL (step 0)."""
    if sft_data is not None:
        warm_start_sft(
            SFTSettings.of(cfg),
            parts.policy,
            parts.sampler,
            sft_data,
            parts.reward,
            run_dir / "sft",
            parts.episodes,
            deadline=deadline(cfg.run, started),
            weights=parts.weights,
        )
    reference = reference_policy(cfg, parts, run_dir)
    trainer = rl_trainer(cfg, parts)
    critic = critic_trainer(cfg, parts, run_dir)
    start_eval = run_eval(parts, EvalSettings.of(cfg))
    metrics_log.log(0, start_eval)
    log.info("eval before RL: accuracy %.3f", start_eval["eval/accuracy"])
    return RLStart(trainer, reference, 0, start_eval, critic=critic)


def checkpoint_parts(
    begin: RLStart,
    parts: RunComponents,
    *,
    step: int,
    version: int,
    curriculum: Curriculum,
    replay: ReplayBuffer | None,
) -> dict[str, Part]:
    """What a checkpoint at `step` holds: the policy and its optimizer, the trainer, the weight version,
    the start eval, the curriculum, the reference's record, the critic, the replay buffer, the RNG last.
    Admission needs nothing more: it is a function of the step (step s is submitted once s - η are
    done), so a resume submits again every step that was buffered or in flight, with its prompts and
    seed."""
    critic = begin.critic
    return (
        {
            "model/": parts.policy,
            "optimizer.pt": begin.trainer.optimizer,
            "version": version,
            "trainer": begin.trainer,
            "start_eval": begin.start_eval,
            "curriculum": curriculum.state_dict(),
        }
        | ({"reference": begin.reference} if begin.reference else {})
        | (critic_parts(critic) if critic else {})
        | ({"replay": replay.state_dict(step)} if replay is not None else {})
        | {RNG_FILE: RNG}
    )
