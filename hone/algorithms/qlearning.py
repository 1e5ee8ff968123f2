"""Off-policy actor-critic for continuous control: SAC's and TD3's targets and losses, pure tensor functions.

Shapes: one row per transition of a replay batch. `reward`, `terminated`, Q-values and log-probs are all
[B] (the caller squeezes a critic's [B, 1] output): the target functions reject mismatched shapes, since
a [B, 1] Q-value against a [B] reward would silently broadcast to [B, B]. Actions are [B, |A|].

`terminated` is a true terminal (the MDP ended: no bootstrap). A time-limit truncation is *not* terminal:
its target bootstraps from the next observation's value (Pardo et al. 2018, "Time Limits in RL").

Targets are computed without gradient (the critic regresses onto a fixed y); the losses are means over
the batch. Hyperparameters (alpha, gamma, tau, noise) are keyword-only plain values, so that same-shaped
tensors are the only positional arguments and a temperature is never read as a discount.

These are plain functions, not a registry: SAC and TD3 are each a set of pieces that only go together
(SAC's target needs next log-probs and α, TD3's a smoothed target action), so no configuration picks one
of them alone; the trainer that picks the algorithm calls its pieces.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F

_LOG_2 = math.log(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
        raise ValueError(f"shapes differ (squeeze a critic's [B, 1] output to [B]): {listed}")


def _not_terminal(terminated: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """1 - terminated, as `like`'s dtype (terminated may be bool or 0/1 floats)."""
    return (~terminated.bool()).to(like.dtype)


def _constant(x: float | torch.Tensor) -> float | torch.Tensor:
    """A hyperparameter as a constant: a tensor (α = log_alpha.exp()) is detached."""
    return x.detach() if isinstance(x, torch.Tensor) else x


def sac_critic_target(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    next_log_prob: torch.Tensor,
    *,
    alpha: float | torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """SAC's soft Bellman target (Haarnoja et al. 2018b, "Soft Actor-Critic Algorithms and Applications",
    arXiv:1812.05905 §4.2: the soft value V(s') = E_{a'~π}[Q(s', a') - α log π(a'|s')] inside J_Q's
    target, with the two target critics' minimum of §6):

        y = r + γ (1 - terminated) (min(Q1'(s', a'), Q2'(s', a')) - α log π(a'|s')),   a' ~ π(·|s')

    Q1', Q2' are the target critics at a fresh action a' of the *current* policy, whose log-prob is
    `next_log_prob` (one sample estimates the expectation). The first SAC paper (arXiv:1801.01290)
    regressed onto a separate value network here instead; this is the later form every peer uses.
    Computed without gradient: the result is a constant the critics regress onto.
    """
    _same_shape(
        reward=reward, terminated=terminated, next_q1=next_q1, next_q2=next_q2, next_log_prob=next_log_prob
    )
    with torch.no_grad():
        soft_value = torch.minimum(next_q1, next_q2) - _constant(alpha) * next_log_prob
        return reward + gamma * _not_terminal(terminated, soft_value) * soft_value


def sac_actor_loss(
    q1: torch.Tensor, q2: torch.Tensor, log_prob: torch.Tensor, *, alpha: float | torch.Tensor
) -> torch.Tensor:
    """SAC's policy loss (arXiv:1801.01290 §4.2, reparameterised a = f(ε; s); arXiv:1812.05905 §4.2):

        J_π = mean(α log π(a|s) - min(Q1(s, a), Q2(s, a)))

    `q1`, `q2` are the online critics at the policy's reparameterised action, so the gradient reaches the
    actor through the action and `log_prob` (it also reaches the critics' parameters: step only the
    actor's optimizer on it, as CleanRL and SB3 do). α is a constant here (a tensor α is detached): the
    temperature learns only from `sac_alpha_loss`. The first paper writes one Q; the minimum over both
    is arXiv:1812.05905 §6's and the peers' (SB3, CleanRL).
    """
    _same_shape(q1=q1, q2=q2, log_prob=log_prob)
    return (_constant(alpha) * log_prob - torch.minimum(q1, q2)).mean()


def sac_alpha_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor, *, target_entropy: float) -> torch.Tensor:
    """SAC's automatic temperature (Haarnoja et al. 2018b, arXiv:1812.05905 §5):

        J(α) = E_{a~π}[-α log π(a|s) - α H̄]     here:   -mean(log α · (log π(a|s) + H̄))

    with the policy term detached (no gradient into the actor). `target_entropy` H̄ is conventionally
    -|A| (minus the action dimension: the paper's heuristic, also SB3's and CleanRL's default); the caller
    passes it. Departure, as in the authors' softlearning code and SB3: the loss is linear in log α, not
    α, so α = exp(log α) stays positive without a constraint; the gradient has the same sign (α rises
    while the entropy -log π is below H̄) and the same fixed point. CleanRL multiplies by α instead.
    """
    return -(log_alpha * (log_prob + target_entropy).detach()).mean()


def td3_target(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    *,
    gamma: float,
) -> torch.Tensor:
    """TD3's clipped double-Q target (Fujimoto et al. 2018, arXiv:1802.09477 §4.2 and Algorithm 1):

        y = r + γ (1 - terminated) min(Q1'(s', ã), Q2'(s', ã)),   ã = `smoothed_target_action(μ'(s'))`

    Computed without gradient. It is `sac_critic_target` with α = 0.
    """
    _same_shape(reward=reward, terminated=terminated, next_q1=next_q1, next_q2=next_q2)
    with torch.no_grad():
        next_q = torch.minimum(next_q1, next_q2)
        return reward + gamma * _not_terminal(terminated, next_q) * next_q


def smoothed_target_action(
    action: torch.Tensor,
    *,
    noise_std: float,
    noise_clip: float,
    low: float | torch.Tensor,
    high: float | torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """TD3's target policy smoothing (arXiv:1802.09477 §5.3 and Algorithm 1):

        ã = clip(μ'(s') + clip(ε, -c, c), low, high),   ε ~ N(0, σ²)

    The paper writes ã = μ'(s') + ε; the outer clip to the action bounds is its authors' code (and
    CleanRL's, SB3's), so the target critics never see an action the environment cannot take.

    `action` is the target actor's μ'(s'); σ = `noise_std` and c = `noise_clip` are in action units
    (the paper's 0.2 and 0.5 are for actions in [-1, 1]; Fujimoto's code and CleanRL scale them by the
    action range). `low`, `high` are floats or per-dimension [|A|] bounds. The result is detached (it
    feeds only the target). `generator` makes the noise reproducible; it must be on `action`'s device.
    """
    noise = torch.randn(action.shape, generator=generator, dtype=action.dtype, device=action.device)
    noise = (noise * noise_std).clamp(-noise_clip, noise_clip)
    low_t = torch.as_tensor(low, dtype=action.dtype, device=action.device)
    high_t = torch.as_tensor(high, dtype=action.dtype, device=action.device)
    return torch.clamp(action.detach() + noise, low_t, high_t)


def td3_actor_loss(q1: torch.Tensor) -> torch.Tensor:
    """TD3's deterministic policy gradient loss (arXiv:1802.09477 Algorithm 1; Silver et al. 2014):
    -mean(Q1(s, μ(s))): the first online critic only, at the actor's action. Departure: none; the
    delayed update (every d critic steps) is the trainer's schedule."""
    return -q1.mean()


def q_loss(q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """One critic's regression loss: mean((Q(s, a) - y)²), the target detached.

    Scale: no ½, as `F.mse_loss` in CleanRL (SAC and TD3, summed over the two critics) and Fujimoto's
    TD3 code. The SAC papers' J_Q (½ E[(Q - y)²]) and SB3's SAC use ½ · MSE (SB3's TD3 does not);
    hone's PPO `value_loss` also has ½. Twice this loss is the same update at twice the learning rate
    under SGD, and nearly the same under Adam (scale-invariant up to its ε).
    """
    _same_shape(q=q, target=target)
    return F.mse_loss(q, target.detach())


def tanh_gaussian_log_prob(
    mean: torch.Tensor, log_std: torch.Tensor, pre_tanh_sample: torch.Tensor
) -> torch.Tensor:
    """log π(a|s) of a = tanh(u), u ~ N(mean, exp(log_std)²) per dimension, summed over the last
    (action) dimension: [B, |A|] → [B]. The change of variables (arXiv:1801.01290 Appendix C, eq. 21):

        log π(a|s) = Σ_i [log N(u_i; μ_i, σ_i) - log(1 - tanh²(u_i))]

    with log(1 - tanh²(u)) = 2 (log 2 - u - softplus(-2u)), exact and finite for every u (SB3's
    `TanhBijector`, CleanRL's and TorchRL's form), where the direct form needs an ε once tanh(u) rounds
    to ±1 (|u| ≳ 9 in float32). If the action is then rescaled, a = scale · tanh(u) + bias, the caller
    subtracts Σ log(scale) (CleanRL folds it in; SB3 rescales outside the policy and does not).
    """
    log_normal = -0.5 * ((pre_tanh_sample - mean) / log_std.exp()) ** 2 - log_std - _LOG_SQRT_2PI
    log_det = 2.0 * (_LOG_2 - pre_tanh_sample - F.softplus(-2.0 * pre_tanh_sample))
    return (log_normal - log_det).sum(-1)


def polyak_update(
    target_params: Iterable[torch.Tensor], online_params: Iterable[torch.Tensor], *, tau: float
) -> None:
    """In place, without gradient: θ' ← τ θ + (1 - τ) θ' for each (target, online) pair (Lillicrap et
    al. 2016, DDPG; SAC's and TD3's target networks).

    Computed as `lerp(θ', θ, τ)`, one fused kernel for all tensors (`torch._foreach_lerp_`, what
    `torch.optim`'s Adam uses). Equal to the formula up to rounding, and exact at the ends: τ = 1 copies
    θ (lerp computes θ - (θ - θ')(1 - τ) for τ ≥ 0.5), τ = 0 keeps θ'. Pass parameters, and buffers
    (batch-norm statistics) if the networks have any, in matching order.
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"polyak_update: tau must be in [0, 1], got {tau}")
    targets, onlines = list(target_params), list(online_params)
    if len(targets) != len(onlines):
        raise ValueError(f"polyak_update: {len(targets)} target tensors but {len(onlines)} online ones")
    if not targets:
        return
    with torch.no_grad():
        torch._foreach_lerp_(targets, onlines, tau)
