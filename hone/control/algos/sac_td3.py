"""SAC and TD3 on a gymnasium environment with a Box action space (`control.algorithm: sac | td3`), on the
algorithm core's `hone.algorithms.qlearning` (targets, losses, Polyak averaging, the tanh-Gaussian
log-prob) and the networks of `hone.control.offpolicy`.

SAC: Haarnoja et al. 2018a, "Soft Actor-Critic" (arXiv:1801.01290), in the form of Haarnoja et al. 2018b,
"Soft Actor-Critic Algorithms and Applications" (arXiv:1812.05905): twin Q critics with target copies and
no separate V network (§6), a tanh-squashed Gaussian actor, the temperature α learned towards an entropy
target of −|A| (§5). TD3: Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic
Methods" (arXiv:1802.09477): clipped double-Q, target policy smoothing, the actor and the target networks
updated every `policy_delay` critic updates, Gaussian exploration noise.

The schedule is SB3's (and CleanRL's): `learning_starts` environment steps of uniformly random actions,
then after every `train_freq` vector-environment steps `gradient_steps` updates, each on `batch_size`
transitions drawn uniformly from the replay buffer (`hone.control.replay`). A SAC update: the critics' step
(the target at the current α), the targets' Polyak step, then every `policy_delay`-th update (1: every one,
SB3; CleanRL's policy_frequency 2) `policy_delay` pairs of α's step and the actor's step, the actor's loss
at α before its step (SB3's order: α and the critics' target both use the value from before this update's
α step). TD3: the critics' step every update, the actor's and the targets' every `policy_delay`-th.

Departures, each shared with a peer: one learning rate (`control.lr`) for the actor, the critics and α
unless `control.offpolicy.q_lr` sets the critics' and α's (CleanRL), and no gradient clipping unless
`control.offpolicy.grad_clip` sets it, as SB3; the critics' loss is the sum of the two
MSEs without SAC's ½ (CleanRL; see `q_loss`); noise scales are in [-1, 1] action units (SB3; CleanRL
scales by the action range to the same effect). The paper's SAC takes one gradient step per environment
step after 1000 (v1) or 10000 random steps; `learning_starts` and `train_freq` / `gradient_steps` set that.

Logging: one RL step (one row of metrics.jsonl) is `control.rollout_steps` steps of every environment, so
RL steps = env_steps / (num_envs × rollout_steps); the losses, α and Q are means over that step's updates.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from hone.algorithms.qlearning import (
    polyak_update,
    q_loss,
    sac_actor_loss,
    sac_alpha_loss,
    sac_critic_target,
    smoothed_target_action,
    td3_actor_loss,
    td3_target,
)
from hone.config import ControlConfig
from hone.control.algos.registry import ControlAlgorithm, register_control_algorithm
from hone.control.envs import ControlEnvError
from hone.control.offpolicy import DeterministicActor, SquashedGaussianActor, TwinQ
from hone.training.optim import OptimizerStepper

PLOT_METRICS = ("episode/return", "eval/return", "loss/q", "loss/actor", "alpha", "q/mean")
MAX_NONFINITE_STEPS = 3  # updates in a row with a non-finite gradient (of one network) before the run stops


def stepper(optimizer: torch.optim.Optimizer, grad_clip: float | None) -> OptimizerStepper:
    """The shared optimizer step (clip, skip a non-finite step) over `optimizer`'s parameters."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return OptimizerStepper(
        optimizer,
        params,
        grad_clip=grad_clip,
        max_nonfinite_steps=MAX_NONFINITE_STEPS,
        limit_key=f"{MAX_NONFINITE_STEPS} in a row",
        advice="lower control.lr / control.offpolicy.q_lr, or set control.offpolicy.grad_clip",
    )


def check_action_space(control: ControlConfig, space: Any) -> None:
    """SAC's squashing and TD3's tanh need a Box with finite bounds: one line before anything runs."""
    if hasattr(space, "n") or not hasattr(space, "low"):
        raise ControlEnvError(
            f"control.algorithm {control.algorithm} needs a Box action space; {control.env} has {space}: "
            "use ppo"
        )
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ControlEnvError(
            f"control.algorithm {control.algorithm} needs finite action bounds; {control.env} has {space}"
        )


class OffPolicyLearner:
    """The networks, optimizers and one gradient update of SAC (`sac=True`) or TD3 (actions in [-1, 1]).
    Subclasses change the critics' loss (`critic_penalty`: CQL) or TD3's actor loss (TD3+BC)."""

    def __init__(self, control: ControlConfig, obs_dim: int, action_space: Any, *, sac: bool) -> None:
        self.control, self.offpolicy, self.gamma, lr = control, control.offpolicy, control.gamma, control.lr
        offpolicy = control.offpolicy
        q_lr = offpolicy.q_lr if offpolicy.q_lr is not None else lr
        self.sac = sac
        hidden, activation = control.hidden_sizes, control.activation
        self.actor: SquashedGaussianActor | DeterministicActor
        if self.sac:
            self.actor = SquashedGaussianActor(obs_dim, action_space, hidden, activation)
        else:
            self.actor = DeterministicActor(obs_dim, action_space, hidden, activation)
        self.action_dim = self.actor.action_dim
        self.critic = TwinQ(obs_dim, self.action_dim, hidden, activation)
        self.critic_target = frozen_copy(self.critic)
        self.actor_target = None if self.sac else frozen_copy(self.actor)
        # foreach: one fused kernel per Adam step, where torch's CPU default loops over the tensors
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=lr, foreach=True)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=q_lr, foreach=True)
        self.log_alpha = torch.tensor(
            math.log(offpolicy.init_alpha), requires_grad=self.sac and offpolicy.autotune
        )
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=q_lr) if self.log_alpha.requires_grad else None
        self.steps = {
            name: stepper(opt, offpolicy.grad_clip)
            for name, opt in (
                ("actor", self.actor_opt),
                ("critic", self.critic_opt),
                ("alpha", self.alpha_opt),
            )
            if opt is not None
        }
        self.policy_delay = offpolicy.policy_delay or (1 if self.sac else 2)
        target = offpolicy.target_entropy
        self.target_entropy = float(-self.action_dim if target is None else target)
        self.updates = 0

    def state_dict(self) -> dict[str, Any]:
        """Every network, target copy and optimizer, log α and the update count (a checkpoint's
        `learner.pt`)."""
        state = {name: part.state_dict() for name, part in self._parts().items()}
        return state | {"log_alpha": self.log_alpha.detach().clone(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, part in self._parts().items():
            part.load_state_dict(state[name])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.updates = int(state["updates"])

    def _parts(self) -> dict[str, Any]:
        parts: dict[str, Any] = {
            "actor": self.actor,
            "critic": self.critic,
            "critic_target": self.critic_target,
        }
        if self.actor_target is not None:
            parts["actor_target"] = self.actor_target
        parts |= {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt}
        if self.alpha_opt is not None:
            parts["alpha_opt"] = self.alpha_opt
        return parts

    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Actions in [-1, 1] for a [num_envs, obs_dim] batch: SAC samples its policy; TD3 adds
        N(0, exploration_noise²) to μ(s) and clips (Fujimoto et al. 2018 Algorithm 1)."""
        if isinstance(self.actor, SquashedGaussianActor):
            with torch.no_grad():
                return self.actor.sample(torch.as_tensor(obs, dtype=torch.float32))[0].numpy()
        return gaussian_noise(self.actor, obs, rng, self.offpolicy.exploration_noise)

    def critic_targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """y for each transition: r + γ (1 - terminated) (the target critics' min at the next action, minus
        α log π for SAC); a terminated transition's y is its reward."""
        next_obs = batch["next_obs"]
        with torch.no_grad():
            if isinstance(self.actor, SquashedGaussianActor):
                next_action, next_log_prob = self.actor.sample(next_obs)
                q1, q2 = self.critic_target(next_obs, next_action)
                return sac_critic_target(
                    batch["rewards"], batch["terminated"], q1, q2, next_log_prob,
                    alpha=self.log_alpha.exp(), gamma=self.gamma,
                )  # fmt: skip
            assert self.actor_target is not None
            next_action = smoothed_target_action(
                self.actor_target(next_obs),
                noise_std=self.offpolicy.target_noise,
                noise_clip=self.offpolicy.target_noise_clip,
                low=-1.0,
                high=1.0,
            )
            q1, q2 = self.critic_target(next_obs, next_action)
            return td3_target(batch["rewards"], batch["terminated"], q1, q2, gamma=self.gamma)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        self.updates += 1
        return self._sac_update(batch) if self.sac else self._td3_update(batch)

    def _critic_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        target = self.critic_targets(batch)
        q1, q2 = self.critic(batch["obs"], batch["actions"])
        loss = q_loss(q1, target) + q_loss(q2, target)
        metrics = {"loss/q": loss.item(), "q/mean": (q1 + q2).mean().item() / 2}
        penalty = self.critic_penalty(batch, q1, q2)
        if penalty is not None:
            loss = loss + penalty
            metrics["loss/cql"] = penalty.item()
        self.steps["critic"].step([loss], f"update {self.updates}")
        return metrics

    def critic_penalty(
        self, batch: dict[str, torch.Tensor], q1: torch.Tensor, q2: torch.Tensor
    ) -> torch.Tensor | None:
        """A term added to the critics' loss (CQL's conservative penalty); none for SAC and TD3."""
        return None

    def td3_actor_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """TD3's actor loss, -mean Q1(s, μ(s)) (TD3+BC adds its behaviour-cloning term)."""
        return td3_actor_loss(self.critic.first(batch["obs"], self.actor(batch["obs"])))

    def _sac_update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        assert isinstance(self.actor, SquashedGaussianActor)
        metrics = {"alpha": float(self.log_alpha.detach().exp())}  # the α this update's target uses
        metrics |= self._critic_step(batch)
        polyak_update(self.critic_target.parameters(), self.critic.parameters(), tau=self.offpolicy.tau)
        if self.updates % self.policy_delay:
            return metrics
        for _ in range(self.policy_delay):  # d > 1: as many actor steps as were skipped (CleanRL)
            action, log_prob = self.actor.sample(batch["obs"])
            alpha = self.log_alpha.detach().exp()  # the actor's α: the value before α's step (SB3)
            if "alpha" in self.steps:
                alpha_loss = sac_alpha_loss(self.log_alpha, log_prob, target_entropy=self.target_entropy)
                self.steps["alpha"].step([alpha_loss], f"update {self.updates}")
                metrics["loss/alpha"] = alpha_loss.item()
            with _no_param_grads(self.critic):
                q1, q2 = self.critic(batch["obs"], action)
                actor_loss = sac_actor_loss(q1, q2, log_prob, alpha=alpha)
                self.steps["actor"].step([actor_loss], f"update {self.updates}")
        return metrics | {"loss/actor": actor_loss.item(), "entropy": -float(log_prob.detach().mean())}

    def _td3_update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        assert self.actor_target is not None
        metrics = self._critic_step(batch)
        if self.updates % self.policy_delay == 0:
            with _no_param_grads(self.critic):
                actor_loss = self.td3_actor_loss(batch)
                self.steps["actor"].step([actor_loss], f"update {self.updates}")
            tau = self.offpolicy.tau
            polyak_update(self.critic_target.parameters(), self.critic.parameters(), tau=tau)
            polyak_update(self.actor_target.parameters(), self.actor.parameters(), tau=tau)
            metrics["loss/actor"] = actor_loss.item()
        return metrics


def gaussian_noise(
    actor: torch.nn.Module, obs: np.ndarray, rng: np.random.Generator, std: float
) -> np.ndarray:
    """A deterministic actor's action plus N(0, std²), clipped to [-1, 1] (TD3's exploration; BC's and
    TD3+BC's online)."""
    with torch.no_grad():
        mu = actor(torch.as_tensor(obs, dtype=torch.float32)).numpy()
    return np.clip(mu + rng.normal(0.0, std, size=mu.shape), -1.0, 1.0).astype(np.float32)


@contextmanager
def _no_param_grads(net: torch.nn.Module) -> Iterator[None]:
    """The actor's loss differentiates through the critics to the action only: their weights' gradients
    (which SB3 and CleanRL compute and then discard) are skipped. The same update, less CPU."""
    net.requires_grad_(False)
    try:
        yield
    finally:
        net.requires_grad_(True)


def frozen_copy(net: torch.nn.Module) -> Any:
    target = copy.deepcopy(net)
    target.requires_grad_(False)
    return target


def _sac(control: ControlConfig, obs_dim: int, action_space: Any) -> OffPolicyLearner:
    return OffPolicyLearner(control, obs_dim, action_space, sac=True)


def _td3(control: ControlConfig, obs_dim: int, action_space: Any) -> OffPolicyLearner:
    return OffPolicyLearner(control, obs_dim, action_space, sac=False)


def squashed_gaussian(
    control: ControlConfig, observation_space: Any, action_space: Any
) -> SquashedGaussianActor:
    obs_dim = int(observation_space.shape[0])
    return SquashedGaussianActor(obs_dim, action_space, control.hidden_sizes, control.activation)


def deterministic(control: ControlConfig, observation_space: Any, action_space: Any) -> DeterministicActor:
    obs_dim = int(observation_space.shape[0])
    return DeterministicActor(obs_dim, action_space, control.hidden_sizes, control.activation)


for _name, _learner, _net in (("sac", _sac, squashed_gaussian), ("td3", _td3, deterministic)):
    register_control_algorithm(
        _name,
        ControlAlgorithm(
            loop="offpolicy", reads=("offpolicy",), acting_network=_net, plot=PLOT_METRICS, learner=_learner,
            box_actions=True,
        ),
    )  # fmt: skip
