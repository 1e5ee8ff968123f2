"""Offline RL from a fixed dataset of transitions: the losses of BC, TD3+BC, IQL, AWR and CQL, pure tensor
functions (the pieces issue 33's offline loop calls; SAC's and TD3's own pieces are in `qlearning`).

Shapes follow `qlearning`: one row per transition, Q/V values, log-probs and advantages [B] (a critic's
[B, 1] output squeezed by the caller; mismatched shapes are refused rather than broadcast), actions
[B, |A|]. Hyperparameters are keyword-only plain values. Losses are means over the batch; weights and
targets that must not carry gradient are detached here, so a caller cannot leak a gradient into them.
"""

from __future__ import annotations

import torch

from hone.algorithms.qlearning import _not_terminal, _same_shape


def bc_loss(policy_action: torch.Tensor, data_action: torch.Tensor) -> torch.Tensor:
    """Behaviour cloning of a deterministic policy (Pomerleau 1991; the regression form CORL's BC and
    TD3+BC use): mean over the batch of ||π(s) - a||², summed over action dimensions."""
    _same_shape(policy_action=policy_action, data_action=data_action)
    return ((policy_action - data_action) ** 2).sum(-1).mean()


def td3_bc_actor_loss(
    q: torch.Tensor, policy_action: torch.Tensor, data_action: torch.Tensor, *, alpha: float = 2.5
) -> torch.Tensor:
    """TD3+BC's actor loss (Fujimoto & Gu 2021, "A Minimalist Approach to Offline Reinforcement Learning",
    arXiv:2106.06860, Eq. 3 and §5): -λ·mean Q(s, π(s)) + mean (π(s) - a)², with λ = α / mean|Q(s, π(s))|
    computed without gradient, so the Q term's scale does not depend on the reward's. The authors' code
    averages the squared error over action dimensions too (F.mse_loss); so does this."""
    lam = alpha / q.detach().abs().mean().clamp(min=1e-8)
    return -lam * q.mean() + ((policy_action - data_action) ** 2).mean()


def expectile_loss(diff: torch.Tensor, *, tau: float) -> torch.Tensor:
    """IQL's value loss (Kostrikov et al. 2021, "Offline Reinforcement Learning with Implicit Q-Learning",
    arXiv:2110.06169, Eq. 5): the asymmetric square L₂^τ(u) = |τ - 1(u < 0)|·u² of u = Q(s, a) - V(s),
    averaged. With τ > 0.5, V(s) approaches an upper expectile of Q over the dataset's actions: a maximum
    over in-distribution actions, never querying an action the data lacks. The caller passes
    u = Q_target(s, a).detach() - V(s)."""
    if not 0.0 < tau < 1.0:
        raise ValueError(f"expectile tau must be in (0, 1), got {tau}")
    weight = torch.where(diff < 0, 1.0 - tau, tau)
    return (weight * diff**2).mean()


def iql_q_target(
    reward: torch.Tensor, terminated: torch.Tensor, next_v: torch.Tensor, *, gamma: float
) -> torch.Tensor:
    """IQL's Q target (Kostrikov et al. 2021, Eq. 6): r + γ·(1 - terminated)·V(s'), from the value network
    (not a max over actions), without gradient."""
    _same_shape(reward=reward, terminated=terminated, next_v=next_v)
    with torch.no_grad():
        return reward + gamma * _not_terminal(terminated, next_v) * next_v


def advantage_weights(
    advantage: torch.Tensor, *, inverse_temperature: float, max_weight: float = 100.0
) -> torch.Tensor:
    """Exponentiated-advantage weights exp(β·A), clipped at `max_weight`, without gradient: AWR's
    (Peng et al. 2019, "Advantage-Weighted Regression", arXiv:1910.00177, Eq. 10, there written exp(A/β)
    with temperature β: pass `inverse_temperature` = 1/β; the paper clips at 20) and IQL's policy
    extraction (Kostrikov et al. 2021, Eq. 7; the authors' code uses β = 3 on MuJoCo and clips at 100)."""
    if inverse_temperature < 0:
        raise ValueError(f"inverse_temperature must be >= 0, got {inverse_temperature}")
    with torch.no_grad():
        return torch.exp(inverse_temperature * advantage).clamp(max=max_weight)


def weighted_regression_loss(log_prob: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The policy-extraction loss of AWR and IQL: -mean(w·log π(a|s)) over the dataset's (s, a), with the
    weights of `advantage_weights` (constant: they are detached)."""
    _same_shape(log_prob=log_prob, weights=weights)
    return -(weights.detach() * log_prob).mean()


def cql_penalty(
    q_data: torch.Tensor,
    q_sampled: torch.Tensor,
    log_density: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """CQL(H)'s conservative term (Kumar et al. 2020, "Conservative Q-Learning for Offline Reinforcement
    Learning", arXiv:2006.04779, Eq. 4 with the importance-sampled log-sum-exp of Appendix F):
    mean over the batch of T·logsumexp_j((Q(s, a_j) - log μ(a_j|s)) / T) - Q(s, a_data), which pushes Q
    down on sampled actions (uniform and the policy's, each divided by its sampling density μ) and up on
    the dataset's. `q_sampled` and `log_density` are [B, N] (N sampled actions per state), `q_data` [B].
    The caller adds α_cql × this to the SAC critic loss. Without the log N normalisation the authors'
    code also omits (a constant, no gradient)."""
    _same_shape(q_sampled=q_sampled, log_density=log_density)
    if q_sampled.dim() != 2 or q_sampled.shape[0] != q_data.shape[0] or q_data.dim() != 1:
        raise ValueError(
            f"cql_penalty: q_sampled and log_density are [B, N] and q_data [B]; got {list(q_sampled.shape)} "
            f"and {list(q_data.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"cql temperature must be > 0, got {temperature}")
    pushed_down = temperature * torch.logsumexp((q_sampled - log_density) / temperature, dim=1)
    return (pushed_down - q_data).mean()
