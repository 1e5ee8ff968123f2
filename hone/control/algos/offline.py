"""The learners of offline RL (`control.algorithm: bc | td3_bc | iql | awr | cql`): networks, optimizers
and one gradient update on a batch of dataset transitions (actions in [-1, 1]), on the losses of
`hone.algorithms.offline`. Each learner also acts (`explore`) for offline-to-online fine-tuning, where the
same update goes on over the dataset and the new transitions.

- BC (Pomerleau 1991): a deterministic policy regressed onto the dataset's actions.
- TD3+BC (Fujimoto & Gu 2021, arXiv:2106.06860): TD3 (its critics, target smoothing, delayed actor and
  targets: `OffPolicyLearner`) with the actor's loss -λ·Q(s, π(s)) + (π(s) - a)².
- IQL (Kostrikov et al. 2021, arXiv:2110.06169, Algorithm 1): V by expectile regression onto the target
  critics' min Q(s, a) (dataset actions only), the twin critics onto r + γ·V(s'), Polyak targets, and the
  policy extracted by advantage-weighted regression, exp(β·(Q - V)) clipped at `max_weight`, with a
  Gaussian policy (`GaussianActor`). The order of one update is the authors' (and CORL's): V, Q, policy.
  Departure: one learning rate for all three (`control.lr`), no cosine decay of the actor's.
- AWR (Peng et al. 2019, arXiv:1910.00177, on a fixed dataset as its §5.3): the same weighted regression
  with A = r + γ·V'(s') - V(s) and V fitted to that one-step target (a Polyak target copy V'). Departure:
  the paper fits V to TD(λ) returns of whole trajectories (λ = 0.95); a one-step target (λ = 0) is what a
  shuffled transition buffer gives, and it also serves offline-to-online unchanged.
- CQL (Kumar et al. 2020, arXiv:2006.04779), the SAC variant CQL(H): SAC (`OffPolicyLearner`) with
  `offline.cql_alpha` × the conservative penalty added to each critic's loss; its sampled actions are
  `offline.cql_samples` uniform ones, π(·|s)'s and π(·|s')'s, each at Q(s, ·) over its density (Appendix F, as
  the authors' and CORL's code). Departures: a fixed `cql_alpha` (no Lagrange tuning), no max-backup.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from hone.algorithms.offline import (
    advantage_weights,
    bc_loss,
    cql_penalty,
    expectile_loss,
    iql_q_target,
    td3_bc_actor_loss,
    weighted_regression_loss,
)
from hone.algorithms.qlearning import polyak_update, q_loss
from hone.config import ControlConfig
from hone.control.algos.registry import ControlAlgorithm, register_control_algorithm
from hone.control.algos.sac_td3 import (
    OffPolicyLearner,
    deterministic,
    frozen_copy,
    gaussian_noise,
    squashed_gaussian,
    stepper,
)
from hone.control.offpolicy import DeterministicActor, GaussianActor, SquashedGaussianActor, TwinQ, plain_mlp

PLOT_METRICS = ("eval/normalized_score", "eval/return", "loss/actor", "loss/q", "loss/v", "val/action_mse")


class TD3BCLearner(OffPolicyLearner):
    def td3_actor_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        action = self.actor(batch["obs"])
        q = self.critic.first(batch["obs"], action)
        return td3_bc_actor_loss(q, action, batch["actions"], alpha=self.control.offline.bc_alpha)


class CQLLearner(OffPolicyLearner):
    def critic_penalty(
        self, batch: dict[str, torch.Tensor], q1: torch.Tensor, q2: torch.Tensor
    ) -> torch.Tensor:
        obs, n, dims = batch["obs"], self.control.offline.cql_samples, self.action_dim
        rows = obs.shape[0]
        assert isinstance(self.actor, SquashedGaussianActor)
        repeated = obs.repeat_interleave(n, 0)  # [B·N, obs]: N sampled actions per state
        with torch.no_grad():  # the sampled actions and their densities are constants of the critics' loss
            policy_action, policy_log_prob = self.actor.sample(repeated)
            next_action, next_log_prob = self.actor.sample(batch["next_obs"].repeat_interleave(n, 0))
        uniform = torch.empty(rows * n, dims).uniform_(-1.0, 1.0)
        log_uniform = torch.full((rows, n), dims * math.log(0.5))  # the density of U[-1, 1]^|A|
        sampled = [self.critic(repeated, a) for a in (uniform, policy_action, next_action)]
        log_density = torch.cat(
            [log_uniform, policy_log_prob.view(rows, n), next_log_prob.view(rows, n)], dim=1
        )
        penalty = q1.new_zeros(())
        for head, q_data in enumerate((q1, q2)):
            q_sampled = torch.cat([pair[head].view(rows, n) for pair in sampled], dim=1)
            penalty = penalty + cql_penalty(q_data, q_sampled, log_density)
        return self.control.offline.cql_alpha * penalty


class BCLearner:
    """Behaviour cloning: a deterministic actor, MSE onto the dataset's actions."""

    def __init__(self, control: ControlConfig, obs_dim: int, action_space: Any) -> None:
        self.control = control
        self.actor = DeterministicActor(obs_dim, action_space, control.hidden_sizes, control.activation)
        self.action_dim = self.actor.action_dim
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=control.lr, foreach=True)
        self.steps = {"actor": stepper(self.actor_opt, control.offpolicy.grad_clip)}
        self.updates = 0

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        self.updates += 1
        loss = bc_loss(self.actor(batch["obs"]), batch["actions"])
        self.steps["actor"].step([loss], f"update {self.updates}")
        return {"loss/actor": loss.item()}

    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return gaussian_noise(self.actor, obs, rng, self.control.offpolicy.exploration_noise)

    def state_dict(self) -> dict[str, Any]:
        return {
            "actor": self.actor.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.updates = int(state["updates"])


class WeightedRegressionLearner:
    """IQL (`control.algorithm: iql`) or AWR (`awr`): a value network, a Gaussian policy extracted by
    exp(β·A)-weighted regression and, for IQL, twin critics with a target copy."""

    def __init__(self, control: ControlConfig, obs_dim: int, action_space: Any, *, iql: bool) -> None:
        self.control, self.gamma, lr = control, control.gamma, control.lr
        self.iql = iql
        hidden, activation = control.hidden_sizes, control.activation
        self.actor = GaussianActor(obs_dim, action_space, hidden, activation)
        self.action_dim = self.actor.action_dim
        self.value = plain_mlp(obs_dim, hidden, activation, 1)
        self.nets: dict[str, torch.nn.Module] = {"actor": self.actor, "value": self.value}
        if self.iql:
            self.critic = TwinQ(obs_dim, self.action_dim, hidden, activation)
            self.nets |= {"critic": self.critic, "critic_target": frozen_copy(self.critic)}
        else:
            self.nets["value_target"] = frozen_copy(self.value)
        self.opts = {
            f"{name}_opt": torch.optim.Adam(self.nets[name].parameters(), lr=lr, foreach=True)
            for name in ("actor", "value", "critic")
            if name in self.nets
        }
        self.steps = {name: stepper(opt, control.offpolicy.grad_clip) for name, opt in self.opts.items()}
        self.updates = 0

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        self.updates += 1
        obs, actions = batch["obs"], batch["actions"]
        metrics: dict[str, float] = {}
        if self.iql:
            with torch.no_grad():
                q_target = torch.minimum(*self.nets["critic_target"](obs, actions))
                next_v = self.value(batch["next_obs"]).squeeze(-1)
            v = self.value(obs).squeeze(-1)
            advantage = q_target - v.detach()
            value_loss = expectile_loss(q_target - v, tau=self.control.offline.expectile)
        else:
            with torch.no_grad():
                next_v = self.nets["value_target"](batch["next_obs"]).squeeze(-1)
                target = iql_q_target(batch["rewards"], batch["terminated"], next_v, gamma=self.gamma)
            v = self.value(obs).squeeze(-1)
            advantage = target - v.detach()
            value_loss = q_loss(v, target)
        self._step("value_opt", value_loss)
        metrics |= {"loss/v": value_loss.item(), "v/mean": v.mean().item()}
        if self.iql:
            target = iql_q_target(batch["rewards"], batch["terminated"], next_v, gamma=self.gamma)
            q1, q2 = self.critic(obs, actions)
            critic_loss = q_loss(q1, target) + q_loss(q2, target)
            self._step("critic_opt", critic_loss)
            metrics |= {"loss/q": critic_loss.item(), "q/mean": (q1 + q2).mean().item() / 2}
            tau = self.control.offpolicy.tau
            polyak_update(self.nets["critic_target"].parameters(), self.critic.parameters(), tau=tau)
        else:
            tau = self.control.offpolicy.tau
            polyak_update(self.nets["value_target"].parameters(), self.value.parameters(), tau=tau)
        weights = advantage_weights(
            advantage,
            inverse_temperature=self.control.offline.inverse_temperature,
            max_weight=self.control.offline.max_weight,
        )
        actor_loss = weighted_regression_loss(self.actor.log_prob(obs, actions), weights)
        self._step("actor_opt", actor_loss)
        return metrics | {
            "loss/actor": actor_loss.item(),
            "adv_weight/mean": weights.mean().item(),
            "adv_weight/clipped": (weights >= self.control.offline.max_weight).float().mean().item(),
        }

    def _step(self, name: str, loss: torch.Tensor) -> None:
        self.steps[name].step([loss], f"update {self.updates}")

    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Online: actions sampled from the Gaussian policy (IQL's fine-tuning, as the paper's §5.3)."""
        with torch.no_grad():
            return self.actor.sample(torch.as_tensor(obs, dtype=torch.float32)).numpy()

    def state_dict(self) -> dict[str, Any]:
        parts = {name: part.state_dict() for name, part in (self.nets | self.opts).items()}
        return parts | {"updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, part in (self.nets | self.opts).items():
            part.load_state_dict(state[name])
        self.updates = int(state["updates"])


OfflineLearner = BCLearner | WeightedRegressionLearner | OffPolicyLearner


def gaussian(control: ControlConfig, observation_space: Any, action_space: Any) -> GaussianActor:
    obs_dim = int(observation_space.shape[0])
    return GaussianActor(obs_dim, action_space, control.hidden_sizes, control.activation)


_LEARNERS: dict[str, tuple[Any, Any]] = {  # name -> (its learner, the network `hone eval` plays)
    "bc": (BCLearner, deterministic),
    "td3_bc": (lambda c, o, a: TD3BCLearner(c, o, a, sac=False), deterministic),
    "iql": (lambda c, o, a: WeightedRegressionLearner(c, o, a, iql=True), gaussian),
    "awr": (lambda c, o, a: WeightedRegressionLearner(c, o, a, iql=False), gaussian),
    "cql": (lambda c, o, a: CQLLearner(c, o, a, sac=True), squashed_gaussian),
}
for _name, (_learner, _net) in _LEARNERS.items():
    register_control_algorithm(
        _name,
        ControlAlgorithm(
            loop="offline", reads=("offpolicy", "offline"), acting_network=_net, plot=PLOT_METRICS,
            learner=_learner, box_actions=True,
        ),
    )  # fmt: skip
