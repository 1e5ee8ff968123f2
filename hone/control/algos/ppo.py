"""PPO on [env, time] segments (Schulman et al. 2017, "Proximal Policy Optimization Algorithms", Algorithm 1;
the CleanRL / SB3 implementation details), on the same algorithm core as the language-model loop:
`ADVANTAGE_ESTIMATORS["gae"]`, `POLICY_LOSSES["ppo"]`, `value_loss`, and the language-model trainer's update
pieces (`hone.training.ppo.mini_batches`: a seeded order of mini-batches; `OptimizerStepper`: clip, skip a
non-finite step).

One update, on a rollout `collect`ed with SAME_STEP episode boundaries (agents of a team are extra rows,
`hone.control.multiagent.ParallelBatch`):
1. GAE (Schulman et al. 2016) over the segment: a terminated episode is not bootstrapped, a truncated one (a
   time limit: CartPole's 500 steps) is bootstrapped with V of its final observation, and the segment's end
   with V of the next observation;
2. `control.ppo.epochs` passes over the batch in `control.ppo.mini_batches` shuffled mini-batches: clipped
   surrogate + `value_coef` × value loss − `entropy_coef` × entropy, the gradient clipped to `grad_clip`,
   Adam (eps 1e-5, as both peers).
Departures, each as in SB3: advantages are whitened per mini-batch (`normalize_advantages`); with
`anneal_clip` the clip range decays to 0 as the learning rate does (`control.schedule: linear`: zoo's
lin_0.2). Mini-batches cover every row
(`tensor_split`: sizes differ by at most one), where SB3 and CleanRL drop a remainder.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch

from hone.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, explained_variance, value_loss
from hone.config import ControlConfig
from hone.config.control import ControlPPOConfig
from hone.control.algos.registry import ControlAlgorithm, register_control_algorithm
from hone.control.encoders import make_policy
from hone.control.envs import episode_end_infos
from hone.control.evaluate import as_tensor as _tensor
from hone.control.normalize import Normalizer
from hone.control.policy import ActorCritic
from hone.training.optim import OptimizerStepper, decay_factor
from hone.training.ppo import mini_batches

PLOT_METRICS = ("episode/return", "eval/return", "entropy", "loss/value", "explained_variance", "approx_kl")
MAX_NONFINITE_STEPS = 3  # optimizer steps in a row with a non-finite gradient before the run stops


def optimizer_stepper(policy: ActorCritic, control: ControlConfig) -> OptimizerStepper:
    """Adam (eps 1e-5, SB3's and CleanRL's) behind the shared stepper: clip to `control.ppo.grad_clip`,
    skip a non-finite step, stop after `MAX_NONFINITE_STEPS` in a row. The multi-tensor (`foreach`) Adam,
    which torch picks only on GPUs: on these small MLPs a step is ~25% less CPU (measured) for the same
    update."""
    params = list(policy.parameters())
    return OptimizerStepper(
        torch.optim.Adam(params, lr=control.lr, eps=1e-5, foreach=True),
        params,
        grad_clip=control.ppo.grad_clip,
        max_nonfinite_steps=MAX_NONFINITE_STEPS,
        limit_key=f"{MAX_NONFINITE_STEPS} in a row",
        advice="lower control.lr or set control.ppo.grad_clip",
    )


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
    keys = ("obs", "actions", "log_probs", "values", "rewards", "dones", "terminated")
    out: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    finals: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (step, ended rows, V of their final obs)
    with torch.no_grad():
        for t in range(steps):
            dist, value = policy.dist_value(obs)
            action = dist.sample()
            env_action = action.numpy()
            if low is not None:
                env_action = np.clip(env_action, low, high)
            next_obs, reward, terminated, truncated, info = envs.step(env_action)
            ended = np.logical_or(terminated, truncated)
            next_obs_t = _tensor(normalizer.observations(next_obs))
            reward = normalizer.rewards(reward, ended)
            if ended.any():
                # SAME_STEP autoreset puts the next episode's first observation in `next_obs`: V(s_{t+1}) of
                # an ended episode is its final observation's.
                final = np.stack([info["final_obs"][i] for i in np.flatnonzero(ended)])
                final_t = _tensor(normalizer.observations(final, update=False))
                finals.append((t, torch.as_tensor(ended), policy.value(final_t)))
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
                ("dones", torch.as_tensor(ended)),
                ("terminated", torch.as_tensor(terminated)),
            ):
                out[key].append(value_t)
            obs = next_obs_t
        batch = {k: torch.stack(v, 1) for k, v in out.items()}
        # V(s_{t+1}) is the next step's V(s_t) (the same observation through the same weights: one critic
        # pass per step, as SB3 makes), the segment's last from one more pass, an ended episode's its own.
        next_values = torch.cat([batch["values"][:, 1:], policy.value(obs).unsqueeze(1)], dim=1)
        for t, ended_rows, final_values in finals:
            next_values[ended_rows, t] = final_values
    return batch | {"next_values": next_values}, obs


def _whiten(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / (std + eps), unbiased std: `masked_whiten` of a batch with no padding, bit for bit, in
    a fifth of its operations (it runs on every mini-batch: ~3% of a CartPole run's CPU)."""
    mean = x.sum() / x.numel()
    centred = x - mean
    return centred / (((centred**2).sum() / (x.numel() - 1)).sqrt() + eps)


def update(
    ppo: ControlPPOConfig,
    policy: ActorCritic,
    stepper: OptimizerStepper,
    batch: dict[str, torch.Tensor],
    targets: tuple[torch.Tensor, torch.Tensor],
    *,
    clip: float,
    seed: int,
    where: str,
) -> dict[str, float]:
    """`ppo.epochs` passes of `ppo.mini_batches` optimizer steps over the flattened batch; `targets` are
    (advantages, returns) as [env, time]; `seed` orders the mini-batches (a function of the run's seed and
    the RL step, so a resumed run shuffles as an unbroken one)."""
    advantages, returns = targets
    size = advantages.numel()
    flat = {k: v.reshape(size, *v.shape[2:]) for k, v in batch.items()}
    adv, ret = advantages.reshape(size), returns.reshape(size)
    loss_fn = POLICY_LOSSES["ppo"]
    clip_high = ppo.clip_high if ppo.clip_high is not None else clip
    sums: dict[str, float] = {}
    count = 0
    for idx in mini_batches(size, epochs=ppo.epochs, splits=ppo.mini_batches, seed=seed):
        ones = torch.ones(len(idx), 1)
        dist, new_values = policy.dist_value(flat["obs"][idx])
        log_probs = dist.log_prob(flat["actions"][idx])
        mb_adv = adv[idx].unsqueeze(1)
        if ppo.normalize_advantages and len(idx) > 1:
            mb_adv = _whiten(mb_adv)
        policy_loss, _loss_metrics = loss_fn(
            log_probs=log_probs.unsqueeze(1),
            old_log_probs=flat["log_probs"][idx].unsqueeze(1),
            advantages=mb_adv,
            response_mask=ones,
            clip_low=clip,
            clip_high=clip_high,
        )
        v_loss, _ = value_loss(
            new_values.unsqueeze(1), flat["values"][idx].unsqueeze(1), ret[idx].unsqueeze(1), ones,
            clip=ppo.clip_value,
        )  # fmt: skip
        entropy = dist.entropy().mean()
        loss = policy_loss + ppo.value_coef * v_loss - ppo.entropy_coef * entropy
        grad_norm = stepper.step([loss], where)
        with torch.no_grad():
            log_ratio = log_probs - flat["log_probs"][idx]
            step_metrics = {
                "loss/policy": float(policy_loss),
                "loss/value": float(v_loss),
                "entropy": float(entropy),
                "approx_kl": float(((log_ratio.exp() - 1) - log_ratio).mean()),  # k3 (Schulman)
                "clip_frac": float(((log_ratio.exp() - 1).abs() > clip).float().mean()),
                "grad_norm": grad_norm,
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
    control: ControlConfig,
    policy: ActorCritic,
    stepper: OptimizerStepper,
    batch: dict[str, torch.Tensor],
    *,
    progress: float,
    seed: int,
    where: str,
) -> dict[str, float]:
    """One PPO update on a collected [env, time] batch: GAE with its episode boundaries, then `update` at
    this step's clip range (`progress`: the share of the run done; with `anneal_clip` the clip range decays
    as `control.schedule` decays the learning rate)."""
    advantages, returns = ADVANTAGE_ESTIMATORS["gae"](
        token_rewards=batch["rewards"],
        response_mask=torch.ones_like(batch["rewards"]),
        values=batch["values"],
        next_values=batch["next_values"],
        dones=batch["dones"],
        terminated=batch["terminated"],
        gamma=control.gamma,
        lam=control.ppo.lam,
    )
    clip = control.ppo.clip * (decay_factor(control.schedule, progress) if control.ppo.anneal_clip else 1.0)
    return update(
        control.ppo, policy, stepper, batch, (advantages, returns), clip=clip, seed=seed, where=where
    )


def _acting_network(control: ControlConfig, observation_space: Any, action_space: Any) -> ActorCritic:
    return make_policy(control, observation_space, action_space)


register_control_algorithm(
    "ppo",
    ControlAlgorithm(
        loop="onpolicy", reads=("ppo",), acting_network=_acting_network, plot=PLOT_METRICS, multi_agent=True
    ),
)
