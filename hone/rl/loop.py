"""The RL loop: each step `learn(produce(step))`, then eval, log and checkpoint.

This is the only module that knows the order of the stages, at the level of producer
(`rl.producer`: prompts → sample → score → filter) and learner (`rl.learner`:
collate → old/ref log-probs → advantages → update → publish weights), which talk through a
`RolloutSource` (`rl.placement.source`). This process runs the loop whatever the back-end: only where
the producers run changes (`rl.placement.build`: inline, threads, Ray actors). The learner's seam is
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
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from hone.config import HoneConfig
from hone.data.curriculum import Curriculum, build_curriculum
from hone.envs import release_envs
from hone.plugins import load_object
from hone.rl.canary import build_canary
from hone.rl.components import RunComponents, close_samplers, setup_components
from hone.rl.evaluate import EvalSettings, run_eval
from hone.rl.learner import Learner
from hone.rl.placement.build import rollout_source
from hone.rl.placement.source import RolloutSource
from hone.rl.placement.staleness import StalenessController
from hone.rl.producer import ScoredGroups
from hone.rl.ranks.learners import LeadRanks
from hone.rl.replay import ReplayBuffer, ReplayImagesError
from hone.rl.report import StepTally, sample_records, step_signal
from hone.rl.start import RLStart, checkpoint_parts, resume_rl, start_rl
from hone.rl.warmstart import SFTData
from hone.rl.warmstart import sft_data as make_sft_data
from hone.run.lifecycle import RunInterrupted, SetupError
from hone.run.session import RunSession
from hone.signals import raise_if_signalled
from hone.tracking import (
    METRICS_FILE,
    MetricsLogger,
    Progress,
    SampleLog,
    read_metrics,
    samples_markdown,
)
from hone.tracking.plot import DEFAULT_PLOT_METRICS
from hone.training.distributed import ONE_RANK, Ranks

__all__ = ["RunInterrupted", "RunResult", "SetupError", "learn_step", "run_learner", "train"]

log = logging.getLogger("hone")


@dataclass
class RunResult:
    """`steps`: the RL steps done, this session's and a resumed run's before it; `tally` counts which
    updated the policy and which had no signal (`report`); `resumed_at` the step a resumed session started
    from, and `resume_eval` the eval logged at that step (empty when it had none)."""

    run_dir: Path
    steps: int
    start_eval: dict[str, float]
    final_eval: dict[str, float]
    tally: StepTally = field(default_factory=StepTally)
    resumed_at: int | None = None
    resume_eval: dict[str, float] = field(default_factory=dict)


def learn_step(
    step: int, rollouts: RolloutSource, learner: Learner, lead: LeadRanks | None = None
) -> tuple[ScoredGroups, dict[str, float]]:
    """One RL step: take the next step's scored groups and learn from them (synchronous:
    `learn(produce(step))`; on N learner ranks every rank learns from them, `lead` telling the others);
    returns the groups, and the producer's metrics, the learner's, whether it updated the policy and had
    a signal (`report.step_signal`), and the step's time and throughput."""
    t0 = time.perf_counter()
    groups = rollouts.take()
    version = learner.version
    if lead is not None:
        lead.learn(groups, step, version)
    learned = learner.learn(groups, step)
    elapsed = time.perf_counter() - t0
    timing = {"time/step_s": elapsed, "throughput/tokens_per_s": groups.new_tokens / max(elapsed, 1e-9)}
    return groups, groups.metrics | learned | step_signal(groups, learner.version > version) | timing


StepCallback = Callable[[int, Mapping[str, float]], object]


Setup = Callable[[HoneConfig], RunComponents]  # builds a run's parts (`setup_components`)


def train(
    cfg: HoneConfig,
    *,
    resume: bool = False,
    callbacks: Sequence[StepCallback] = (),
    ranks: Ranks = ONE_RANK,
    setup: Setup | None = None,
) -> RunResult:
    """Run (or resume) the recipe `cfg`; everything lands in `runs/<name>/`. This process is the
    controller and the learner whatever the back-end; with `cluster.backend: ray` the samplers and
    reward workers are Ray actors (`ray_executor`), inside a Ray this attaches to or starts. On N learner
    ranks this is rank 0 (in the process group already), and the others `learner_ranks.follow` it.

    `callbacks` (after those `run.callbacks` names) are called as `fn(step, metrics)` after every RL
    step, once it is logged and checkpointed; one that raises ends the run (KeyboardInterrupt: as Ctrl-C).
    `setup` builds the run's parts instead of `setup_components` (a test's, recording them).
    """
    options = RunOptions(resume, callbacks, setup)
    if cfg.cluster.backend == "ray":
        from hone.rl.placement.ray.cluster import ray_session  # ray: an optional extra

        with ray_session(cfg.cluster, learner_ranks=cfg.trainer.world_size):
            if cfg.trainer.world_size == 1:
                return run_learner(cfg, options)
            from hone.rl.ranks.ray import learner_group

            with learner_group(cfg) as ray_ranks:
                result = run_learner(cfg, options, ray_ranks)
        return result
    return run_learner(cfg, options, ranks)


@dataclass(frozen=True)
class RunOptions:
    """What `train` passes on to `run_learner` besides the recipe and the ranks."""

    resume: bool = False
    callbacks: Sequence[StepCallback] = ()
    setup: Setup | None = None


def step_callbacks(names: Sequence[str]) -> list[StepCallback]:
    """The `run.callbacks` functions, each imported from its 'pkg.module:fn'."""
    found = []
    for k, name in enumerate(names):
        fn = load_object(name, what=f"run.callbacks[{k}] ({name!r})")
        if not callable(fn):
            raise SetupError(f"run.callbacks[{k}] ({name!r}) is not callable")
        found.append(fn)
    return found


def run_learner(cfg: HoneConfig, options: RunOptions, ranks: Ranks = ONE_RANK) -> RunResult:
    """The run in this process: set-up, (SFT warm start,) the RL loop driving its `RolloutSource`, eval,
    metrics and checkpoints."""
    callbacks = [*step_callbacks(cfg.run.callbacks), *options.callbacks]
    session = RunSession(cfg.run, resume=options.resume, ranks=ranks)
    run_dir, checkpointer, latest = session.dir, session.checkpointer, session.latest
    lead = LeadRanks(ranks) if ranks.world > 1 else None  # first: the other ranks wait on its commands
    parts = (options.setup or setup_components)(cfg)
    if lead is not None:
        lead.attach(cfg, parts)
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
        # A resume loads its checkpoint (and checks its reference) before the run directory is touched:
        # opening the logger drops metrics rows and TensorBoard events after the checkpoint, so a checkpoint
        # that does not fit the overrides must fail first.
        resumed = None
        if latest is not None:
            announce = None if lead is None else lead.announce
            resumed = resume_rl(cfg, parts, run_dir, checkpointer, latest, curriculum, ranks, announce)
            if lead is not None:
                parts = lead.gather_weights(cfg, parts)
        metrics_log = session.open_log(cfg, resume_step=None if resumed is None else resumed.step)
        with metrics_log, session.interrupts():
            result = _train(
                cfg,
                parts,
                session,
                resumed,
                sft_data,
                metrics_log,
                curriculum,
                callbacks,
                lead,
            )
        if lead is not None:
            lead.stop()
        session.plot(cfg.logging, DEFAULT_PLOT_METRICS)
        if ranks.rank == 0:
            session.finish(
                {"family": "rl", "steps": result.steps, "start_eval": result.start_eval,
                 "final_eval": result.final_eval}
            )  # fmt: skip
        return result
    finally:
        close_samplers(parts)
        release_envs()  # e.g. the OpenEnv server the environment started


def _train(
    cfg: HoneConfig,
    parts: RunComponents,
    session: RunSession,
    resumed: RLStart | None,
    sft_data: SFTData | None,
    metrics_log: MetricsLogger,
    curriculum: Curriculum,
    callbacks: Sequence[StepCallback],
    lead: LeadRanks | None,
) -> RunResult:
    ranks = ONE_RANK if lead is None else lead.ranks
    run_dir, checkpointer, started = session.dir, session.checkpointer, session.started
    if cfg.algorithm.replay.enabled and parts.policy.processor is not None:
        raise ReplayImagesError("algorithm.replay does not take a vision-language model's rollouts yet")
    if resumed is None:
        announce = None if lead is None else lead.announce
        begin = start_rl(cfg, parts, run_dir, sft_data, metrics_log, started, ranks, announce, lead)
        if lead is not None:
            parts = lead.gather_weights(cfg, parts)
    else:
        begin = resumed
        with nullcontext() if lead is None else lead.weights_held():
            parts.weights.publish(begin.version)  # the checkpoint's weights, as the version they were
        log.info("resumed %s at step %d (weight version %d)", run_dir, begin.step, begin.version)
    trainer, start_eval = begin.trainer, begin.start_eval
    replay = ReplayBuffer(cfg.algorithm.replay) if cfg.algorithm.replay.enabled else None
    if replay is not None and begin.replay is not None:
        replay.load_state_dict(begin.replay)
    with nullcontext() if lead is None else lead.weights_held():  # a Ray executor sends its actors them
        rollouts = rollout_source(cfg, parts.placement, curriculum, start=begin.step, replay=replay)
    learner = Learner(
        policy=parts.policy,
        ref_policy=begin.models.ref_policy,
        teacher=begin.models.teacher,
        distill=cfg.distill,
        trainer=trainer,
        algorithm=cfg.algorithm,
        trainer_cfg=cfg.trainer,
        temperature=cfg.rollout.temperature,
        pad_id=parts.pad_id,
        publish=rollouts.publish if lead is None else lead.publisher(rollouts.publish),
        version=begin.version,
        critic=begin.critic,
        ranks=ranks,
        canary=build_canary(cfg, f"{cfg.rollout.engine} sampler"),
    )

    def save(step: int) -> None:
        parts_ = checkpoint_parts(
            begin,
            parts,
            step=step,
            version=learner.version,
            curriculum=curriculum,
            replay=replay,
            ranks=ranks,
        )
        if lead is not None:
            lead.save(step)
        checkpointer.save(step, parts_)

    step = begin.step
    staleness = None
    if cfg.cluster.mode == "async" and cfg.cluster.max_staleness == "auto":
        staleness = StalenessController(cfg.cluster.max_staleness_cap, limit=rollouts.ahead)
    evaluation = EvalSettings.of(cfg)
    final_eval: dict[str, float] = {}
    left = None
    rows = read_metrics(run_dir / METRICS_FILE) if resumed is not None else []
    tally = StepTally.of(rows, begin.step)  # a resumed run's steps before this session count too
    resume_eval = {
        k: v for row in rows if row["step"] == begin.step for k, v in row.items() if k.startswith("eval/")
    }
    n_samples = cfg.logging.samples
    samples_by_id = {s.id: s for s in parts.train_samples}  # each record shows its sample's meta
    logged = SampleLog(run_dir, resume_step=begin.step if resumed else None) if n_samples else nullcontext()
    if cfg.run.time_limit_s is not None:  # the LR schedule (and the progress total) follow the budget left
        left = cfg.run.time_limit_s - (time.perf_counter() - started)
        trainer.schedule.start_clock(left)
        if begin.critic is not None:
            begin.critic.schedule.start_clock(left)
    with (
        Progress(
            total=cfg.run.steps, initial=begin.step, enabled=cfg.logging.progress, time_left_s=left
        ) as progress,
        closing(rollouts),
        logged as sample_log,
    ):
        while step < cfg.run.steps:
            raise_if_signalled()
            groups, metrics = learn_step(step, rollouts, learner, lead)
            if staleness is not None:  # `cluster.max_staleness: auto`: η for the steps admitted next
                rollouts.ahead = staleness.update(metrics)
            step += 1
            tally.add(metrics)
            out_of_time = session.out_of_time()
            last = step == cfg.run.steps or out_of_time
            evaluating = session.due(step, cfg.run.eval_every, last=last)
            if evaluating:
                with parts.weights.hold():  # the producer may be sampling: evaluate between its steps
                    final_eval = run_eval(parts.evaluation, evaluation)
                metrics.update(final_eval)
            metrics_log.log(step, metrics)
            if evaluating:  # one value per prompt seen (up to 100k): at the eval cadence, not every step
                metrics_log.histogram(step, "prompts/pass_rate", curriculum.pass_rates())
            if sample_log is not None and step % cfg.logging.samples_every == 0:
                records = sample_records(
                    step,
                    groups.sampled[:n_samples],
                    groups.rollouts,
                    learner.advantages,
                    parts.policy.tokenizer,
                    learner.turn_advantages,
                    samples_by_id,
                )
                sample_log.write(records)
                metrics_log.text(step, "samples", samples_markdown(records))
            progress.update(step, metrics, updated=tally.updated)
            if session.due(step, cfg.run.save_every, last=last):
                save(step)
            for callback in callbacks:
                callback(step, metrics)
            if out_of_time:
                session.say_out_of_time(step)
                break
    if not final_eval:  # no RL step ran in this session: the weights are where they started
        final_eval = start_eval if step == 0 else run_eval(parts.evaluation, evaluation)
    resumed_at = None if resumed is None else resumed.step
    return RunResult(run_dir, step, start_eval, final_eval, tally, resumed_at, resume_eval)
