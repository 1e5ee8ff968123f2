"""Where RL begins: a fresh start (SFT warm start, KL reference, trainers, the eval before RL) or a
checkpoint's step, weights, optimizers, curriculum and weight version; and what a checkpoint holds.
Nothing here writes the run directory but the SFT warm start: a resume that does not fit its checkpoint
fails before any file is touched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hone.config import HoneConfig
from hone.data.curriculum import Curriculum
from hone.rl.components import RunComponents
from hone.rl.evaluate import EvalSettings, check_rewards_answered, eval_line, run_eval_rollouts
from hone.rl.replay import ReplayBuffer
from hone.rl.warmstart import SFTData, SFTRanks, SFTSettings, warm_start_sft
from hone.rollout.multiturn import Episodes
from hone.run.lifecycle import SetupError, deadline
from hone.tracking import MetricsLogger
from hone.training.checkpoint import (
    CRITIC_DIR,
    CRITIC_SHARDS_DIR,
    MODEL_DIR,
    RNG,
    RNG_FILE,
    SHARDS_DIR,
    Checkpointer,
    Part,
)
from hone.training.critic import CriticTrainer
from hone.training.distributed import (
    ONE_RANK,
    FullOptimizer,
    GatheredModel,
    Ranks,
    Shards,
    copy_from_rank0,
    is_sharded,
    shard,
)
from hone.training.models import load_critic, load_reference, load_teacher
from hone.training.policy import Policy
from hone.training.trainer import RLTrainer

log = logging.getLogger("hone")

CRITIC_PREFIX = "critic"  # the critic's checkpoint parts: critic/, critic_optimizer.pt, critic_shards/


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


def rl_start_dir(parts: RunComponents, run_dir: Path) -> tuple[str, bool]:
    """Where RL starts from, and whether that is a warm start: the SFT result, else the model."""
    sft_dir = run_dir / "sft"
    return (str(sft_dir), True) if sft_dir.is_dir() else (parts.model_path, False)


@dataclass(frozen=True)
class LearnerStart:
    """What every learner rank needs to build its models and trainers: where RL starts (`start_dir`, the
    SFT result after a warm start), Dr.GRPO's `norm_len` (`response_budget`), the pad token, and the
    checkpoint a resume loads (None: a fresh start)."""

    start_dir: str
    warm: bool
    norm_len: int
    pad_id: int
    resume: str | None = None


def learner_start(cfg: HoneConfig, parts: RunComponents, run_dir: Path, resume: Path | None) -> LearnerStart:
    start_dir, warm = rl_start_dir(parts, run_dir)
    norm_len = response_budget(cfg, parts.episodes)
    return LearnerStart(start_dir, warm, norm_len, parts.pad_id, None if resume is None else str(resume))


@dataclass
class LearnerModels:
    """The KL reference (and its checkpoint record), the policy's trainer, PPO's critic trainer and the
    on-policy distillation teacher."""

    ref_policy: Policy | None
    reference: dict[str, str] | None
    trainer: RLTrainer
    critic: CriticTrainer | None
    teacher: Policy | None = None


def shard_policy(cfg: HoneConfig, policy: Policy, ranks: Ranks) -> None:
    """Every rank at once: the policy made rank 0's, then wrapped for `trainer.strategy` (FSDP2's bf16
    mixed precision with `trainer.autocast: bfloat16`)."""
    copy_from_rank0(policy.model, ranks)
    shard(policy.model, cfg.trainer.strategy, ranks, bf16=cfg.trainer.autocast == "bfloat16")


def learner_models(cfg: HoneConfig, policy: Policy, start: LearnerStart, ranks: Ranks) -> LearnerModels:
    """The reference, trainer and critic of `policy`, each model wrapped for `trainer.strategy` on N ranks
    (every rank calls this at the same point: the wrapping starts from rank 0's weights). A resume of a
    one-process checkpoint on N ranks reads its weights here, before they are sharded."""
    single = start.resume is not None and not (Path(start.resume) / SHARDS_DIR).is_dir()
    strategy = cfg.trainer.strategy
    if ranks.world > 1 and single and ranks.rank == 0:
        policy.load_weights(Path(start.resume or "") / MODEL_DIR)
    ref_policy, reference = None, None
    if cfg.algorithm.kl.coef > 0:  # before sharding: its record's digest reads whole tensors
        ref_policy, reference = load_reference(cfg.model, policy, start.start_dir, warm_started=start.warm)
    # The distillation teacher is served as the reference is: a frozen model beside the policy on every
    # learner rank (locally, on torchrun ranks, or on Ray's learner actors), scoring the same rows.
    teacher = None if cfg.distill.teacher is None else load_teacher(cfg.distill, cfg.model, policy)
    if ranks.world > 1:
        if not is_sharded(policy.model):  # an SFT warm start on the ranks sharded it already
            shard_policy(cfg, policy, ranks)
        if ref_policy is not None and ref_policy.model is not policy.model:  # LoRA's is the policy's model
            copy_from_rank0(ref_policy.model, ranks)
            shard(ref_policy.model, strategy, ranks)
        if teacher is not None:
            shard(teacher.model, strategy, ranks)
    trainer = RLTrainer(
        policy,
        cfg.algorithm,
        cfg.trainer,
        total_rl_steps=cfg.run.steps,
        temperature=cfg.rollout.temperature,
        norm_len=start.norm_len,
        seed=cfg.run.seed,
        ranks=ranks,
    )
    critic = None
    if cfg.critic is not None:
        model = load_critic(cfg.critic, policy, start.start_dir, dtype=cfg.model.dtype)
        if ranks.world > 1:
            if single and ranks.rank == 0:
                model.load_weights(Path(start.resume or "") / CRITIC_DIR)
            copy_from_rank0(model, ranks)
            shard(model, strategy, ranks)
        critic = CriticTrainer(
            model, cfg.critic, cfg.trainer, total_rl_steps=cfg.run.steps, seed=cfg.run.seed, ranks=ranks
        )
    return LearnerModels(ref_policy, reference, trainer, critic, teacher)


@dataclass
class RLStart:
    """Where RL begins: at step 0 after the start eval, or at a checkpoint's step and weight version (the
    publishes before it: fewer than its steps when a step's groups were all filtered out)."""

    models: LearnerModels
    step: int
    start_eval: dict[str, float]
    version: int = 0
    replay: list[dict[str, Any]] | None = None  # the replay buffer's checkpointed entries

    @property
    def trainer(self) -> RLTrainer:
        return self.models.trainer

    @property
    def critic(self) -> CriticTrainer | None:
        return self.models.critic


Announce = Callable[[LearnerStart], None]  # rank 0 tells the other learner ranks how to start


def begin_learner(
    cfg: HoneConfig,
    parts: RunComponents,
    start: LearnerStart,
    ranks: Ranks,
    announce: Announce | None,
) -> LearnerModels:
    """Rank 0's side of `learner_models` (after `announce`, so the other ranks build theirs alongside)."""
    if announce is not None:
        announce(start)
    return learner_models(cfg, parts.policy, start, ranks)


def resume_rl(
    cfg: HoneConfig,
    parts: RunComponents,
    run_dir: Path,
    checkpointer: Checkpointer,
    latest: Path,
    curriculum: Curriculum,
    ranks: Ranks = ONE_RANK,
    announce: Announce | None = None,
) -> RLStart:
    """Reference, trainer, curriculum and checkpoint `latest` loaded into memory; nothing written."""
    models = begin_learner(cfg, parts, learner_start(cfg, parts, run_dir, latest), ranks, announce)
    state = restore(checkpointer, latest, parts.policy, models, ranks)
    check_reference(state.get("reference"), models.reference, latest)
    if "curriculum" in state:  # absent from checkpoints written before the curriculum: uniform needs none
        try:
            curriculum.load_state_dict(state["curriculum"])
        except (KeyError, TypeError, ValueError) as e:  # e.g. data.difficulty_filter or the scheduler changed
            raise SetupError(f"cannot resume from {latest}: its curriculum state does not fit: {e!r}") from e
    step = int(state["step"])
    # A checkpoint written before versions were counted apart from steps: every step published then.
    version = int(state.get("version", step))
    start_eval = dict(state.get("start_eval", {}))
    return RLStart(models, step, start_eval, version, state.get("replay"))


def restore(
    checkpointer: Checkpointer, path: Path, policy: Policy, models: LearnerModels, ranks: Ranks
) -> dict[str, Any]:
    """Load checkpoint `path` into the policy and trainers; one-line `SetupError` when it does not fit
    (an override changed the model, LoRA or optimizer) or is damaged past what `damage` catches. Every
    learner rank calls it (reading DCP shards is a collective)."""
    if (path / "scheduler.pt").exists():
        # Written before the LR schedule counted RL steps: its warm-up counted optimizer steps, so going
        # on would silently change the LR curve mid-run.
        raise SetupError(
            f"cannot resume from {path}: it was written by an older hone whose LR schedule counted "
            "optimizer steps (scheduler.pt); this one counts RL steps. Start a new run, or delete "
            "scheduler.pt to resume with the new schedule"
        )
    try:  # the LR schedules are trainer state; the RNG last
        state = checkpointer.load(path, loaded_models(path, policy, models, ranks) | {RNG_FILE: RNG})
    except Exception as e:
        detail = " ".join(str(e).split())[:300]  # state-dict mismatches list every tensor
        raise SetupError(f"cannot resume from {path}: {type(e).__name__}: {detail}") from e
    written_by = int(state.get("world_size", 1))
    if written_by != ranks.world:
        plural = "s" if written_by > 1 else ""
        log.info(
            "resuming %s: written by %d learner rank%s, going on with %d",
            path,
            written_by,
            plural,
            ranks.world,
        )
    return state


def saved_models(policy: Policy, models: LearnerModels, ranks: Ranks) -> dict[str, Part]:
    """The checkpoint's model and optimizer parts, in the order every rank saves them. One process: the
    policy's `model/` and `optimizer.pt` (and the critic's); N ranks: `model/` gathered to rank 0 (a
    `save_pretrained` directory as one process writes it) and the model and optimizer as DCP shards."""
    trainer, critic = models.trainer, models.critic
    if ranks.world == 1:
        policy_parts: dict[str, Part] = {"model/": policy, "optimizer.pt": trainer.optimizer}
        critic_parts = (
            {} if critic is None else {"critic/": critic.model, "critic_optimizer.pt": critic.optimizer}
        )
    else:
        policy_parts = {
            "model/": GatheredModel(policy, policy.model, ranks),
            f"{SHARDS_DIR}/": Shards(policy.model, trainer.optimizer),
        }
        critic_parts = (
            {}
            if critic is None
            else {
                f"{CRITIC_DIR}/": GatheredModel(critic.model, critic.model, ranks),
                f"{CRITIC_SHARDS_DIR}/": Shards(critic.model, critic.optimizer),
            }
        )
    return policy_parts | critic_parts


def loaded_models(path: Path, policy: Policy, models: LearnerModels, ranks: Ranks) -> dict[str, Part]:
    """What restoring checkpoint `path` loads into the policy's and critic's models, optimizers and
    trainer state: DCP shards when N ranks wrote it (at any world size, one process included); else
    `model/` and `optimizer.pt`, or on N ranks only the optimizer (`learner_models` read the weights
    before sharding)."""
    trainer, critic = models.trainer, models.critic
    if (path / SHARDS_DIR).is_dir():
        found: dict[str, Part] = {
            f"{SHARDS_DIR}/": Shards(policy.model, trainer.optimizer),
            "trainer": trainer,
        }
        if critic is not None:
            found |= {f"{CRITIC_SHARDS_DIR}/": Shards(critic.model, critic.optimizer), "critic": critic}
    elif ranks.world > 1:
        found = {"optimizer.pt": FullOptimizer(policy.model, trainer.optimizer), "trainer": trainer}
        if critic is not None:
            found |= {"critic_optimizer.pt": FullOptimizer(critic.model, critic.optimizer), "critic": critic}
    else:
        found = {"model/": policy, "optimizer.pt": trainer.optimizer, "trainer": trainer}
        if critic is not None:
            found |= {"critic/": critic.model, "critic_optimizer.pt": critic.optimizer, "critic": critic}
    return found


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
    ranks: Ranks = ONE_RANK,
    announce: Announce | None = None,
    on_ranks: SFTRanks | None = None,
) -> RLStart:
    """A fresh run's start: SFT warm start (if on; on N ranks, `on_ranks` shards the policy and has the
    other ranks train with it), reference, trainer, and the eval before RL (step 0)."""
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
            on_ranks=on_ranks,
        )
    models = begin_learner(cfg, parts, learner_start(cfg, parts, run_dir, None), ranks, announce)
    evaluated = run_eval_rollouts(parts.evaluation, EvalSettings.of(cfg))
    start_eval = evaluated.metrics
    metrics_log.log(0, start_eval)
    # A reward that raises on every response is a bug, not an outage: stop now, not after the run trained
    # on nothing (`reward.max_failed_steps` is for outages, and a short run ends before it).
    check_rewards_answered(evaluated, parts.reward, "step-0 eval", run_dir / "errors")
    log.info("eval before RL: %s", eval_line(start_eval))
    return RLStart(models, 0, start_eval)


def checkpoint_parts(
    begin: RLStart,
    parts: RunComponents,
    *,
    step: int,
    version: int,
    curriculum: Curriculum,
    replay: ReplayBuffer | None,
    ranks: Ranks = ONE_RANK,
) -> dict[str, Part]:
    """What a checkpoint at `step` holds: the policy and its optimizer, the trainer, the weight version,
    the start eval, the curriculum, the reference's record, the critic, the replay buffer, the RNG last.
    Admission needs nothing more: it is a function of the step (step s is submitted once s - η are
    done), so a resume submits again every step that was buffered or in flight, with its prompts and
    seed. On N ranks also the world size (a resume at another says so)."""
    models = begin.models
    files = saved_models(parts.policy, models, ranks)
    policy_files = {k: v for k, v in files.items() if not k.startswith(CRITIC_PREFIX)}
    critic_files = {k: v for k, v in files.items() if k.startswith(CRITIC_PREFIX)}
    return (
        policy_files
        | {
            "version": version,
            "trainer": models.trainer,
            "start_eval": begin.start_eval,
            "curriculum": curriculum.state_dict(),
        }
        | ({"reference": models.reference} if models.reference else {})
        | critic_files
        | ({"critic": models.critic} if models.critic else {})
        | ({"replay": replay.state_dict(step)} if replay is not None else {})
        | ({"world_size": ranks.world} if ranks.world > 1 else {})
        | {RNG_FILE: RNG}
    )
