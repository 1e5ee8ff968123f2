"""The Tinker SDK's built-in losses, per datum, on the log-probs of its `target_tokens`.

Each datum's loss is a sum over its tokens (no mean: Tinker's losses are sums, and so is the `loss:sum`
metric), and a batch's loss is the sum over its datums. A loss gets the datum's target log-probs
`logprobs` [T] (differentiable), its `loss_fn_inputs` as float tensors [T] and the request's
`loss_fn_config`, and returns its per-token loss [T]; the datum's loss is that tensor's sum. With
r = exp(logprobs - q), q the sampler's log-probs (`loss_fn_inputs["logprobs"]`) and A the `advantages`:

- `cross_entropy`: -w · log p (`weights` w, default 1). Supervised learning.
- `importance_sampling`: -r · A, REINFORCE with an importance weight for samples drawn from another policy.
- `ppo` (Schulman et al. 2017, arXiv:1707.06347): -min(r · A, clip(r, lo, hi) · A).
- `cispo` (MiniMax-M1, arXiv:2506.13585; ScaleRL, arXiv:2510.13786): -sg(clip(r, lo, hi)) · A · log p.
- `dro` (Richemond et al. 2024, arXiv:2405.19107; Kimi k1.5, arXiv:2501.12599):
  -(log p · A - β/2 · (log p - q)²).
- `gspo` (Zheng et al. 2025, arXiv:2507.18071), GSPO-token: PPO's clipped surrogate on
  s_t = sg[s] · p / sg[p], s = exp(mean of (log p - q) over the tokens `sequence_ratio_mask` marks).

`lo`/`hi` are bounds on the ratio itself (Tinker's `clip_low_threshold`/`clip_high_threshold`, in
`loss_fn_config`, or per token in `loss_fn_inputs`, which wins). The clipped-surrogate, CISPO and
GSPO-token arithmetic is Hone's own (`hone.algorithms.losses`), applied to one datum with Tinker's sum.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from hone.algorithms.losses import cispo_per_token, clipped_surrogate, sequence_token_log_ratio
from hone.tinker.wire import WireError

Inputs = Mapping[str, torch.Tensor]
Config = Mapping[str, float | str]
LossFn = Callable[[torch.Tensor, Inputs, Config], torch.Tensor]

# Tinker's defaults for the ratio bounds (tinker-cookbook tutorials/202_loss_functions.py: PPO 0.8 and 1.2,
# CISPO one-sided 0 and 4). GSPO's are the paper's εl = 3e-4, εh = 4e-4: Tinker does not publish its own.
PPO_BOUNDS = (0.8, 1.2)
CISPO_BOUNDS = (0.0, 4.0)
GSPO_BOUNDS = (1.0 - 3e-4, 1.0 + 4e-4)
CLIP_KEYS = frozenset({"clip_low_threshold", "clip_high_threshold"})

# Built into the SDK (`tinker.types.LossFnType`) but not served, each with why.
NOT_SERVED = {
    "custom": "`custom` losses run as a traced graph on Tinker's servers; use forward_backward_custom, which "
    "computes a custom loss on the client over `cross_entropy`",
    "stable_reinforce": "its objective (alpha) is not published and reads stability information Tinker's "
    "sampler records (record_stability_info), which this server does not record",
}


def _input(inputs: Inputs, name: str, loss: str) -> torch.Tensor:
    if name not in inputs:
        raise WireError(f"loss_fn {loss} needs loss_fn_inputs[{name!r}]; got {sorted(inputs)}")
    return inputs[name]


def _number(config: Config, name: str, default: float | None, loss: str) -> float:
    value = config.get(name, default)
    if value is None:
        raise WireError(f"loss_fn {loss} needs loss_fn_config[{name!r}] (a number)")
    if isinstance(value, str):
        raise WireError(f"loss_fn {loss}: loss_fn_config[{name!r}] must be a number, got {value!r}")
    return float(value)


def _bounds(
    inputs: Inputs, config: Config, like: torch.Tensor, defaults: tuple[float, float], loss: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) per token: a `loss_fn_inputs` tensor where given, else `loss_fn_config`, else the default.
    Always tensors: `clamp` takes two numbers or two tensors, not one of each."""
    out = []
    for name, default in zip(("clip_low_threshold", "clip_high_threshold"), defaults, strict=True):
        if name in inputs:
            out.append(inputs[name].to(like.dtype))
        else:
            out.append(torch.full_like(like, _number(config, name, default, loss)))
    lo, hi = out
    if bool((lo > hi).any()):
        raise WireError(f"loss_fn {loss}: clip_low_threshold is above clip_high_threshold")
    return lo, hi


def _ratio(logprobs: torch.Tensor, inputs: Inputs, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(r = exp(log p - q), A)."""
    sampling = _input(inputs, "logprobs", loss)
    return torch.exp(logprobs - sampling), _input(inputs, "advantages", loss)


def cross_entropy(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """-w · log p, `weights` w (default 1)."""
    weights = inputs.get("weights")
    return -logprobs if weights is None else -weights * logprobs


def importance_sampling(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """-r · A: REINFORCE, importance-weighted for samples from another policy."""
    ratio, advantages = _ratio(logprobs, inputs, "importance_sampling")
    return -ratio * advantages


def ppo(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """-min(r · A, clip(r, lo, hi) · A), per token (Schulman et al. 2017). Bounds default to 0.8 and 1.2."""
    ratio, advantages = _ratio(logprobs, inputs, "ppo")
    lo, hi = _bounds(inputs, config, ratio, PPO_BOUNDS, "ppo")
    per_token, _ = clipped_surrogate(ratio, advantages, lo, hi)
    return per_token


def cispo(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """-sg(clip(r, lo, hi)) · A · log p (MiniMax-M1; ScaleRL): the clipped ratio weighs the log-prob, so
    every token keeps a gradient. Bounds default to 0 and 4 (one-sided, as Tinker's)."""
    ratio, advantages = _ratio(logprobs, inputs, "cispo")
    lo, hi = _bounds(inputs, config, ratio, CISPO_BOUNDS, "cispo")
    return cispo_per_token(logprobs, ratio, advantages, lo, hi)


def dro(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """-(log p · A - β/2 · (log p - q)²) (Richemond et al. 2024; Kimi k1.5): a quadratic penalty keeps the
    policy near the sampler. β (`loss_fn_config["beta"]`) is required: Tinker's default is not published."""
    beta = _number(config, "beta", None, "dro")  # first: a missing beta is the request's fault, not a datum's
    sampling = _input(inputs, "logprobs", "dro")
    advantages = _input(inputs, "advantages", "dro")
    return -(logprobs * advantages - 0.5 * beta * (logprobs - sampling) ** 2)


def gspo(logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """GSPO-token (Zheng et al. 2025): PPO's clipped surrogate on s_t = sg[s] · p / sg[p], where
    s = exp(mean over the `sequence_ratio_mask` tokens of log p - q) is the datum's sequence ratio.
    `sequence_ratio_mask` is required (which tokens were sampled is the program's to say); the bounds
    default to the paper's 1 - 3e-4 and 1 + 4e-4."""
    sampling = _input(inputs, "logprobs", "gspo")
    advantages = _input(inputs, "advantages", "gspo")
    in_ratio = _input(inputs, "sequence_ratio_mask", "gspo") != 0
    if not bool(in_ratio.any()):
        raise WireError("loss_fn gspo: sequence_ratio_mask marks no token of the datum")
    seq_log_ratio = (logprobs - sampling)[in_ratio].mean()
    ratio = torch.exp(sequence_token_log_ratio(logprobs, seq_log_ratio))
    lo, hi = _bounds(inputs, config, ratio, GSPO_BOUNDS, "gspo")
    per_token, _ = clipped_surrogate(ratio, advantages, lo, hi)
    return per_token


# Each served loss, with the `loss_fn_config` keys it reads (any other key is refused, not ignored).
LOSSES: dict[str, tuple[LossFn, frozenset[str]]] = {
    "cross_entropy": (cross_entropy, frozenset()),
    "importance_sampling": (importance_sampling, frozenset()),
    "ppo": (ppo, CLIP_KEYS),
    "cispo": (cispo, CLIP_KEYS),
    "dro": (dro, frozenset({"beta"})),
    "gspo": (gspo, CLIP_KEYS),
}


def get_loss(name: str, config: Config) -> Callable[[torch.Tensor, Inputs], torch.Tensor]:
    """The loss `name` with its `loss_fn_config`, or a one-line refusal (a loss not served, with why and
    which are; a config key the loss does not read)."""
    if name not in LOSSES:
        why = NOT_SERVED.get(name, "not one of the SDK's built-in losses")
        raise WireError(
            f"loss_fn {name!r} is not served by hone serve tinker ({why}); served: {', '.join(LOSSES)}"
        )
    fn, keys = LOSSES[name]
    unknown = sorted(set(config) - keys)
    if unknown:
        raise WireError(
            f"loss_fn {name}: loss_fn_config keys {unknown} are not read by it "
            f"(it reads: {sorted(keys) or 'none'})"
        )
    return lambda logprobs, inputs: fn(logprobs, inputs, config)
