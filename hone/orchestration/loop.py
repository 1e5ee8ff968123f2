"""The RL loop: each step `learn(produce(step))`, then eval, log and checkpoint.

This is the only module that knows the order of the stages, at the level of producer
(`orchestration.producer`: prompts → sample → score → filter) and learner (`orchestration.learner`:
collate → old/ref log-probs → advantages → update → publish weights), which talk through a
`RolloutSource` (`orchestration.rollouts`). This process runs the loop whatever the back-end: only where
the producers run changes (`orchestration.placement`: inline, threads, Ray actors). The learner's seam is
`learner.learn(groups, step)` plus the tensors a publish sends (`components.weight_source`), so a learner
of N ranks can stand behind the same two calls. Each step is a pure function of
(seed, step, weights, optimizer state, LR): prompts come from the curriculum (`data.scheduler`; its state
is checkpointed, and `uniform` is `PromptStream.batch(step)`, a function of the step) and sampling is
seeded per step, so a run resumed from a checkpoint ends with the same weights as one never stopped
whenever the LR is a function of the step too: no `run.time_limit_s`, or a constant schedule. Under a
time limit a cosine/linear LR also follows the wall clock (`RLSchedule`), and resume is not bit-exact.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hone.config import HoneConfig
from hone.data.curriculum import Curriculum, build_curriculum
from hone.envs import release_envs
from hone.errors import HoneError
from hone.logging import METRICS_FILE, MetricsLogger, Progress, plot_metrics, read_metrics
from hone.orchestration.components import (
    RunComponents,
    build_components,
    close_samplers,
)
from hone.orchestration.evaluate import evaluate
from hone.orchestration.learner import Learner
from hone.orchestration.placement import rollout_source
from hone.orchestration.replay import ReplayBuffer
from hone.orchestration.rollouts import RolloutSource
from hone.orchestration.warmstart import SFTData, warm_start_sft
from hone.orchestration.warmstart import sft_data as make_sft_data
from hone.rollout.multiturn import Episodes
from hone.training.checkpoint import RNG, RNG_FILE, Checkpointer
from hone.training.critic import CriticTrainer
from hone.training.models import load_critic, load_reference
from hone.training.policy import Policy
from hone.training.trainer import RLTrainer
from hone.types import SamplingParams

log = logging.getLogger("hone")


class SetupError(HoneError, RuntimeError):
    """Bad input found while building a run (before any training): one line, naming the thing."""


class RunInterrupted(Exception):
    """Ctrl-C (or SIGTERM, see `hone.cli`) during a run; the message is one line: where it stopped, the
    last checkpoint, and how to resume."""


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    start_eval: dict[str, float]
    final_eval: dict[str, float]


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


def rl_step(step: int, rollouts: RolloutSource, learner: Learner) -> dict[str, float]:
    """One RL step: take the next step's scored groups and learn from them (synchronous:
    `learn(produce(step))`); returns the producer's metrics, the learner's, and the step's time and
    throughput."""
    t0 = time.perf_counter()
    groups = rollouts.take()
    learned = learner.learn(groups, step)
    elapsed = time.perf_counter() - t0
    timing = {"time/step_s": elapsed, "throughput/tokens_per_s": groups.new_tokens / max(elapsed, 1e-9)}
    return groups.metrics | learned | timing


def run_eval(parts: RunComponents, cfg: HoneConfig) -> dict[str, float]:
    params = SamplingParams(
        n=cfg.eval.n,
        temperature=cfg.eval.temperature,
        max_new_tokens=cfg.rollout.max_new_tokens,
        stop=cfg.rollout.stop,
        seed=cfg.run.seed,
    )
    return evaluate(
        parts.sampler,
        parts.policy.tokenizer,
        parts.eval_samples,
        parts.reward,
        params,
        chat_template=cfg.data.chat_template,
        system_prompt=cfg.data.system_prompt,
        ks=cfg.eval.k,
        episodes=parts.episodes,
        agent=parts.agent,
    )


def setup_components(cfg: HoneConfig) -> RunComponents:
    """`build_components`, with bad input (files, rows, names, paths) turned into one-line `SetupError`s.
    A failure stops what the environment started before it (an OpenEnv server)."""
    try:
        try:
            return build_components(cfg)
        except BaseException:
            release_envs()
            raise
    except (ValueError, KeyError, TypeError, OSError, RuntimeError) as e:
        raise SetupError(e.args[0] if e.args else repr(e)) from e


def _open_run_dir(cfg: HoneConfig, resume: bool) -> tuple[Path, Checkpointer, Path | None]:
    run_dir = Path(cfg.run.dir) / cfg.run.name
    checkpointer = Checkpointer(run_dir, keep_last=cfg.run.keep_last)
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise SetupError(
            f"{run_dir} already holds a run; resume it with `hone train --resume {run_dir}` "
            "or choose another run.name"
        )
    try:  # nothing is written here: a start that fails in set-up leaves an existing run as it was
        return run_dir, checkpointer, checkpointer.latest_intact() if resume else None
    except ValueError as e:
        raise SetupError(str(e)) from e


def write_run_config(run_dir: Path, cfg: HoneConfig) -> None:
    """Write `config.yaml` (what `--resume` reads) atomically: a crash mid-write keeps the old one."""
    tmp = run_dir / ".config.yaml.tmp"
    with tmp.open("w") as f:
        f.write(cfg.to_yaml())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / "config.yaml")


def where_stopped(run_dir: Path) -> str:
    """'at step N; last checkpoint step M; resume with `…`', read from the run directory's files."""
    rows = read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).exists() else []
    done = max((int(row["step"]) for row in rows), default=0)  # the last step that finished and logged
    latest = Checkpointer(run_dir).latest()
    saved = "no checkpoint yet" if latest is None else f"last checkpoint {latest.name.replace('-', ' ')}"
    at = f"at step {done}" if done else "before the first RL step"
    return f"{at}; {saved}; resume with `hone train --resume {run_dir}`"


def train(cfg: HoneConfig, *, resume: bool = False) -> RunResult:
    """Run (or resume) the recipe `cfg`; everything lands in `runs/<name>/`. This process is the
    controller and the learner whatever the back-end; with `cluster.backend: ray` the samplers and
    reward workers are Ray actors (`ray_executor`), inside a Ray this attaches to or starts."""
    if cfg.cluster.backend == "ray":
        from hone.orchestration.ray_cluster import ray_session  # ray: an optional extra

        with ray_session(cfg.cluster):
            result = run_learner(cfg, resume=resume)
        return result
    return run_learner(cfg, resume=resume)


def run_learner(cfg: HoneConfig, *, resume: bool = False) -> RunResult:
    """The run in this process: set-up, (SFT warm start,) the RL loop driving its `RolloutSource`, eval,
    metrics and checkpoints."""
    started = time.perf_counter()
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)
    run_dir, checkpointer, latest = _open_run_dir(cfg, resume)
    parts = setup_components(cfg)
    try:  # a sampler may run an engine process (vLLM): it never outlives the run
        try:
            warm = cfg.sft.enabled and latest is None
            sft_data = make_sft_data(cfg, parts) if warm else None
        except (ValueError, OSError) as e:
            raise SetupError(str(e)) from e
        try:
            curriculum = build_curriculum(cfg.data, parts.train_samples, cfg.run.seed)
        except ValueError as e:
            raise SetupError(str(e)) from e
        created = not run_dir.exists()
        # A resume loads its checkpoint (and checks its reference) before the run directory is touched:
        # opening the logger drops metrics rows and TensorBoard events after the checkpoint, so a checkpoint
        # that does not fit the overrides must fail first.
        resumed = None if latest is None else _resume(cfg, parts, run_dir, checkpointer, latest, curriculum)
        metrics_log = _open_metrics_log(cfg, run_dir, None if resumed is None else resumed.step, created)
        write_run_config(run_dir, cfg)  # only now: a start that failed set-up changed nothing
        with metrics_log:
            try:
                result = _train(
                    cfg, parts, run_dir, checkpointer, resumed, sft_data, metrics_log, started, curriculum
                )
            except KeyboardInterrupt:
                raise RunInterrupted(f"interrupted {where_stopped(run_dir)}") from None
        if cfg.logging.plot:
            plot_metrics(run_dir / "metrics.jsonl", run_dir / "curves.png", cfg.logging.plot)
        return result
    finally:
        close_samplers(parts)
        release_envs()  # e.g. the OpenEnv server the environment started


def _open_metrics_log(
    cfg: HoneConfig, run_dir: Path, resume_step: int | None, created: bool
) -> MetricsLogger:
    """Open metrics.jsonl/TensorBoard/W&B (a resumed run's rows after `resume_step` go). Opened before SFT,
    so a missing W&B install fails at once, not after minutes of work."""
    wandb = {
        "project": cfg.logging.wandb_project,
        "name": cfg.run.name,
        "id": cfg.run.name,
        "resume": "allow",
    }
    try:
        return MetricsLogger(
            run_dir,
            tensorboard=cfg.logging.tensorboard,
            wandb=wandb if cfg.logging.wandb else None,
            resume_step=resume_step,
        )
    except ImportError as e:
        if created:  # a failed start leaves no empty run directory behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise SetupError(str(e)) from e


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


def _reference(cfg: HoneConfig, parts: RunComponents, run_dir: Path) -> dict[str, str] | None:
    """Load the KL reference into `parts` (the SFT result after a warm start); its checkpoint record."""
    if cfg.algorithm.kl.coef <= 0:
        return None
    start, warm = rl_start_dir(parts, run_dir)
    parts.ref_policy, reference = load_reference(cfg.model, parts.policy, start, warm_started=warm)
    return reference


@dataclass
class _RLStart:
    """Where RL begins: at step 0 after the start eval, or at a checkpoint's step and weight version (the
    publishes before it: fewer than its steps when a step's groups were all filtered out)."""

    trainer: RLTrainer
    reference: dict[str, str] | None
    step: int
    start_eval: dict[str, float]
    version: int = 0
    critic: CriticTrainer | None = None
    replay: list[dict[str, Any]] | None = None  # the replay buffer's checkpointed entries


def _resume(
    cfg: HoneConfig,
    parts: RunComponents,
    run_dir: Path,
    checkpointer: Checkpointer,
    latest: Path,
    curriculum: Curriculum,
) -> _RLStart:
    """Reference, trainer, curriculum and checkpoint `latest` loaded into memory; nothing written."""
    reference = _reference(cfg, parts, run_dir)
    trainer = rl_trainer(cfg, parts)
    critic = critic_trainer(cfg, parts, run_dir)
    state = _restore(checkpointer, latest, parts.policy, trainer, critic)
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
    return _RLStart(trainer, reference, step, start_eval, version, critic, state.get("replay"))


def _restore(
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
        state = checkpointer.load(path, parts | (_critic_parts(critic) if critic else {}) | {RNG_FILE: RNG})
    except Exception as e:
        detail = " ".join(str(e).split())[:300]  # state-dict mismatches list every tensor
        raise SetupError(f"cannot resume from {path}: {type(e).__name__}: {detail}") from e
    return state


def _critic_parts(critic: CriticTrainer) -> dict[str, Any]:
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


def _start(
    cfg: HoneConfig,
    parts: RunComponents,
    run_dir: Path,
    sft_data: SFTData | None,
    metrics_log: MetricsLogger,
    started: float,
) -> _RLStart:
    """A fresh run's start: SFT warm start (if on), reference, trainer, and the eval before RL (step 0)."""
    if sft_data is not None:
        warm_start_sft(
            cfg,
            parts.policy,
            parts.sampler,
            sft_data,
            parts.reward,
            run_dir / "sft",
            parts.episodes,
            deadline=None if cfg.run.time_limit_s is None else started + cfg.run.time_limit_s,
            weights=parts.weights,
        )
    reference = _reference(cfg, parts, run_dir)
    trainer = rl_trainer(cfg, parts)
    critic = critic_trainer(cfg, parts, run_dir)
    start_eval = run_eval(parts, cfg)
    metrics_log.log(0, start_eval)
    log.info("eval before RL: accuracy %.3f", start_eval["eval/accuracy"])
    return _RLStart(trainer, reference, 0, start_eval, critic=critic)


def _train(
    cfg: HoneConfig,
    parts: RunComponents,
    run_dir: Path,
    checkpointer: Checkpointer,
    resumed: _RLStart | None,
    sft_data: SFTData | None,
    metrics_log: MetricsLogger,
    started: float,
    curriculum: Curriculum,
) -> RunResult:
    if resumed is None:
        begin = _start(cfg, parts, run_dir, sft_data, metrics_log, started)
    else:
        begin = resumed
        parts.weights.publish(begin.version)  # the checkpoint's weights, as the version they were
        log.info("resumed %s at step %d (weight version %d)", run_dir, begin.step, begin.version)
    trainer, start_eval = begin.trainer, begin.start_eval
    replay = ReplayBuffer(cfg.algorithm.replay) if cfg.algorithm.replay.enabled else None
    if replay is not None and begin.replay is not None:
        replay.load_state_dict(begin.replay)
    rollouts = rollout_source(cfg, parts, curriculum, start=begin.step, replay=replay)
    learner = Learner(
        policy=parts.policy,
        ref_policy=parts.ref_policy,
        trainer=trainer,
        algorithm=cfg.algorithm,
        trainer_cfg=cfg.trainer,
        temperature=cfg.rollout.temperature,
        pad_id=parts.pad_id,
        publish=rollouts.publish,
        version=begin.version,
        critic=begin.critic,
    )

    def save(step: int) -> None:
        """The checkpoint holds the version counter with the step; admission needs nothing more: it is
        a function of the step (step s is submitted once s - η are done), so a resume submits again
        every step that was buffered or in flight, with its prompts and seed."""
        critic = begin.critic
        checkpointer.save(
            step,
            {
                "model/": parts.policy,
                "optimizer.pt": trainer.optimizer,
                "version": learner.version,
                "trainer": trainer,
                "start_eval": start_eval,
                "curriculum": curriculum.state_dict(),
            }
            | ({"reference": begin.reference} if begin.reference else {})
            | (_critic_parts(critic) if critic else {})
            | ({"replay": replay.state_dict(step)} if replay is not None else {})
            | {RNG_FILE: RNG},
        )

    step = begin.step
    final_eval: dict[str, float] = {}
    if cfg.run.time_limit_s is not None:  # the LR schedule also decays over what is left of the budget
        left = cfg.run.time_limit_s - (time.perf_counter() - started)
        trainer.schedule.start_clock(left)
        if begin.critic is not None:
            begin.critic.schedule.start_clock(left)
    with (
        Progress(total=cfg.run.steps, initial=begin.step, enabled=cfg.logging.progress) as progress,
        closing(rollouts),
    ):
        while step < cfg.run.steps:
            metrics = rl_step(step, rollouts, learner)
            step += 1
            out_of_time = (
                cfg.run.time_limit_s is not None and time.perf_counter() - started > cfg.run.time_limit_s
            )
            last = step == cfg.run.steps or out_of_time
            evaluating = last or bool(cfg.run.eval_every and step % cfg.run.eval_every == 0)
            if evaluating:
                with parts.weights.hold():  # the producer may be sampling: evaluate between its steps
                    final_eval = run_eval(parts, cfg)
                metrics.update(final_eval)
            metrics_log.log(step, metrics)
            if evaluating:  # one value per prompt seen (up to 100k): at the eval cadence, not every step
                metrics_log.histogram(step, "prompts/pass_rate", curriculum.pass_rates())
            progress.update(step, metrics)
            if last or (cfg.run.save_every and step % cfg.run.save_every == 0):
                save(step)
            if out_of_time:
                log.info("time limit of %.0f s reached after step %d", cfg.run.time_limit_s, step)
                break
    if not final_eval:  # no RL step ran in this session: the weights are where they started
        final_eval = start_eval if step == 0 else run_eval(parts, cfg)
    return RunResult(run_dir, step, start_eval, final_eval)
