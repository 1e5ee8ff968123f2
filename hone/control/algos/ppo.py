"""The pieces of one PPO step on [env, time] segments, shared by the single-agent loop
(`control_loop`) and the multi-agent one (`control_marl`: agents are extra rows): `collect` a rollout
with SAME_STEP episode boundaries, `update` (PPO's clipped surrogate, the value loss, the entropy bonus,
epochs of shuffled mini-batches) and the learning-rate `schedule`. The algorithm is described in
`control_loop`'s docstring."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np
import torch

from hone.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, explained_variance, value_loss
from hone.algorithms.utils import masked_whiten
from hone.config import ControlConfig, HoneConfig
from hone.control.envs import episode_end_infos
from hone.control.evaluate import as_tensor as _tensor
from hone.control.normalize import Normalizer
from hone.control.policy import ActorCritic

PLOT_METRICS = ["episode/return", "eval/return", "entropy", "loss/value", "explained_variance", "approx_kl"]


def schedule(kind: str, it: int, iterations: int) -> float:
    """The learning-rate multiplier at RL step `it`: SB3's `progress_remaining` for linear."""
    if kind == "linear":
        return 1.0 - it / iterations
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * it / iterations))
    return 1.0


def collect(
    policy: ActorCritic,
    envs: Any,
    obs: torch.Tensor,
    steps: int,
    normalizer: Normalizer,
    bounds: tuple[np.ndarray | None, np.ndarray | None],
    episodes: deque[tuple[float, int]],
    end_infos: tuple[ControlConfig, deque[dict[str, float]]] | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """`steps` steps of every environment: [env, time] tensors of what GAE and the update need
    (observations and rewards as the policy sees them: normalised when the run normalises); each ended
    episode's (return, length) appended to `episodes`, its `control.episode_info_keys` to `end_infos`."""
    low, high = bounds
    keys = ("obs", "actions", "log_probs", "values", "rewards", "next_values", "dones", "terminated")
    out: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    with torch.no_grad():
        for _ in range(steps):
            dist, value = policy.dist_value(obs)
            action = dist.sample()
            env_action = action.numpy()
            if low is not None:
                env_action = np.clip(env_action, low, high)
            next_obs, reward, terminated, truncated, info = envs.step(env_action)
            ended = np.logical_or(terminated, truncated)
            next_obs_t = _tensor(normalizer.observations(next_obs))
            reward = normalizer.rewards(reward, ended)
            # V(s_{t+1}): the next observation's, or at an episode end the final one's (SAME_STEP autoreset
            # puts the next episode's first observation in `next_obs`).
            next_value = policy.value(next_obs_t)
            if ended.any():
                final = np.stack([info["final_obs"][i] for i in np.flatnonzero(ended)])
                final_t = _tensor(normalizer.observations(final, update=False))
                next_value[torch.as_tensor(ended)] = policy.value(final_t)
            if "episode" in info:
                done_mask = info["_episode"]
                stats = info["episode"]
                for r, length in zip(stats["r"][done_mask], stats["l"][done_mask], strict=True):
                    episodes.append((float(r), int(length)))
            if end_infos is not None:
                control, ended_values = end_infos
                ended_values.extend(episode_end_infos(control, info, ended, control.episode_info_keys))
            for key, value_t in (
                ("obs", obs),
                ("actions", action),
                ("log_probs", dist.log_prob(action)),
                ("values", value),
                ("rewards", torch.as_tensor(reward, dtype=torch.float32)),
                ("next_values", next_value),
                ("dones", torch.as_tensor(ended)),
                ("terminated", torch.as_tensor(terminated)),
            ):
                out[key].append(value_t)
            obs = next_obs_t
    return {k: torch.stack(v, 1) for k, v in out.items()}, obs


def update(
    cfg: HoneConfig,
    control: ControlConfig,
    policy: ActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    advantages: torch.Tensor,
    returns: torch.Tensor,
    clip: float,
) -> dict[str, float]:
    size = advantages.numel()
    flat = {k: v.reshape(size, *v.shape[2:]) for k, v in batch.items()}
    adv, ret = advantages.reshape(size), returns.reshape(size)
    mini = max(1, size // cfg.trainer.mini_batches)
    loss_fn = POLICY_LOSSES["ppo"]
    sums: dict[str, float] = {}
    count = 0
    for _ in range(cfg.trainer.ppo_epochs):
        order = torch.randperm(size)
        for start in range(0, size - mini + 1, mini):
            idx = order[start : start + mini]
            ones = torch.ones(len(idx), 1)
            dist, new_values = policy.dist_value(flat["obs"][idx])
            log_probs = dist.log_prob(flat["actions"][idx])
            mb_adv = adv[idx].unsqueeze(1)
            if control.normalize_advantages and len(idx) > 1:
                mb_adv = masked_whiten(mb_adv, ones)
            policy_loss, _loss_metrics = loss_fn(
                log_probs=log_probs.unsqueeze(1),
                old_log_probs=flat["log_probs"][idx].unsqueeze(1),
                advantages=mb_adv,
                response_mask=ones,
                clip_low=clip,
                clip_high=cfg.algorithm.clip_high if cfg.algorithm.clip_high is not None else clip,
            )
            v_loss, _ = value_loss(
                new_values.unsqueeze(1),
                flat["values"][idx].unsqueeze(1),
                ret[idx].unsqueeze(1),
                ones,
                clip=control.clip_value,
            )
            entropy = dist.entropy().mean()
            loss = policy_loss + control.value_coef * v_loss - cfg.algorithm.entropy_coef * entropy
            optimizer.zero_grad()
            loss.backward()
            if cfg.trainer.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.trainer.grad_clip)
            optimizer.step()
            with torch.no_grad():
                log_ratio = log_probs - flat["log_probs"][idx]
                step_metrics = {
                    "loss/policy": float(policy_loss),
                    "loss/value": float(v_loss),
                    "entropy": float(entropy),
                    "approx_kl": float(((log_ratio.exp() - 1) - log_ratio).mean()),  # k3 (Schulman)
                    "clip_frac": float(((log_ratio.exp() - 1).abs() > clip).float().mean()),
                }
            for key, value in step_metrics.items():
                sums[key] = sums.get(key, 0.0) + value
            count += 1
    ones = torch.ones_like(ret).unsqueeze(1)
    metrics = {k: v / max(count, 1) for k, v in sums.items()}
    metrics["explained_variance"] = explained_variance(flat["values"].unsqueeze(1), ret.unsqueeze(1), ones)
    metrics["clip_range"] = clip
    return metrics


def train_on(
    cfg: HoneConfig,
    control: ControlConfig,
    policy: ActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    remaining: float,
) -> dict[str, float]:
    """One PPO update on a collected [env, time] batch: GAE with its episode boundaries, then `update` at
    this step's clip range (annealed with the learning rate under `control.anneal_clip`)."""
    advantages, returns = ADVANTAGE_ESTIMATORS["gae"](
        token_rewards=batch["rewards"],
        response_mask=torch.ones_like(batch["rewards"]),
        values=batch["values"],
        next_values=batch["next_values"],
        dones=batch["dones"],
        terminated=batch["terminated"],
        gamma=cfg.algorithm.gamma,
        lam=cfg.algorithm.lam,
    )
    clip = (cfg.algorithm.clip_low or 0.2) * (remaining if control.anneal_clip else 1.0)
    return update(cfg, control, policy, optimizer, batch, advantages, returns, clip)
