"""Offline RL on a Minari dataset (`control.algorithm: bc | td3_bc | iql | awr | cql`, `data.source:
minari:<id>`), then optionally online (offline-to-online): the learners of `hone.control.algos.offline`.

1. The dataset's episodes are read (`hone.control.datasets`), a `control.offline.holdout` share of them kept
   apart; its transitions fill a replay buffer (actions rescaled to [-1, 1]). With `control.normalize_obs`
   observations are standardised by the dataset's mean and standard deviation, fixed from then on (as
   TD3+BC's §5 and CORL's `normalize: true`); the statistics are saved with the policy for `hone eval`.
2. `control.offline.updates` gradient updates, each on `control.offpolicy.batch_size` transitions drawn
   uniformly; one RL step (a row of metrics.jsonl) is `control.offline.updates_per_step` of them, with the
   held-out episodes' `val/action_mse` (the policy's deterministic action against the data's); every
   `run.eval_every` RL steps and at the end, `eval/return` and `eval/normalized_score` (D4RL's, from the
   dataset's reference scores, as Minari's `get_normalized_score`).
3. `control.offline.online_steps` (offline-to-online, as IQL's §5.3 fine-tunes): the same learner
   acts in the environment (its exploration: IQL/AWR/CQL sample their policy, BC/TD3+BC add Gaussian
   noise), each step's transition joins the buffer that already holds the dataset, and one update per
   environment step (`train_freq`, `gradient_steps`) goes on as offline. `hone train --init RUN` starts
   from RUN's final networks and optimizers (`model/learner.pt`), so `control.offline.updates: 0` there
   fine-tunes an offline run.

Checkpoints (`run.save_every` RL steps, and at the end of the offline updates) hold the policy, the
learner, the buffer's sampling generator and the process's generators; the dataset is read again at
`--resume`, so a resumed run draws the same batches as an unbroken one (tested: bit-identical weights).
Not yet: checkpoints in the online phase (a run cut short there resumes at the end of its offline
updates and plays its online phase again)."""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hone.config import ControlConfig, HoneConfig
from hone.control.algos.offline import OfflineLearner
from hone.control.algos.registry import ControlAlgorithm
from hone.control.algos.sac_td3 import check_action_space
from hone.control.checkpoint import CONTROL_SHAPES, PolicyFolder
from hone.control.datasets import OfflineDataset, Transitions, load_offline
from hone.control.envs import ControlEnvError, close_envs, make_eval_env, make_vector_env
from hone.control.evaluate import ControlResult, episode_metrics, evaluate, unit_action
from hone.control.loops.offpolicy import env_step, learning_rates, scale_lrs
from hone.control.normalize import Normalizer
from hone.control.policy_io import save_policy
from hone.control.replay import ReplayBuffer
from hone.run.session import RunSession
from hone.tracking import MetricsLogger
from hone.tracking.progress import OFFLINE
from hone.training.checkpoint import RNG, RNG_FILE, Part
from hone.training.optim import RLSchedule

LEARNER_FILE = "learner.pt"


def train_offline(
    cfg: HoneConfig,
    algorithm: ControlAlgorithm,
    *,
    init: Path | None = None,
    resume: bool = False,
    dry_run: bool = False,
) -> ControlResult | str:
    """Train (or resume) the offline run `cfg`, from `init`'s learner when given; with `dry_run`, read the
    dataset, build the learner, say what it found and stop before writing anything."""
    control = cfg.control
    assert control is not None and algorithm.learner is not None
    if resume and init is not None:
        raise ControlEnvError("--resume goes on from the run's own checkpoint: drop --init")
    if cfg.data.source is None:
        raise ControlEnvError(
            f"control.algorithm {control.algorithm} learns from a dataset: set data.source: minari:<id> "
            "(write one with `hone collect`)"
        )
    offline = control.offline
    session = RunSession(cfg.run, resume=resume, threads=cfg.run.threads or 1, shaped_by=CONTROL_SHAPES)
    env = make_eval_env(control)
    observation_space, action_space = env.observation_space, env.action_space
    env.close()
    if algorithm.box_actions:
        check_action_space(control, action_space)
    data = load_offline(
        cfg.data.source,
        root=offline.dataset_root,
        observation_space=observation_space,
        action_space=action_space,
        holdout=offline.holdout,
    )
    obs_dim = int(observation_space.shape[0])
    learner = algorithm.learner(control, obs_dim, action_space)
    if init is not None:
        load_learner(learner, init, control)
    if dry_run:
        held = 0 if data.holdout is None else len(data.holdout)
        source = cfg.data.source
        return f"{source}: {len(data.train)} training transitions, {held} held out; actions {action_space}"
    base_lrs = learning_rates(learner.steps.values())  # before a restore sets the saved ones
    normalizer = dataset_normalizer(control, data.train, obs_dim)
    buffer = ReplayBuffer(
        len(data.train) + offline.online_steps, obs_dim, learner.action_dim, seed=cfg.run.seed
    )
    train = data.train
    buffer.add(normalizer.observations(train.obs, update=False), train.actions, train.rewards,
               normalizer.observations(train.next_obs, update=False), train.terminated)  # fmt: skip
    state = _LoopState(rng=np.random.default_rng(cfg.run.seed))
    parts: dict[str, Part] = {
        "model/": PolicyFolder(learner.actor, normalizer),
        LEARNER_FILE: learner,
        "sampler": _Sampler(buffer),
        "loop": state,
        RNG_FILE: RNG,  # last: loading the others must not draw after it
    }
    if session.latest is not None:
        session.restore(parts)
    with session.open_log(cfg, state.step if session.latest else None) as log, session.interrupts():
        result = _run(cfg, control, session, (learner, base_lrs), buffer, data, normalizer, parts, log)
    save_policy(learner.actor, normalizer, session.dir / "model")
    torch.save(learner.state_dict(), session.dir / "model" / LEARNER_FILE)
    session.plot(cfg.logging, algorithm.plot)
    session.finish(result.summary(control.algorithm))
    return result


def dataset_normalizer(control: ControlConfig, train: Transitions, obs_dim: int) -> Normalizer:
    """The dataset's observation mean and variance, frozen (`update=False` everywhere); a pass-through
    without `control.normalize_obs`."""
    normalizer = Normalizer.of(control, obs_dim, 1)
    if normalizer.obs_rms is not None:
        normalizer.obs_rms.mean = train.obs.mean(0).astype(np.float64)
        normalizer.obs_rms.var = train.obs.var(0).astype(np.float64)
    return normalizer


def load_learner(learner: OfflineLearner, run: Path, control: ControlConfig) -> None:
    """`--init RUN`: RUN's final networks and optimizers (their moments), with this run's learning rates
    (a saved optimizer carries its own, which would silently override `control.lr` /
    `control.offpolicy.q_lr`); one line when they are not this learner's."""
    file = run / "model" / LEARNER_FILE if (run / "model").is_dir() else run / LEARNER_FILE
    if not file.is_file():
        raise ControlEnvError(
            f"--init {run}: no {LEARNER_FILE} there (an offline run's directory, runs/<name>)"
        )
    optimizers = [stepper.optimizer for stepper in learner.steps.values()]
    rates = [[group["lr"] for group in opt.param_groups] for opt in optimizers]
    try:
        learner.load_state_dict(torch.load(file, weights_only=True))
    except (KeyError, RuntimeError, ValueError) as e:
        detail = " ".join(str(e).split())[:200]
        raise ControlEnvError(
            f"--init {run}: not a control.algorithm {control.algorithm} learner of this shape: {detail}"
        ) from None
    for opt, lrs in zip(optimizers, rates, strict=True):
        for group, lr in zip(opt.param_groups, lrs, strict=True):
            group["lr"] = lr


def _run(
    cfg: HoneConfig,
    control: ControlConfig,
    session: RunSession,
    learning: tuple[OfflineLearner, list[list[float]]],
    buffer: ReplayBuffer,
    data: OfflineDataset,
    normalizer: Normalizer,
    parts: dict[str, Part],
    log: MetricsLogger,
) -> ControlResult:
    learner, base_lrs = learning
    offline, batch_size = control.offline, control.offpolicy.batch_size
    state: _LoopState = parts["loop"]
    offline_steps = math.ceil(offline.updates / offline.updates_per_step)
    online_steps = math.ceil(offline.online_steps / control.rollout_steps)
    total = offline_steps + online_steps
    lr = RLSchedule(control.schedule, control.warmup_steps, total)
    stopped_by = ""

    def scored(metrics: dict[str, float]) -> dict[str, float]:
        score = data.normalized_score(metrics["eval/return"])
        return metrics if score is None else metrics | {"eval/normalized_score": score}

    if state.step == 0:
        state.start_eval = state.final_eval = scored(evaluate(learner.actor, control, normalizer))
        log.log(0, state.start_eval)
    holdout = None if data.holdout is None else _holdout_batch(data.holdout, normalizer)
    online = _Online(control, cfg.run.seed, normalizer) if online_steps else None
    with session.progress(cfg.logging, total, state.step, control.algorithm, OFFLINE) as progress:
        try:
            for step in session.steps(range(state.step + 1, total + 1)):
                scale_lrs(learner.steps.values(), base_lrs, lr.factor(step - 1))
                if step <= offline_steps:
                    done = (step - 1) * offline.updates_per_step
                    updates = min(offline.updates_per_step, offline.updates - done)
                    metrics = _mean([learner.update(buffer.sample(batch_size)) for _ in range(updates)])
                    metrics["offline/updates"] = float(done + updates)
                else:
                    assert online is not None
                    metrics = online.steps(learner, buffer, state.rng)
                if holdout is not None:
                    metrics["val/action_mse"] = _action_mse(learner.actor, holdout)
                out_of_time = session.out_of_time()
                last = step == total or out_of_time
                if session.due(step, cfg.run.eval_every, last=last):
                    state.final_eval = scored(evaluate(learner.actor, control, normalizer))
                    metrics |= state.final_eval
                log.log(step, metrics)
                state.step = step
                progress.update(step, metrics | {"eval/return": state.final_eval["eval/return"]})
                # the online phase is not checkpointed: a resume there goes on from the offline updates' end
                if step <= offline_steps and session.due(
                    step, cfg.run.save_every, last=step == offline_steps or last
                ):
                    session.checkpointer.save(step, parts)
                if out_of_time:
                    stopped_by = "time limit"
                    session.say_out_of_time(step)
                    break
        finally:
            if online is not None:
                online.close()
    env_steps = 0 if online is None else online.env_steps
    result = ControlResult(session.dir, state.step, env_steps, state.start_eval, state.final_eval)
    result.updates, result.stopped_by = min(state.step, offline_steps) * offline.updates_per_step, stopped_by
    result.updates = min(result.updates, offline.updates)
    return result


@dataclass
class _LoopState:
    """The loop's counters, its evals and the exploration generator (a checkpoint's `loop` in state.json)."""

    rng: np.random.Generator
    step: int = 0
    start_eval: dict[str, float] = field(default_factory=dict)
    final_eval: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "start_eval": self.start_eval, "final_eval": self.final_eval,
            "rng": self.rng.bit_generator.state,
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.start_eval, self.final_eval = dict(state["start_eval"]), dict(state["final_eval"])
        self.rng.bit_generator.state = state["rng"]


class _Sampler:
    """The buffer's sampling generator: its rows are the dataset's training transitions, read again at
    `--resume`; a dataset that changed since is refused (its size tells)."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        self.buffer = buffer

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.buffer.rng.bit_generator.state, "size": self.buffer.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["size"]) != self.buffer.size:
            raise ValueError(
                f"the dataset has {self.buffer.size} training transitions, the run had {state['size']}"
            )
        self.buffer.rng.bit_generator.state = state["rng"]


class _Online:
    """The online phase's environments: `rollout_steps` vector steps per RL step, each transition into
    the buffer (observations normalised with the dataset's statistics), updates as `train_freq` says."""

    def __init__(self, control: ControlConfig, seed: int, normalizer: Normalizer) -> None:
        self.control, self.normalizer = control, normalizer
        self.envs = make_vector_env(control, seed)
        self.obs = self.envs.reset(seed=seed)[0]
        self.env_steps = self.vector_steps = 0
        self.episodes: deque[tuple[float, int]] = deque(maxlen=100)
        self.started = time.perf_counter()

    def steps(
        self, learner: OfflineLearner, buffer: ReplayBuffer, rng: np.random.Generator
    ) -> dict[str, float]:
        control, n = self.control, self.control.num_envs
        scale, bias = learner.actor.scale.numpy(), learner.actor.bias.numpy()
        rows: list[dict[str, float]] = []
        for _ in range(control.rollout_steps):
            seen = self.observe(self.obs)
            action = learner.explore(seen, rng)
            self.obs = env_step(
                self.envs, seen, action * scale + bias, action, buffer, self.episodes, self.observe
            )
            self.env_steps, self.vector_steps = self.env_steps + n, self.vector_steps + 1
            if self.vector_steps % control.offpolicy.train_freq == 0:
                rows += [
                    learner.update(buffer.sample(control.offpolicy.batch_size))
                    for _ in range(control.offpolicy.gradient_steps)
                ]
        seconds = max(time.perf_counter() - self.started, 1e-9)
        return (
            _mean(rows)
            | episode_metrics(self.episodes)
            | {
                "env/steps": float(self.env_steps),
                "env/steps_per_s": self.env_steps / seconds,
            }
        )

    def observe(self, obs: np.ndarray) -> np.ndarray:
        """A raw observation as the networks see it (the dataset's statistics, frozen)."""
        return self.normalizer.observations(obs, update=False)

    def close(self) -> None:
        close_envs(self.envs, abort=sys.exc_info()[0] is not None)


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {key for row in rows for key in row}
    return {key: float(np.mean([row[key] for row in rows if key in row])) for key in keys}


def _holdout_batch(
    holdout: Transitions, normalizer: Normalizer, rows: int = 10_000
) -> dict[str, torch.Tensor]:
    """Up to `rows` held-out transitions (evenly spaced), as the networks see them."""
    pick = np.linspace(0, len(holdout) - 1, min(rows, len(holdout))).astype(int)
    return {
        "obs": torch.as_tensor(normalizer.observations(holdout.obs[pick], update=False), dtype=torch.float32),
        "actions": torch.as_tensor(holdout.actions[pick]),
    }


def _action_mse(actor: Any, batch: dict[str, torch.Tensor]) -> float:
    """The deterministic policy's action against the held-out data's, squared error per dimension."""
    with torch.no_grad():
        return float(((unit_action(actor, batch["obs"]) - batch["actions"]) ** 2).mean())
