"""The on-policy loop (`control.algorithm: ppo`): collect a rollout with the current policy, update on it,
repeat; one agent on a gymnasium vector env, or a team on a PettingZoo parallel env (MAPPO/IPPO with
parameters shared by the agents: the agents are extra rows, `hone.control.multiagent.ParallelBatch`).

Each RL step is `control.rollout_steps` steps of every environment, then `hone.control.algos.ppo.train_on`
(GAE and PPO's epochs of mini-batches). For a team, `control.ppo.multi_agent_critic` picks the critic's
input: `centralized` (MAPPO, Yu et al. 2022: the joint observation and the agent's index) or `independent`
(IPPO: the agent's own); `control.env_steps` counts joint steps (JaxMARL's TOTAL_TIMESTEPS) and returns are
team returns (the sum over agents).

The run around it is the session every family shares (`hone.run.session`): the time budget, signals,
checkpoints every `run.save_every` RL steps with exact `--resume`, evals every `run.eval_every`.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from hone.config import ControlConfig, HoneConfig
from hone.control.algos.ppo import collect, optimizer_stepper, train_on
from hone.control.algos.registry import ControlAlgorithm
from hone.control.checkpoint import CONTROL_SHAPES, LoopState, checkpoint_parts, reseed_if_lost
from hone.control.encoders import make_policy
from hone.control.envs import close_envs, make_vector_env
from hone.control.evaluate import ControlResult, action_bounds, as_tensor, episode_metrics, evaluate
from hone.control.multiagent import ParallelBatch, SharedActorCritic, evaluate_team, is_multi_agent
from hone.control.normalize import Normalizer
from hone.control.policy import ActorCritic
from hone.control.policy_io import save_policy
from hone.control.video import Video
from hone.run.session import RunSession
from hone.seeding import derive_seed
from hone.tracking import MetricsLogger
from hone.tracking.progress import CONTROL
from hone.training.checkpoint import Part
from hone.training.optim import OptimizerStepper, RLSchedule

Evaluate = Callable[[ActorCritic, Normalizer, "Video | None", int], dict[str, float]]


@dataclass
class Arena:
    """What one agent and a team differ in: their envs, the policy, the normaliser's width and rows, and
    how the deterministic eval is played."""

    envs: Any
    policy: ActorCritic
    obs_width: int
    rows: int
    evaluate: Evaluate

    @classmethod
    def make(cls, control: ControlConfig, seed: int) -> Arena:
        if is_multi_agent(control.env):
            team = ParallelBatch(control, control.num_envs, control.ppo.multi_agent_critic == "centralized")
            policy = SharedActorCritic(
                team.obs_dim,
                team.critic_dim,
                team.single_action_space,
                control.hidden_sizes,
                control.activation,
            )
            team_eval: Evaluate = lambda p, n, v, s: evaluate_team(policy, control, n, v, s)  # noqa: E731
            return cls(team, policy, team.obs_dim + team.critic_dim, team.num_rows, team_eval)
        envs = make_vector_env(control, seed)
        try:
            single = make_policy(control, envs.single_observation_space, envs.single_action_space)
        except BaseException:
            envs.close()
            raise
        one: Evaluate = lambda p, n, v, s: evaluate(p, control, n, v, s)  # noqa: E731
        return cls(envs, single, envs.single_observation_space.shape[0], control.num_envs, one)

    def describe(self) -> str:
        spaces = getattr(self.envs, "single_observation_space", None), self.envs.single_action_space
        params = sum(p.numel() for p in self.policy.parameters())
        return (
            f"{self.rows} rows of observations {spaces[0]}, actions {spaces[1]}; policy {params} parameters"
        )


def train_onpolicy(
    cfg: HoneConfig, algorithm: ControlAlgorithm, *, resume: bool = False, dry_run: bool = False
) -> ControlResult | str:
    """Train (or resume) the on-policy run `cfg`; with `dry_run`, build everything a start builds (envs,
    spaces, networks), say what it found and stop before writing anything."""
    control = cfg.control
    assert control is not None
    seed = cfg.run.seed
    session = RunSession(  # small MLPs: one thread
        cfg.run, resume=resume, threads=cfg.run.threads or 1, shaped_by=CONTROL_SHAPES
    )
    np.random.seed(seed)
    arena = Arena.make(control, seed)
    state = LoopState(arena.envs, None)
    try:
        if dry_run:
            return arena.describe()
        stepper = optimizer_stepper(arena.policy, control)
        normalizer = Normalizer.of(control, arena.obs_width, arena.rows, rewards=True)
        parts = checkpoint_parts(state, arena.policy, normalizer, ("optimizer.pt", stepper.optimizer))
        reset = None
        if session.latest is not None:
            session.restore(parts)
            reset = reseed_if_lost(state, seed)
            if reset is not None:  # new episodes: their discounted returns start at 0
                normalizer.returns[:] = 0.0
        else:
            reset = arena.envs.reset(seed=seed)[0]
        if reset is not None:
            state.obs = as_tensor(normalizer.observations(reset))
        with session.open_log(cfg, state.step if session.latest else None) as log, session.interrupts():
            result = _run(cfg, control, session, state, arena, (stepper, normalizer), parts, log)
        save_policy(arena.policy, normalizer, session.dir / "model")
        session.plot(cfg.logging, algorithm.plot)
        session.finish(result.summary("ppo"))
        return result
    finally:
        aborted = sys.exc_info()[0] is not None  # a signal or an error: worker processes are not waited on
        close_envs(state.envs, abort=aborted)
        if state.envs is not arena.envs:
            close_envs(arena.envs, abort=aborted)


def _run(
    cfg: HoneConfig,
    control: ControlConfig,
    session: RunSession,
    state: LoopState,
    arena: Arena,
    training: tuple[OptimizerStepper, Normalizer],
    parts: dict[str, Part],
    log: MetricsLogger,
) -> ControlResult:
    stepper, normalizer = training
    n, t = control.num_envs, control.rollout_steps
    iterations = max(1, control.env_steps // (n * t))
    lr = RLSchedule(control.schedule, control.warmup_steps, iterations)  # by RL step: resume is exact
    bounds = action_bounds(arena.envs.single_action_space)
    episodes = state.episodes  # (return, length) of the last 100 training episodes
    end_infos: deque[dict[str, float]] = deque(maxlen=100)  # their control.episode_info_keys (not resumed)
    video = Video(session.dir / "videos", cfg.logging.video_episodes) if cfg.logging.video else None
    state.begin(log, partial(arena.evaluate, arena.policy, normalizer, video, 0))
    started, steps_before = time.perf_counter(), state.env_steps
    with session.progress(cfg.logging, iterations, state.step, control.algorithm, CONTROL) as progress:
        for it in session.steps(range(state.step, iterations)):
            stepper.set_lr(control.lr * lr.factor(it))
            infos = (control, end_infos) if control.episode_info_keys else None
            batch, state.obs = collect(
                arena.policy, state.envs, state.obs, t, normalizer, bounds, episodes, infos
            )
            state.env_steps += n * t
            step = it + 1
            metrics = train_on(
                control, arena.policy, stepper, batch,
                progress=it / iterations, seed=derive_seed(cfg.run.seed, "control/mini_batches", step),
                where=f"RL step {step}",
            )  # fmt: skip
            metrics |= {
                "env/steps": float(state.env_steps),
                "env/steps_per_s": (state.env_steps - steps_before)
                / max(time.perf_counter() - started, 1e-9),
                "lr": stepper.optimizer.param_groups[0]["lr"],
            }
            metrics |= episode_metrics(episodes)
            for key in control.episode_info_keys if end_infos else ():
                metrics[f"episode/{key}"] = float(np.mean([values[key] for values in end_infos]))
            state.step = step
            play = partial(arena.evaluate, arena.policy, normalizer, video, step)
            out = (log, progress, parts)
            if state.end_step(session, control, metrics, out, play, last=step == iterations):
                break
    return state.result(session.dir)
