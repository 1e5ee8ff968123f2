"""Multi-agent PPO on a PettingZoo parallel environment (`control.env: pettingzoo:<module>`): IPPO and
MAPPO with parameter sharing, on the single-agent loop's pieces and the same algorithm core.

Agents are extra batch rows (`hone.control.multiagent.ParallelBatch`: env e's agent a is row e·A + a), so
each RL step is the single-agent one over an [env×agent, time] segment: `control_ppo.collect` (SAME_STEP
semantics; a truncated episode, MPE's `max_cycles`, bootstrapped with V of its final observation),
`ADVANTAGE_ESTIMATORS["gae"]` with `next_values/dones/terminated` per agent row, and `control_ppo.update`
(`POLICY_LOSSES["ppo"]`, `value_loss`, entropy). Each agent's advantage is from its own reward and its own
row's values. `control.multi_agent_critic` picks the critic's input: `centralized` (MAPPO, Yu et al. 2022:
the joint observation and the agent's index) or `independent` (IPPO: the agent's observation).

`control.env_steps` counts environment steps (one joint step of all agents), as JaxMARL's TOTAL_TIMESTEPS;
`episode/return` and `eval/return` are team returns: the sum over agents of an episode's rewards.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hone.config import ControlConfig, HoneConfig
from hone.control.algos.ppo import PLOT_METRICS, collect, schedule, train_on
from hone.control.evaluate import EVAL_SEED, ControlResult, episode_metrics, load_saved, save_policy, solved
from hone.control.evaluate import action_bounds as _action_bounds
from hone.control.evaluate import as_tensor as _tensor
from hone.control.multiagent import ParallelBatch, SharedActorCritic
from hone.control.normalize import Normalizer
from hone.run.lifecycle import new_run_dir, open_run_log
from hone.tracking import Progress, plot_metrics
from hone.tracking.plot import DEFAULT_PLOT_METRICS

logger = logging.getLogger(__name__)


def make_batch(control: ControlConfig, num_envs: int) -> ParallelBatch:
    return ParallelBatch(control, num_envs, centralized=control.multi_agent_critic == "centralized")


def train_marl(cfg: HoneConfig) -> ControlResult:
    control = cfg.control
    assert control is not None
    envs = make_batch(control, control.num_envs)  # a missing package or an unknown env: before anything
    if cfg.logging.video:
        logger.warning(
            "logging.video: not recorded for a multi-agent run yet (PettingZoo envs); training goes on"
        )
    try:
        torch.manual_seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.set_num_threads(cfg.run.threads or 1)
        run_dir = new_run_dir(cfg.run)
        policy = SharedActorCritic(
            envs.obs_dim, envs.critic_dim, envs.single_action_space, control.hidden_sizes, control.activation
        )
        with open_run_log(cfg, run_dir) as log:
            return _run(cfg, control, envs, policy, run_dir, log)
    finally:
        envs.close()


def _run(
    cfg: HoneConfig,
    control: ControlConfig,
    envs: ParallelBatch,
    policy: SharedActorCritic,
    run_dir: Path,
    log: Any,
) -> ControlResult:
    n, t = control.num_envs, control.rollout_steps
    iterations = max(1, control.env_steps // (n * t))
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.trainer.lr, eps=1e-5)
    bounds = _action_bounds(envs.single_action_space)
    normalizer = Normalizer(
        envs.obs_dim + envs.critic_dim,
        envs.num_rows,
        observations=control.normalize_obs,
        rewards=control.normalize_reward,
        gamma=cfg.algorithm.gamma,
        clip_obs=control.clip_obs,
        clip_reward=control.clip_reward,
    )
    obs = _tensor(normalizer.observations(envs.reset(seed=cfg.run.seed)[0]))
    episodes: deque[tuple[float, int]] = deque(maxlen=100)  # (team return, length) of training episodes
    start_eval = evaluate(policy, control, normalizer)
    log.log(0, start_eval)
    final_eval = start_eval
    started, env_steps = time.perf_counter(), 0
    with Progress(total=iterations, enabled=cfg.logging.progress, description="marl") as progress:
        for it in range(iterations):
            remaining = schedule(cfg.trainer.schedule, it, iterations)
            for group in optimizer.param_groups:
                group["lr"] = cfg.trainer.lr * remaining
            batch, obs = collect(policy, envs, obs, t, normalizer, bounds, episodes)
            env_steps += n * t
            metrics = train_on(cfg, control, policy, optimizer, batch, remaining)
            metrics |= {
                "env/steps": float(env_steps),
                "env/steps_per_s": env_steps / max(time.perf_counter() - started, 1e-9),
                "lr": cfg.trainer.lr * remaining,
            }
            metrics |= episode_metrics(episodes)
            step = it + 1
            reached = solved(control, episodes)
            if reached or step == iterations or (cfg.run.eval_every and step % cfg.run.eval_every == 0):
                final_eval = evaluate(policy, control, normalizer)
                metrics |= final_eval
            log.log(step, metrics)
            progress.update(step, {"reward/mean": metrics.get("episode/return", math.nan)})
            if reached:
                iterations = step
                break
    save_policy(policy, normalizer, run_dir / "model")
    if cfg.logging.plot:
        keys = PLOT_METRICS if cfg.logging.plot == list(DEFAULT_PLOT_METRICS) else cfg.logging.plot
        plot_metrics(run_dir / "metrics.jsonl", run_dir / "curves.png", keys, title=cfg.run.name)
    return ControlResult(run_dir, iterations, env_steps, start_eval, final_eval)


def evaluate_saved_marl(cfg: HoneConfig, folder: Path) -> dict[str, float]:
    """`hone eval` of a multi-agent run: its shared policy, played by every agent (`control.eval_episodes`
    deterministic episodes, team return)."""
    control = cfg.control
    assert control is not None
    env = make_batch(control, 1)
    env.close()
    policy = SharedActorCritic(
        env.obs_dim, env.critic_dim, env.single_action_space, control.hidden_sizes, control.activation
    )
    normalizer = load_saved(control, folder, policy, env.obs_dim + env.critic_dim, rows=env.num_rows)
    return evaluate(policy, control, normalizer)


def evaluate(
    policy: SharedActorCritic | None, control: ControlConfig, normalizer: Normalizer | None = None
) -> dict[str, float]:
    """`control.eval_episodes` episodes on fixed seeds (EVAL_SEED + i): the team return (the sum over agents)
    of the deterministic policy (argmax, or the Gaussian's mean), observations normalised with the training
    statistics, frozen. `policy=None` is a uniformly random team (the bench's baseline)."""
    env = make_batch(control, 1)
    low, high = _action_bounds(env.single_action_space)
    rng = np.random.default_rng(EVAL_SEED)
    returns, lengths = [], []
    try:
        for i in range(control.eval_episodes):
            obs, _ = env.reset(seed=EVAL_SEED + i)
            total, length, done = 0.0, 0, False
            while not done:
                action: np.ndarray
                if policy is None:
                    action = (
                        rng.integers(env.single_action_space.n, size=env.num_rows)
                        if low is None or high is None
                        else rng.uniform(low, high, size=(env.num_rows, *low.shape))
                    )
                else:
                    x = _tensor(obs if normalizer is None else normalizer.observations(obs, update=False))
                    with torch.no_grad():
                        action = policy.act(x, deterministic=True).numpy()
                    if low is not None:
                        action = np.clip(action, low, high)
                obs, reward, terminated, truncated, _ = env.step(action)
                total, length = total + float(reward.sum()), length + 1
                done = bool(np.logical_or(terminated, truncated).all())
            returns.append(total)
            lengths.append(length)
    finally:
        env.close()
    return {"eval/return": float(np.mean(returns)), "eval/length": float(np.mean(lengths))}
