"""Off-policy evaluation of a control policy on a dataset, without the environment (`hone eval --ope`):
fitted-Q evaluation (FQE; Le, Voloshin & Yue 2019, "Batch Policy Learning under Constraints",
arXiv:1903.08738, Algorithm 3; used for offline model selection by Paine et al. 2020, arXiv:2007.09055).

Q^π is fitted on the dataset's transitions by regression onto y = r + γ·(1 - terminated)·Q'(s', π(s')),
π the evaluated policy's deterministic action (what `hone eval` plays) and Q' a Polyak-averaged target
copy (the paper refits Q from scratch for K iterations; a slowly moving target is the same fixed point,
as Paine et al.'s and SCOPE-RL's FQE do). The estimate of the policy's discounted return J_γ(π) is the
mean of Q(s₀, π(s₀)) over the dataset's episode starts (its held-out episodes', when there are).

A time-limit truncation is bootstrapped (the transition is not terminal), so FQE estimates the
infinite-horizon value; `discounted_return` plays the policy for the true one over the environment's
time limit, so the two differ by at most γ^T·|Q| (Pendulum: γ^200 = 0.13 of it). Compare policies by
rank, as the benchmark does."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hone.algorithms.qlearning import polyak_update, q_loss
from hone.config import ControlConfig, HoneConfig
from hone.control.datasets import Transitions, load_offline
from hone.control.envs import make_eval_env
from hone.control.evaluate import EVAL_SEED, as_tensor, unit_action
from hone.control.normalize import Normalizer
from hone.control.offpolicy import plain_mlp
from hone.control.policy_io import load_policy


def fqe(
    policy: Any,
    data: Transitions,
    start_obs: np.ndarray,
    *,
    gamma: float,
    updates: int = 20_000,
    batch_size: int = 256,
    hidden: tuple[int, ...] = (256, 256),
    lr: float = 3e-4,
    tau: float = 0.005,
    seed: int = 0,
) -> float:
    """The FQE estimate of `policy`'s discounted return from `start_obs`; `data`'s observations as the
    policy sees them (normalised), its actions in [-1, 1]."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    obs_dim, action_dim = data.obs.shape[1], data.actions.shape[1]
    q = plain_mlp(obs_dim + action_dim, list(hidden), "relu", 1)
    target = copy.deepcopy(q).requires_grad_(False)
    optimizer = torch.optim.Adam(q.parameters(), lr=lr)
    tensors = {
        name: torch.as_tensor(getattr(data, name)) for name in ("obs", "actions", "rewards", "next_obs")
    }
    not_terminal = 1.0 - torch.as_tensor(data.terminated)
    with torch.no_grad():  # π(s') of every transition once: the policy is fixed
        next_action = unit_action(policy, tensors["next_obs"])
    for _ in range(updates):
        idx = torch.as_tensor(rng.integers(0, len(data), batch_size))
        with torch.no_grad():
            next_q = target(torch.cat([tensors["next_obs"][idx], next_action[idx]], -1)).squeeze(-1)
            y = tensors["rewards"][idx] + gamma * not_terminal[idx] * next_q
        predicted = q(torch.cat([tensors["obs"][idx], tensors["actions"][idx]], -1)).squeeze(-1)
        loss = q_loss(predicted, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        polyak_update(target.parameters(), q.parameters(), tau=tau)
    with torch.no_grad():
        start = torch.as_tensor(start_obs, dtype=torch.float32)
        return float(q(torch.cat([start, unit_action(policy, start)], -1)).mean())


def discounted_return(
    policy: Any, control: ControlConfig, normalizer: Normalizer, *, gamma: float, episodes: int
) -> float:
    """The true J_γ of the deterministic policy: the mean over `episodes` played episodes (the eval seeds)
    of Σ_t γ^t r_t, to compare FQE's estimate with."""
    env = make_eval_env(control)
    low, high = env.action_space.low, env.action_space.high
    totals = []
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=EVAL_SEED + i)
            total, discount, done = 0.0, 1.0, False
            while not done:
                seen = normalizer.observations(obs[None], update=False)
                with torch.no_grad():
                    action = policy.act(as_tensor(seen), deterministic=True)[0].numpy()
                obs, reward, terminated, truncated, _ = env.step(np.clip(action, low, high))
                total, discount = total + discount * float(reward), discount * gamma
                done = bool(terminated or truncated)
            totals.append(total)
    finally:
        env.close()
    return float(np.mean(totals))


def evaluate_offline(cfg: HoneConfig) -> dict[str, float]:
    """`hone eval --run RUN --ope [data.source=minari:<id>]`: FQE of RUN's policy on the dataset (by
    default the one it was trained on)."""
    control = cfg.control
    assert control is not None
    from hone.control.datasets import dataset_id

    source = cfg.data.source or ""
    dataset_id(source)  # one line when data.source is not minari:<id>
    torch.set_num_threads(cfg.run.threads or 1)  # small MLPs: one thread is fastest (as training)
    policy, normalizer, (observation_space, action_space) = load_policy(control, Path(cfg.model.path))
    data = load_offline(
        source,
        root=control.offline.dataset_root,
        observation_space=observation_space,
        action_space=action_space,
    )
    train = data.train
    seen = Transitions(
        normalizer.observations(train.obs, update=False), train.actions, train.rewards,
        normalizer.observations(train.next_obs, update=False), train.terminated, train.episodes,
    )  # fmt: skip
    start = normalizer.observations(data.initial_obs, update=False)
    estimate = fqe(
        policy, seen, start, gamma=control.gamma, updates=control.offline.fqe_updates, seed=cfg.run.seed,
        hidden=tuple(control.hidden_sizes), batch_size=control.offpolicy.batch_size,
    )  # fmt: skip
    return {"ope/fqe_return": estimate, "ope/transitions": float(len(seen))}
