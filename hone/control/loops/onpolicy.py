"""PPO on a gymnasium environment (`control:` in a recipe), on the same algorithm core as the language-model
loop: `ADVANTAGE_ESTIMATORS["gae"]` with episode boundaries, `POLICY_LOSSES["ppo"]`, `value_loss`.

Each RL step (Schulman et al. 2017, Algorithm 1; the CleanRL / SB3 implementation details):
1. collect `rollout_steps` steps from each of `num_envs` environments with the current policy;
2. GAE (Schulman et al. 2016) over the [env, time] segment: a terminated episode is not bootstrapped, a
   truncated one (a time limit: CartPole's 500 steps) is bootstrapped with V of its final observation, and
   the segment's end with V of the next observation;
3. `trainer.ppo_epochs` passes over the batch in `trainer.mini_batches` shuffled mini-batches: clipped
   surrogate + `control.value_coef` × value loss − `algorithm.entropy_coef` × entropy, the gradient clipped
   to `trainer.grad_clip`, Adam (eps 1e-5, as both peers).
Departures, each as in SB3: advantages are whitened per mini-batch (`control.normalize_advantages`); the
learning rate (and with `control.anneal_clip` the clip range) decays linearly to 0 over the run with
`trainer.schedule: linear`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hone.config import ControlConfig, HoneConfig
from hone.config.control import OFFLINE_ALGORITHMS
from hone.control.algos.ppo import PLOT_METRICS, collect, schedule, train_on
from hone.control.checkpoint import (
    LoopState,
    checkpoint_parts,
    open_control_run,
    reseed_if_lost,
    restore,
    save_every,
)
from hone.control.encoders import make_policy
from hone.control.envs import ControlEnvError, make_vector_env
from hone.control.evaluate import ControlResult, episode_metrics, evaluate, save_policy, solved
from hone.control.evaluate import action_bounds as _action_bounds
from hone.control.evaluate import as_tensor as _tensor
from hone.control.evaluate import evaluate_saved as _evaluate_saved_single
from hone.control.multiagent import is_multi_agent
from hone.control.normalize import Normalizer
from hone.control.policy import ActorCritic
from hone.control.video import Video
from hone.run.lifecycle import RunInterrupted, open_run_log, where_stopped
from hone.signals import raise_if_signalled
from hone.tracking import Progress, plot_metrics
from hone.tracking.plot import DEFAULT_PLOT_METRICS
from hone.training.checkpoint import Checkpointer


def train_control(cfg: HoneConfig, resume: bool = False, init: Path | None = None) -> ControlResult:
    """Train (or with `resume`, go on from the newest checkpoint of) the control run `cfg`; `init`: an
    offline run whose final learner the run starts from (offline-to-online)."""
    control = cfg.control
    assert control is not None
    if control.algorithm in OFFLINE_ALGORITHMS:  # bc, td3_bc, iql, awr, cql: from a Minari dataset
        from hone.control.loops.offline import train_offline

        return train_offline(cfg, init, resume)
    if init is not None:
        raise ControlEnvError(
            f"--init: starts an offline algorithm (bc, td3_bc, iql, awr, cql) from an offline run, not "
            f"control.algorithm {control.algorithm}"
        )
    if is_multi_agent(control.env):  # pettingzoo:<module>: IPPO / MAPPO on the same pieces
        from hone.control.loops.marl import train_marl

        if resume:
            raise ControlEnvError(
                f"--resume: a multi-agent run (control.env {control.env}) cannot be resumed yet; "
                "start it again"
            )

        return train_marl(cfg)
    if control.algorithm != "ppo":  # sac, td3: the off-policy loop
        from hone.control.loops.offpolicy import train_offpolicy

        return train_offpolicy(cfg, resume)
    torch.manual_seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    torch.set_num_threads(cfg.run.threads or 1)  # small MLPs: one thread is fastest (both peers' advice)
    run_dir, checkpointer, latest = open_control_run(cfg, resume)
    envs = make_vector_env(control, cfg.run.seed)
    state = LoopState(envs, None)
    try:
        obs_dim = envs.single_observation_space.shape[0]
        policy = make_policy(control, envs.single_observation_space, envs.single_action_space)
        optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.trainer.lr, eps=1e-5)
        normalizer = Normalizer(
            obs_dim,
            control.num_envs,
            observations=control.normalize_obs,
            rewards=control.normalize_reward,
            gamma=cfg.algorithm.gamma,
            clip_obs=control.clip_obs,
            clip_reward=control.clip_reward,
        )
        parts = checkpoint_parts(state, policy, normalizer, ("optimizer.pt", optimizer))
        reset = None
        if latest is not None:
            restore(checkpointer, latest, parts, state)
            reset = reseed_if_lost(state, cfg.run.seed)
            if reset is not None:  # new episodes: their discounted returns start at 0
                normalizer.returns[:] = 0.0
        else:
            reset = envs.reset(seed=cfg.run.seed)[0]
        if reset is not None:
            state.obs = _tensor(normalizer.observations(reset))
        with open_run_log(cfg, run_dir, resume_step=state.step if latest else None) as log:
            try:
                return _run(
                    cfg, control, state, policy, (optimizer, normalizer), (run_dir, checkpointer, parts), log
                )
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: one line saying where, and how to resume
                raise RunInterrupted(f"interrupted {where_stopped(run_dir)}") from None
    finally:
        state.envs.close()
        if state.envs is not envs:
            envs.close()


def _run(
    cfg: HoneConfig,
    control: ControlConfig,
    state: LoopState,
    policy: ActorCritic,
    training: tuple[torch.optim.Optimizer, Normalizer],
    saving: tuple[Path, Checkpointer, dict[str, Any]],
    log: Any,
) -> ControlResult:
    optimizer, normalizer = training
    run_dir, checkpointer, parts = saving
    n, t = control.num_envs, control.rollout_steps
    iterations = max(1, control.env_steps // (n * t))
    low, high = _action_bounds(state.envs.single_action_space)
    episodes = state.episodes  # (return, length) of the last 100 training episodes
    end_infos: deque[dict[str, float]] = deque(maxlen=100)  # their control.episode_info_keys (not resumed)
    video = Video(run_dir / "videos", cfg.logging.video_episodes) if cfg.logging.video else None
    if state.step == 0:
        state.start_eval = evaluate(policy, control, normalizer, video, step=0)
        log.log(0, state.start_eval)
    final_eval = state.start_eval
    started, steps_before = time.perf_counter(), state.env_steps
    with Progress(total=iterations, enabled=cfg.logging.progress, description="control") as progress:
        for it in range(state.step, iterations):
            raise_if_signalled()
            remaining = schedule(cfg.trainer.schedule, it, iterations)
            for group in optimizer.param_groups:
                group["lr"] = cfg.trainer.lr * remaining
            batch, state.obs = collect(
                policy, state.envs, state.obs, t, normalizer, (low, high), episodes, (control, end_infos)
            )
            state.env_steps += n * t
            metrics = train_on(cfg, control, policy, optimizer, batch, remaining)
            metrics |= {
                "env/steps": float(state.env_steps),
                "env/steps_per_s": (state.env_steps - steps_before)
                / max(time.perf_counter() - started, 1e-9),
                "lr": cfg.trainer.lr * remaining,
            }
            metrics |= episode_metrics(episodes)
            for key in control.episode_info_keys if end_infos else ():
                metrics[f"episode/{key}"] = float(np.mean([values[key] for values in end_infos]))
            state.step = step = it + 1
            reached = solved(control, episodes)
            if reached or step == iterations or (cfg.run.eval_every and step % cfg.run.eval_every == 0):
                final_eval = evaluate(policy, control, normalizer, video, step)
                metrics |= final_eval
            log.log(step, metrics)
            progress.update(step, {"reward/mean": metrics.get("episode/return", math.nan)})
            if save_every(cfg, step, last=reached or step == iterations):
                checkpointer.save(step, parts)
            if reached:
                break
    save_policy(policy, normalizer, run_dir / "model")
    if cfg.logging.plot:
        keys = PLOT_METRICS if cfg.logging.plot == list(DEFAULT_PLOT_METRICS) else cfg.logging.plot
        plot_metrics(run_dir / "metrics.jsonl", run_dir / "curves.png", keys, title=cfg.run.name)
    return ControlResult(run_dir, state.step, state.env_steps, state.start_eval, final_eval)


def evaluate_saved(cfg: HoneConfig) -> dict[str, float]:
    """`hone eval` of a control run's policy (`model.path`: its `model/` folder, which `--run` finds)."""
    control = cfg.control
    assert control is not None
    if is_multi_agent(control.env):
        from hone.control.loops.marl import evaluate_saved_marl

        return evaluate_saved_marl(cfg, Path(cfg.model.path))
    return _evaluate_saved_single(control, Path(cfg.model.path))


def control_summary(result: ControlResult, seconds: float) -> str:
    before, after = result.start_eval["eval/return"], result.final_eval["eval/return"]
    return "\n".join(
        [
            "",
            f"run directory   {result.run_dir}",
            f"RL steps        {result.steps} ({result.env_steps} environment steps)",
            f"wall time       {seconds:.0f} s",
            f"eval return before  {before:.1f}",
            f"eval return after   {after:.1f}   ({after - before:+.1f})",
            *(
                [f"normalized score    {result.final_eval['eval/normalized_score']:.1f}"]
                if "eval/normalized_score" in result.final_eval
                else []
            ),
        ]
    )
