"""The Tinker SDK's built-in losses, per datum, on the log-probs of its `target_tokens`.

Each datum's loss is a sum over its tokens (no mean: Tinker's losses are sums, and so is the `loss:sum`
metric), and a batch's loss is the sum over its datums. A loss function gets the datum's target log-probs
`logprobs` [T] (differentiable) and its `loss_fn_inputs` as tensors, and returns its per-token loss [T]; the
datum's loss is that tensor's sum.

- `cross_entropy`: `-weights * logprobs` (weights default to 1). Supervised learning.
- `importance_sampling`: `-exp(logprobs - sampling_logprobs) * advantages`, the REINFORCE estimator with an
  importance weight for samples drawn from another policy (the sampler's `logprobs` input).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from hone.tinker.wire import WireError

LossFn = Callable[[torch.Tensor, Mapping[str, torch.Tensor], Mapping[str, float | str]], torch.Tensor]

# Built into the SDK (`tinker.types.LossFnType`) but not served yet, each with why.
NOT_SERVED = {
    "custom": "`custom` losses run as a traced graph on Tinker's servers; use forward_backward_custom, which "
    "computes a custom loss on the client over `cross_entropy`",
}


def _input(inputs: Mapping[str, torch.Tensor], name: str, loss: str) -> torch.Tensor:
    if name not in inputs:
        raise WireError(f"loss_fn {loss} needs loss_fn_inputs[{name!r}]; got {sorted(inputs)}")
    return inputs[name]


def cross_entropy(
    logprobs: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float | str]
) -> torch.Tensor:
    weights = inputs.get("weights")
    return -logprobs if weights is None else -weights * logprobs


def importance_sampling(
    logprobs: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float | str]
) -> torch.Tensor:
    sampling = _input(inputs, "logprobs", "importance_sampling")
    advantages = _input(inputs, "advantages", "importance_sampling")
    return -torch.exp(logprobs - sampling) * advantages


LOSSES: dict[str, LossFn] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
}


def get_loss(name: str) -> LossFn:
    """The loss `name`, or a one-line refusal that says which are served."""
    if name in LOSSES:
        return LOSSES[name]
    why = NOT_SERVED.get(name, "not one of the SDK's built-in losses")
    raise WireError(
        f"loss_fn {name!r} is not served by hone serve tinker ({why}); served: {', '.join(LOSSES)}"
    )
