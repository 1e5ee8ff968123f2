"""The off-policy loop (`control.algorithm: sac | td3`, `hone.control.algos.sac_td3`): act, store each
transition in a replay buffer, update from it.

The schedule is SB3's (and CleanRL's): `offpolicy.learning_starts` environment steps of uniformly random
actions, then after every `offpolicy.train_freq` vector-environment steps `offpolicy.gradient_steps` updates,
each on `offpolicy.batch_size` transitions drawn uniformly from the buffer (`hone.control.replay`). One RL
step (one row of metrics.jsonl) is `control.rollout_steps` steps of every environment; its losses, α and Q
are means over that step's updates. The run around it is the session every family shares
(`hone.run.session`): the time budget, signals, checkpoints (the buffer too) with exact `--resume`.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np

from hone.config import ControlConfig, HoneConfig
from hone.control.algos.registry import ControlAlgorithm
from hone.control.algos.sac_td3 import OffPolicyLearner, check_action_space
from hone.control.checkpoint import CONTROL_SHAPES, LoopState, checkpoint_parts, reseed_if_lost
from hone.control.envs import close_envs, make_vector_env
from hone.control.evaluate import ControlResult, episode_metrics, evaluate
from hone.control.policy_io import save_policy
from hone.control.replay import ReplayBuffer
from hone.run.session import RunSession
from hone.tracking import MetricsLogger
from hone.tracking.progress import CONTROL
from hone.training.checkpoint import Part
from hone.training.optim import OptimizerStepper, RLSchedule


def train_offpolicy(
    cfg: HoneConfig, algorithm: ControlAlgorithm, *, resume: bool = False, dry_run: bool = False
) -> ControlResult | str:
    """Train (or resume) the off-policy run `cfg`; with `dry_run`, build the envs and the learner, check the
    action space, say what it found and stop before writing anything."""
    control = cfg.control
    assert control is not None and algorithm.learner is not None
    seed = cfg.run.seed
    session = RunSession(  # small MLPs: one thread
        cfg.run, resume=resume, threads=cfg.run.threads or 1, shaped_by=CONTROL_SHAPES
    )
    envs = make_vector_env(control, seed)
    state = LoopState(envs, None, rng=np.random.default_rng(seed))  # warm-up actions, TD3's noise
    try:
        if algorithm.box_actions:
            check_action_space(control, envs.single_action_space)
        obs_dim = envs.single_observation_space.shape[0]
        learner = algorithm.learner(control, obs_dim, envs.single_action_space)
        if dry_run:
            params = sum(p.numel() for p in learner.actor.parameters())
            return (
                f"{control.num_envs} envs: observations {envs.single_observation_space}, actions "
                f"{envs.single_action_space}; actor {params} parameters"
            )
        base_lrs = learning_rates(learner.steps.values())  # before a restore sets the saved ones
        buffer = ReplayBuffer(control.offpolicy.buffer_size, obs_dim, learner.action_dim, seed=seed)
        parts = checkpoint_parts(state, learner.actor, None, ("learner.pt", learner), buffer)
        if session.latest is not None:
            session.restore(parts)
            reset = reseed_if_lost(state, seed)
            state.obs = state.obs if reset is None else reset
        else:
            state.obs = envs.reset(seed=seed)[0]
        with session.open_log(cfg, state.step if session.latest else None) as log, session.interrupts():
            result = _run(cfg, control, session, state, (learner, base_lrs), buffer, parts, log)
        save_policy(learner.actor, None, session.dir / "model")  # the actor, with its action scale and bias
        session.plot(cfg.logging, algorithm.plot)
        session.finish(result.summary(control.algorithm))
        return result
    finally:
        aborted = sys.exc_info()[0] is not None  # a signal or an error: worker processes are not waited on
        close_envs(state.envs, abort=aborted)
        if state.envs is not envs:
            close_envs(envs, abort=aborted)


def _run(
    cfg: HoneConfig,
    control: ControlConfig,
    session: RunSession,
    state: LoopState,
    learning: tuple[OffPolicyLearner, list[list[float]]],
    buffer: ReplayBuffer,
    parts: dict[str, Part],
    log: MetricsLogger,
) -> ControlResult:
    learner, base_lrs = learning
    offpolicy = control.offpolicy
    n, t = control.num_envs, control.rollout_steps
    iterations = max(1, control.env_steps // (n * t))
    lr = RLSchedule(control.schedule, control.warmup_steps, iterations)
    assert state.rng is not None
    rng, episodes = state.rng, state.episodes
    scale, bias = learner.actor.scale.numpy(), learner.actor.bias.numpy()
    state.begin(log, partial(evaluate, learner.actor, control))
    started, steps_before = time.perf_counter(), state.env_steps
    with session.progress(cfg.logging, iterations, state.step, control.algorithm, CONTROL) as progress:
        for it in session.steps(range(state.step, iterations)):
            scale_lrs(learner.steps.values(), base_lrs, lr.factor(it))
            sums: dict[str, float] = {}
            counts: dict[str, int] = {}
            for _ in range(t):
                if state.env_steps < offpolicy.learning_starts:
                    action = rng.uniform(-1.0, 1.0, size=(n, learner.action_dim)).astype(np.float32)
                else:
                    action = learner.explore(state.obs, rng)
                state.obs = env_step(state.envs, state.obs, action * scale + bias, action, buffer, episodes)
                state.env_steps, state.vector_steps = state.env_steps + n, state.vector_steps + 1
                if (
                    state.env_steps > offpolicy.learning_starts
                    and state.vector_steps % offpolicy.train_freq == 0
                ):
                    for _ in range(offpolicy.gradient_steps):
                        for key, value in learner.update(buffer.sample(offpolicy.batch_size)).items():
                            sums[key] = sums.get(key, 0.0) + value
                            counts[key] = counts.get(key, 0) + 1
            metrics = {key: total / counts[key] for key, total in sums.items()}
            metrics |= {
                "env/steps": float(state.env_steps),
                "env/steps_per_s": (state.env_steps - steps_before)
                / max(time.perf_counter() - started, 1e-9),
            }
            metrics |= episode_metrics(episodes)
            state.step = step = it + 1
            play = partial(evaluate, learner.actor, control)
            out = (log, progress, parts)
            if state.end_step(session, control, metrics, out, play, last=step == iterations):
                break
    return state.result(session.dir)


def learning_rates(steppers: Iterable[OptimizerStepper]) -> list[list[float]]:
    """Each optimizer's learning rates as configured (what the schedule scales)."""
    return [[group["lr"] for group in s.optimizer.param_groups] for s in steppers]


def scale_lrs(steppers: Iterable[OptimizerStepper], base: list[list[float]], factor: float) -> None:
    """Every optimizer's learning rates at `factor` × their configured ones (`control.schedule`)."""
    for stepper, rates in zip(steppers, base, strict=True):
        for group, rate in zip(stepper.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate * factor


def env_step(
    envs: Any,
    obs: np.ndarray,
    env_action: np.ndarray,
    action: np.ndarray,
    buffer: ReplayBuffer,
    episodes: deque[tuple[float, int]],
    observe: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """One vector step: its transitions into `buffer` (`action` as the networks see it, in [-1, 1]; the
    final observation at an episode end; terminated, not truncated), finished episodes into `episodes`.
    `observe` maps a raw observation to the networks' view (the offline loop's dataset normalisation);
    `obs` is already in that view. Returns the raw observation to act on next."""
    next_obs, reward, terminated, truncated, info = envs.step(env_action)
    real = real_next_obs(next_obs, terminated, truncated, info)
    buffer.add(obs, action, reward, real if observe is None else observe(real), terminated)
    record_episodes(info, episodes)
    return next_obs


def real_next_obs(
    next_obs: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, info: dict[str, Any]
) -> np.ndarray:
    """The observation each action led to: at an episode end (SAME_STEP autoreset) the ended episode's
    final observation from `info["final_obs"]`, not the next episode's first, which `next_obs` holds."""
    ended = np.logical_or(terminated, truncated)
    if not ended.any():
        return next_obs
    real = np.array(next_obs, copy=True)
    for i in np.flatnonzero(ended):
        real[i] = info["final_obs"][i]
    return real


def record_episodes(info: dict[str, Any], episodes: deque[tuple[float, int]]) -> None:
    if "episode" in info:
        stats = info["episode"]
        for r, length in zip(stats["r"][info["_episode"]], stats["l"][info["_episode"]], strict=True):
            episodes.append((float(r), int(length)))
